-- commit: fenced write of one value under a target.
--
-- KEYS[1] target     the target's hash (fields: see lib.lua)
-- ARGV[1] token      the writer's fencing token
-- ARGV[2] key        the value's name
-- ARGV[3] value      the value
-- ARGV[4] window     idempotency window ms
-- ARGV[5] commit     the commit field, c:<key>
-- ARGV[6] request    the request cache field, q:commit::<request id hash>
-- uses: now_ms, str, is_uint, dec_lt, fields, reply, reply_lease, read_lease,
-- uses: remember, field_of, fingerprint, replay
--
-- A successful replay rewrites its cache entry's expiry (a write), so a
-- durability WAIT after it covers the original write too.
-- Returns:
--   committed [+ lease without id]  stored (a replay returns committed without a lease)
--   stale_token                     not the live lease's token, or below the key's last commit
--   expired                         no live lease
--   idempotency_conflict            the request id was used with other inputs
--   corrupt_state                   unreadable record; nothing changed
local key, token, commit, request = KEYS[1], ARGV[1], ARGV[5], ARGV[6]
local now = now_ms()
local fp = fingerprint(token, ARGV[2], ARGV[3])

if not (field_of('q:', request) and field_of('c:', commit)) then
  return reply('corrupt_state', now, 'not a request or commit field')
end
local f, bad = fields(key, 'lease', commit, request, 'fence')
if not f then return reply('corrupt_state', now, bad) end
local state, r, why = read_lease(key, f[1], f[4], now)
local replayed = replay(key, request, f[3], fp, now, state, r, why, {
  done = 'committed', done_msg = { committed = 'value committed (replayed request)' },
})
if replayed then return replayed end

if state == 'corrupt' then return reply('corrupt_state', now, why) end
if state == 'none' then return reply('expired', now, 'target has no live lease') end
if r.token ~= token then return reply('stale_token', now, "token is not the current lease's") end

-- The last commit's token, exact at any size.
if f[2] then
  local last = string.match(f[2], '^(%d+):%d+:')
  if not is_uint(last) then return reply('corrupt_state', now, 'commit record is unparsable') end
  if dec_lt(token, last) then
    return reply('stale_token', now, 'a higher token was already committed for this key')
  end
end
remember(key, request, fp, '', token, tonumber(ARGV[4]))
redis.call('HSET', key, commit, token .. ':' .. str(now) .. ':' .. ARGV[3])
return reply_lease('committed', now, 'value committed', r, '')
