-- revoke: administratively end the lease on a target (no owner check).
-- The fence counter is never lowered, so the next token is still higher; a
-- record whose counter went missing or fell behind (corrupt) is removed and
-- leaves the counter at its token.
--
-- KEYS[1] target     the target's hash (fields: see lib.lua)
-- ARGV[1] token      expected fencing token ("" = whatever record is there)
-- ARGV[2] window     idempotency window ms
-- ARGV[3] request    the request cache field, q:revoke::<request id hash>
-- uses: now_ms, is_uint, dec_lt, fields, reply, reply_lease, read_lease,
-- uses: remember, notify_free, field_of, fingerprint, replay
--
-- Runs under OOM (allow-oom): freeing a lease must work on a full server.
-- Publishes the target's key "<prefix>:{<ns>:<target>}" on "<prefix>:events" (best effort).
-- The result is remembered, not_found included, so a retry with the same
-- request id never ends a lease acquired after the first attempt.
-- Returns:
--   revoked [+ lease without id]  a live or corrupt lease record was removed (a replay: no lease)
--   not_found                     nothing live was there
--   not_owner                     with a token: the live lease has another one (not remembered)
--   idempotency_conflict          the request id was used with another token
--   corrupt_state                 the target's key is not a hash, or with a token: an
--                                 unreadable record whose token is not it; nothing changed
local key, token, request = KEYS[1], ARGV[1], ARGV[3]
local now = now_ms()
local fp = fingerprint(token)

if not field_of('q:', request) then return reply('corrupt_state', now, 'not a request field') end
local f, bad = fields(key, 'lease', 'fence', request)
if not f then return reply('corrupt_state', now, bad) end
local state, r, why = read_lease(key, f[1], f[2], now)
local replayed = replay(key, request, f[3], fp, now, state, r, why, {
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
local outcome, out = 'revoked'
if state == 'none' then
  outcome = 'not_found'
  out = reply(outcome, now, 'target has no live lease')
elseif state == 'corrupt' then
  out = reply(outcome, now, 'corrupt lease record removed')
else
  out = reply_lease(outcome, now, 'lease revoked', r, '')
end
local id, tok = '', ''
if r then id, tok = r.id_sha, r.token end
remember(key, request, fp, id, tok, tonumber(ARGV[2]), outcome)
if f[1] then redis.call('HDEL', key, 'lease') end
-- Removing a record never lowers the counter: one whose counter went
-- missing or fell behind leaves it at the record's token at least.
local seen = string.match(f[1] or '', '^1:(%d+):')
if is_uint(seen or '') and not (is_uint(f[2] or '') and not dec_lt(f[2], seen)) then
  redis.call('HSET', key, 'fence', seen)
end
if state ~= 'none' then notify_free(key) end
return out
