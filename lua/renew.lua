-- renew: extend the exact current lease (never past its max lifetime).
--
-- KEYS[1] target     the target's hash (fields: see lib.lua)
-- ARGV[1] owner      the holder's owner
-- ARGV[2] lease_id   the holder's lease id
-- ARGV[3] token      the holder's fencing token
-- ARGV[4] ttl        ttl_ms (> 0), counted from the server's now
-- ARGV[5] window     idempotency window ms
-- ARGV[6] request    the request cache field, q:renew:<owner>:<request id hash>
-- ARGV[7] extend     '1': never move the expiry earlier (the later of the
--                    current expiry and now + ttl); '0': now + ttl
-- uses: now_ms, str, unechoable, fields, reply, reply_lease, pack_lease,
-- uses: read_lease, handle_matches, remember, field_of, fingerprint, replay
--
-- A successful replay rewrites its cache entry's expiry (a write), so a
-- durability WAIT after it covers the original write too.
-- Returns:
--   renewed + lease with id       extended (or this request id extended it and it still lives)
--   not_owner                     a live lease exists but is not (lease id, owner, token)
--   expired                       no live lease
--   idempotency_conflict          the request id was used with other inputs
--   corrupt_state                 unreadable record or cache; nothing changed
--   (error reply) ERR <why>       a lease id the client would not send
local key, owner, lease_id, token, ttl = KEYS[1], ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local request = ARGV[6]
local unfit = unechoable(lease_id)
if unfit then return redis.error_reply('ERR ' .. unfit) end
local now = now_ms()
local id_sha = redis.sha1hex(lease_id)
local extend = ARGV[7] == '1'
-- A plain renewal keeps the fingerprint it always had.
local fp = extend and fingerprint(lease_id, token, ARGV[4], 'extend') or fingerprint(lease_id, token, ARGV[4])

if not field_of('q:', request) then return reply('corrupt_state', now, 'not a request field') end
local f, bad = fields(key, 'lease', 'fence', request)
if not f then return reply('corrupt_state', now, bad) end
local state, r, why = read_lease(key, f[1], f[2], now)
-- A new request id (no cache entry) skips building the replay rule.
if f[3] then
  local replayed = replay(key, request, f[3], fp, now, state, r, why, {
    live = 'renewed', live_msg = 'lease renewed (replayed request)', id = lease_id,
    superseded = function(t) return reply('not_owner', t, 'the lease was superseded') end,
    ended = 'the lease has ended',
  })
  if replayed then return replayed end
end

if state == 'corrupt' then return reply('corrupt_state', now, why) end
if state == 'none' then return reply('expired', now, 'the lease has ended') end
if not handle_matches(r, owner, id_sha, token) then
  return reply('not_owner', now, 'the lease is not held by this lease id, owner and token')
end

local expires = now + ttl
if extend and tonumber(r.expires_ms) > expires then expires = tonumber(r.expires_ms) end
if r.max_expires_ms ~= '' and tonumber(r.max_expires_ms) < expires then
  expires = tonumber(r.max_expires_ms)
end
r.expires_ms = str(expires)
redis.call('HSETEX', key, 'PXAT', expires, 'FIELDS', 1, 'lease', pack_lease(r))
remember(key, request, fp, id_sha, token, tonumber(ARGV[5]))
return reply_lease('renewed', now, 'lease renewed', r, lease_id)
