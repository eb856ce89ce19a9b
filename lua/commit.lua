-- commit: fenced write of one value under a target.
--
-- KEYS[1] lease      the lease record
-- KEYS[2] commit     the commit record (hash: token, value, committed_ms; no expiry)
-- KEYS[3] request    request cache for (commit, target, "", request id)
-- ARGV[1] token      the writer's fencing token
-- ARGV[2] key        the value's name
-- ARGV[3] value      the value
-- ARGV[4] window     idempotency window ms
--
-- A successful replay rewrites its cache entry's expiry (a write), so a
-- durability WAIT after it covers the original write too.
-- Returns:
--   committed [+ lease without id]  stored (a replay returns committed without a lease)
--   stale_token                     not the live lease's token, or below the key's last commit
--   expired                         no live lease
--   idempotency_conflict            the request id was used with other inputs
--   corrupt_state                   unreadable record; nothing changed
local token = ARGV[1]
local now = now_ms()
local fp = fingerprint(token, ARGV[2], ARGV[3])

local state, r, why = read_lease(KEYS[1], now)
local replayed = replay(KEYS[3], fp, now, state, r, why, {
  done = 'committed', done_msg = { committed = 'value committed (replayed request)' },
})
if replayed then return replayed end

if state == 'corrupt' then return reply('corrupt_state', now, why) end
if state == 'none' then return reply('expired', now, 'target has no live lease') end
if r.token ~= token then return reply('stale_token', now, "token is not the current lease's") end

-- The last commit's token: one HGET (a wrong type is an error reply,
-- caught); TYPE only when it is missing, to tell a first commit from a
-- record without a token.
local last = redis.pcall('HGET', KEYS[2], 'token')
if type(last) == 'table' then
  return reply('corrupt_state', now, 'commit record holds a ' .. type_of(KEYS[2]))
end
if not last and type_of(KEYS[2]) ~= 'none' then
  return reply('corrupt_state', now, 'commit record is unparsable')
end
if last then
  if not is_uint(last) then return reply('corrupt_state', now, 'commit record is unparsable') end
  if dec_lt(token, last) then
    return reply('stale_token', now, 'a higher token was already committed for this key')
  end
end
redis.call('HSET', KEYS[2], 'token', token, 'value', ARGV[3], 'committed_ms', str(now))
remember(KEYS[3], fp, '', token, tonumber(ARGV[4]))
return reply_lease('committed', now, 'value committed', r, false)
