-- acquire: grant the lease on a free target with the next fencing token.
--
-- KEYS[1] target     the target's hash (fields: see lib.lua)
-- ARGV[1] owner      who asks
-- ARGV[2] ttl        ttl_ms (> 0)
-- ARGV[3] max_life   max_lifetime_ms ("0" = none)
-- ARGV[4] lease_id   the lease id to assign: chosen by the caller, or derived
--                    by the client from (target, owner, request id)
-- ARGV[5] metadata   JSON object ("" = none), validated by the client; an
--                    owner or metadata past the client's limits (or metadata
--                    that is not a JSON object) is refused with an error
--                    reply, nothing written
-- ARGV[6] floor      the token issued is > this ("0" = none)
-- ARGV[7] window     idempotency window ms (added to the ttl for the cache entry)
-- ARGV[8] request    the request cache field, q:acquire:<owner>:<request id hash>
-- uses: MAX_TOKEN, now_ms, str, is_uint, dec_lt, unwritable, unechoable, fields,
-- uses: field_expiry, dec_incr, reply, reply_lease, pack_lease, read_lease,
-- uses: remember, field_of, fingerprint, replay
--
-- The request id's fingerprint is every input but the owner (part of the
-- cache field): ttl, max life, metadata, floor and the lease id. A replay
-- therefore needs the lease id, which is the capability it hands back.
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
--   (error reply) ERR <why>       owner, metadata or lease id the client would not send
local key, owner, ttl, max_life = KEYS[1], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local unfit = unwritable(owner, ARGV[5]) or unechoable(ARGV[4])
if unfit then return redis.error_reply('ERR ' .. unfit) end
local lease_id, request = ARGV[4], ARGV[8]
local now = now_ms()
local id_sha = redis.sha1hex(lease_id)
local fp = fingerprint(ARGV[2], ARGV[3], ARGV[5], ARGV[6], lease_id)

if not field_of('q:', request) then return reply('corrupt_state', now, 'not a request field') end
local f, bad = fields(key, 'lease', 'fence', request)
if not f then return reply('corrupt_state', now, bad) end
local state, r, why = read_lease(key, f[1], f[2], now)
-- A new request id (no cache entry) skips building the replay rule.
if f[3] then
  local replayed = replay(key, request, f[3], fp, now, state, r, why, {
    live = 'acquired', live_msg = 'lease acquired (replayed request)', id = lease_id,
    superseded = function(t, held)
      return reply_lease('held', t, 'the lease this request acquired was superseded', held, '')
    end,
    ended = 'the lease this request acquired has ended',
  })
  if replayed then return replayed end
end

if state == 'corrupt' then return reply('corrupt_state', now, why) end
if state == 'live' then return reply_lease('held', now, 'target is held', r, '') end

-- The counter, computed exactly as a decimal string (Lua numbers are doubles).
-- A key with an expiry would take the counter with it (and is evictable).
if redis.call('PTTL', key) >= 0 then return reply('corrupt_state', now, 'target key has an expiry') end
local counter = f[2]
if counter then
  if not is_uint(counter) then return reply('corrupt_state', now, 'fence counter is not a number') end
  if field_expiry(key, 'fence') ~= -1 then
    return reply('corrupt_state', now, 'fence counter has an expiry')
  end
else
  counter = '0'
end
if dec_lt(counter, ARGV[6]) then counter = ARGV[6] end
if counter == MAX_TOKEN then return reply('corrupt_state', now, 'fence counter exhausted') end
local token = dec_incr(counter)

local expires = now + ttl
local max_expires = ''
if max_life > 0 then
  max_expires = str(now + max_life)
  if now + max_life < expires then expires = now + max_life end
end
local rec = {
  id_sha = id_sha, owner = owner, token = token, acquired_ms = str(now),
  expires_ms = str(expires), max_expires_ms = max_expires, meta = ARGV[5],
}
redis.call('HSETEX', key, 'PXAT', expires, 'FIELDS', 1, 'lease', pack_lease(rec))
redis.call('HSET', key, 'fence', token)
remember(key, request, fp, id_sha, token, ttl + tonumber(ARGV[7]))
return reply_lease('acquired', now, 'lease acquired', rec, lease_id)
