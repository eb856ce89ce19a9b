-- revoke: administratively end the lease on a target (no owner check).
-- The fence counter is untouched, so the next token is still higher.
--
-- KEYS[1] lease      the lease record
-- KEYS[2] request    request cache for (revoke, target, "", request id)
-- ARGV[1] reason     informational; not stored
-- ARGV[2] token      expected fencing token ("" = whatever record is there)
-- ARGV[3] window     idempotency window ms
--
-- Runs under OOM (allow-oom): freeing a lease must work on a full server.
-- Publishes the key base "<prefix>:{<ns>:<target>}" on "<prefix>:events" (best effort).
-- The result is remembered, not_found included, so a retry with the same
-- request id never ends a lease acquired after the first attempt.
-- Returns:
--   revoked [+ lease without id]  a live or corrupt record was deleted (a replay: no lease)
--   not_found                     nothing live was there
--   not_owner                     with a token: the live lease has another one (not remembered)
--   idempotency_conflict          the request id was used with another token
--   corrupt_state                 with a token: an unreadable record whose token is not it
local now = now_ms()
local token = ARGV[2]
local fp = fingerprint(token)

local state, r, why = read_lease(KEYS[1], now)
local replayed = replay(KEYS[2], fp, now, state, r, why, {
  done = 'revoked',
  done_msg = {
    revoked = 'lease revoked (replayed request)',
    not_found = 'target had no live lease (replayed request)',
  },
})
if replayed then return replayed end

if token ~= '' then
  if state == 'live' and r.token ~= token then
    return reply('not_owner', now, 'the live lease has another fencing token')
  end
  if state == 'corrupt' and not (r and r.token == token) then
    return reply('corrupt_state', now, why)
  end
end
local out
if state == 'none' then
  out = reply('not_found', now, 'target has no live lease')
elseif state == 'corrupt' then
  out = reply('revoked', now, 'corrupt lease record removed')
else
  out = reply_lease('revoked', now, 'lease revoked', r, false)
end
redis.call('DEL', KEYS[1])
if state ~= 'none' then notify_free(KEYS[1]) end
local id, tok = '', ''
if r then id, tok = r.lease_id or '', r.token or '' end
remember(KEYS[2], fp, id, tok, tonumber(ARGV[3]), out[1])
return out
