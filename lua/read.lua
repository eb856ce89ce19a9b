-- read: the value last committed under a key of a target, with its token.
--
-- KEYS[1] commit     the commit record (hash: token, value, committed_ms)
--
-- Read-only (no-writes, called with EVALSHA_RO). Needs no lease.
-- Returns { outcome, now_ms, message[, token, value, committed_ms] }:
--   found + token, value, committed_ms    a value was committed
--   not_found                             nothing committed under this key
--   corrupt_state                         unreadable record; nothing changed
local now = now_ms()
-- One HGETALL (a wrong type is an error reply, caught).
local flat = redis.pcall('HGETALL', KEYS[1])
if flat.err then return reply('corrupt_state', now, 'commit record holds a ' .. type_of(KEYS[1])) end
if #flat == 0 then return reply('not_found', now, 'nothing committed under this key') end
local c = hash_of(flat)
if not (is_uint(c.token) and c.value and is_utf8(c.value) and is_uint(c.committed_ms)) then
  return reply('corrupt_state', now, 'commit record is unparsable')
end
return { 'found', str(now), 'value committed', c.token, c.value, c.committed_ms }
