-- release: end the exact current lease. The fence counter is untouched.
--
-- KEYS[1] lease      the lease record
-- KEYS[2] request    request cache for (release, target, owner, request id)
-- ARGV[1] owner      the holder's owner
-- ARGV[2] lease_id   the holder's lease id
-- ARGV[3] token      the holder's fencing token
-- ARGV[4] window     idempotency window ms
--
-- Runs under OOM (allow-oom): freeing a lease must work on a full server.
-- Publishes the key base "<prefix>:{<ns>:<target>}" on "<prefix>:events" (best effort).
-- A successful replay rewrites its cache entry's expiry (a write), so a
-- durability WAIT after it covers the original write too.
-- Returns:
--   released [+ lease with id]    ended (a replay returns released without a lease)
--   not_owner                     a live lease exists but is not (lease id, owner, token)
--   expired                       no live lease
--   idempotency_conflict          the request id was used with other inputs
--   corrupt_state                 unreadable record; nothing changed
-- Cleanup rule: a corrupt record (no expiry, unknown version, bad fields) whose
-- lease_id, owner and token fields still read exactly as given is deleted and
-- reported as released: only the holder can prove that identity.
local owner, lease_id, token = ARGV[1], ARGV[2], ARGV[3]
local now = now_ms()
local fp = fingerprint(lease_id, token)

local state, r, why = read_lease(KEYS[1], now)
local replayed = replay(KEYS[2], fp, now, state, r, why, {
  done = 'released', done_msg = { released = 'lease released (replayed request)' },
})
if replayed then return replayed end

local out
if state == 'corrupt' then
  if not (r and holder_matches(r, owner, lease_id, token)) then
    return reply('corrupt_state', now, why)
  end
  out = reply('released', now, 'corrupt lease record removed by its holder')
elseif state == 'none' then
  return reply('expired', now, 'the lease has ended')
elseif not holder_matches(r, owner, lease_id, token) then
  return reply('not_owner', now, 'the lease is not held by this lease id, owner and token')
else
  out = reply_lease('released', now, 'lease released', r, true)
end
redis.call('DEL', KEYS[1])
notify_free(KEYS[1])
remember(KEYS[2], fp, lease_id, token, tonumber(ARGV[4]))
return out
