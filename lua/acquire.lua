-- acquire: grant the lease on a free target with the next fencing token.
--
-- KEYS[1] lease      the lease record
-- KEYS[2] fence      the fencing counter (never expires, never deleted)
-- KEYS[3] request    request cache for (acquire, target, owner, request id)
-- ARGV[1] owner      who asks
-- ARGV[2] ttl        ttl_ms (> 0)
-- ARGV[3] max_life   max_lifetime_ms ("0" = none)
-- ARGV[4] lease_id   lease id to assign (fresh random unless chosen; only used when granting)
-- ARGV[5] metadata   JSON object ("" = none), validated by the client
-- ARGV[6] floor      the token issued is > this ("0" = none)
-- ARGV[7] window     idempotency window ms (added to the ttl for the cache entry)
-- ARGV[8] chosen     "1" when the caller chose ARGV[4] ("" = fresh random per attempt)
--
-- The request id's fingerprint is every input but the owner (part of the
-- cache key): ttl, max life, metadata, floor and a chosen lease id. A random
-- lease id is not in it (each attempt draws a new one). A replay therefore
-- needs the chosen lease id, which is the capability it hands back.
--
-- A successful replay rewrites its cache entry's expiry (a write), so a
-- durability WAIT after it covers the original write too.
-- Returns (see lib.lua for the shapes):
--   acquired + lease with id      the lease was granted, or this request id granted
--                                 it and it still lives (same lease id and token)
--   held + lease without id       a live lease exists (never cached: a retry may win later)
--   expired                       this request id's lease has ended
--   idempotency_conflict          the request id was used with other inputs
--   corrupt_state                 unreadable record/counter/cache, or counter exhausted
local owner, ttl, max_life = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
local chosen = ''
if ARGV[8] == '1' then chosen = ARGV[4] end
local fp = fingerprint(ARGV[2], ARGV[3], ARGV[5], ARGV[6], chosen)

local state, r, why, present = read_lease(KEYS[1], now)
local replayed = replay(KEYS[3], fp, now, state, r, why, {
  live = 'acquired', live_msg = 'lease acquired (replayed request)',
  superseded = function(t, held)
    return reply_lease('held', t, 'the lease this request acquired was superseded', held, false)
  end,
  ended = 'the lease this request acquired has ended',
})
if replayed then return replayed end

if state == 'corrupt' then return reply('corrupt_state', now, why) end
if state == 'live' then return reply_lease('held', now, 'target is held', r, false) end

-- The counter: one GET (a wrong type is an error reply, caught), one SET of
-- the next decimal, computed exactly as a string (Lua numbers are doubles).
local counter = redis.pcall('GET', KEYS[2])
if type(counter) == 'table' then
  return reply('corrupt_state', now, 'fence counter holds a ' .. type_of(KEYS[2]))
end
if counter then
  if not is_uint(counter) then return reply('corrupt_state', now, 'fence counter is not a number') end
  if redis.call('PTTL', KEYS[2]) ~= -1 then return reply('corrupt_state', now, 'fence counter has an expiry') end
else
  counter = '0'
end
if dec_lt(counter, ARGV[6]) then counter = ARGV[6] end
if counter == MAX_TOKEN then return reply('corrupt_state', now, 'fence counter exhausted') end
local token = dec_incr(counter)
redis.call('SET', KEYS[2], token)

local expires = now + ttl
local max_expires = ''
if max_life > 0 then
  max_expires = str(now + max_life)
  if now + max_life < expires then expires = now + max_life end
end
local rec = {
  lease_id = ARGV[4], owner = owner, token = token, acquired_ms = str(now),
  expires_ms = str(expires), max_expires_ms = max_expires, meta = ARGV[5],
}
if present then redis.call('DEL', KEYS[1]) end
redis.call('HSET', KEYS[1], 'v', '1', 'lease_id', rec.lease_id, 'owner', owner, 'token', token,
  'acquired_ms', rec.acquired_ms, 'expires_ms', rec.expires_ms,
  'max_expires_ms', max_expires, 'meta', rec.meta)
redis.call('PEXPIREAT', KEYS[1], expires)
remember(KEYS[3], fp, rec.lease_id, token, ttl + tonumber(ARGV[7]))
return reply_lease('acquired', now, 'lease acquired', rec, true)
