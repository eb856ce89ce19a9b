-- release: end the exact current lease. The fence counter is untouched.
--
-- KEYS[1] target     the target's hash (fields: see lib.lua)
-- ARGV[1] owner      the holder's owner
-- ARGV[2] lease_id   the holder's lease id
-- ARGV[3] token      the holder's fencing token
-- ARGV[4] window     idempotency window ms
-- ARGV[5] request    the request cache field, q:release:<owner>:<request id hash>
-- uses: now_ms, unechoable, fields, reply, reply_lease, read_lease,
-- uses: handle_matches, remember, notify_free, field_of, fingerprint, replay
--
-- Runs under OOM (allow-oom): freeing a lease must work on a full server.
-- Publishes the target's key "<prefix>:{<ns>:<target>}" on "<prefix>:events" (best effort).
-- A successful replay rewrites its cache entry's expiry (a write), so a
-- durability WAIT after it covers the original write too.
-- Returns:
--   released [+ lease with id]    ended (a replay returns released without a lease)
--   not_owner                     a live lease exists but is not (lease id, owner, token)
--   expired                       no live lease
--   idempotency_conflict          the request id was used with other inputs
--   corrupt_state                 unreadable record; nothing changed
--   (error reply) ERR <why>       a lease id the client would not send
-- Cleanup rule: a corrupt lease record (no expiry, unknown fields) whose
-- token, lease id and owner still read exactly as given is removed and
-- reported as released: only the holder can prove that identity.
local key, owner, lease_id, token = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local unfit = unechoable(lease_id)
if unfit then return redis.error_reply('ERR ' .. unfit) end
local request = ARGV[5]
local now = now_ms()
local id_sha = redis.sha1hex(lease_id)
local fp = fingerprint(lease_id, token)

if not field_of('q:', request) then return reply('corrupt_state', now, 'not a request field') end
local f, bad = fields(key, 'lease', 'fence', request)
if not f then return reply('corrupt_state', now, bad) end
local state, r, why = read_lease(key, f[1], f[2], now)
local replayed = replay(key, request, f[3], fp, now, state, r, why, {
  done = 'released', done_msg = { released = 'lease released (replayed request)' },
})
if replayed then return replayed end

local out
if state == 'corrupt' then
  if not (r and handle_matches(r, owner, id_sha, token)) then
    return reply('corrupt_state', now, why)
  end
  out = reply('released', now, 'corrupt lease record removed by its holder')
elseif state == 'none' then
  return reply('expired', now, 'the lease has ended')
elseif not handle_matches(r, owner, id_sha, token) then
  return reply('not_owner', now, 'the lease is not held by this lease id, owner and token')
else
  out = reply_lease('released', now, 'lease released', r, lease_id)
end
remember(key, request, fp, id_sha, token, tonumber(ARGV[4]))
redis.call('HDEL', key, 'lease')
notify_free(key)
return out
