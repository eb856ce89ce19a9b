-- renew: extend the exact current lease (never past its max lifetime).
--
-- KEYS[1] lease      the lease record
-- KEYS[2] request    request cache for (renew, target, owner, request id)
-- ARGV[1] owner      the holder's owner
-- ARGV[2] lease_id   the holder's lease id
-- ARGV[3] token      the holder's fencing token
-- ARGV[4] ttl        ttl_ms (> 0), counted from the server's now
-- ARGV[5] window     idempotency window ms
--
-- A successful replay rewrites its cache entry's expiry (a write), so a
-- durability WAIT after it covers the original write too.
-- Returns:
--   renewed + lease with id       extended (or this request id extended it and it still lives)
--   not_owner                     a live lease exists but is not (lease id, owner, token)
--   expired                       no live lease
--   idempotency_conflict          the request id was used with other inputs
--   corrupt_state                 unreadable record or cache; nothing changed
local owner, lease_id, token, ttl = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local now = now_ms()
local fp = fingerprint(lease_id, token, ARGV[4])

local state, r, why = read_lease(KEYS[1], now)
local replayed = replay(KEYS[2], fp, now, state, r, why, {
  live = 'renewed', live_msg = 'lease renewed (replayed request)',
  superseded = function(t) return reply('not_owner', t, 'the lease was superseded') end,
  ended = 'the lease has ended',
})
if replayed then return replayed end

if state == 'corrupt' then return reply('corrupt_state', now, why) end
if state == 'none' then return reply('expired', now, 'the lease has ended') end
if not holder_matches(r, owner, lease_id, token) then
  return reply('not_owner', now, 'the lease is not held by this lease id, owner and token')
end

local expires = now + ttl
if r.max_expires_ms ~= '' and tonumber(r.max_expires_ms) < expires then
  expires = tonumber(r.max_expires_ms)
end
r.expires_ms = str(expires)
redis.call('HSET', KEYS[1], 'expires_ms', r.expires_ms)
redis.call('PEXPIREAT', KEYS[1], expires)
remember(KEYS[2], fp, lease_id, token, tonumber(ARGV[5]))
return reply_lease('renewed', now, 'lease renewed', r, true)
