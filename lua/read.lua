-- read: the value last committed under a key of a target, with its token.
--
-- KEYS[1] target     the target's hash (fields: see lib.lua)
-- ARGV[1] commit     the commit field, c:<key>
-- uses: now_ms, is_uint, is_utf8, fields, reply, field_of
--
-- Read-only (no-writes, called with FCALL_RO). Needs no lease.
-- Returns outcome, now_ms, message[, token, committed_ms, value], one string
-- (see lib.lua):
--   found + token, committed_ms, value    a value was committed
--   not_found                             nothing committed under this key
--   corrupt_state                         unreadable record; nothing changed
local now = now_ms()
if not field_of('c:', ARGV[1]) then return reply('corrupt_state', now, 'not a commit field') end
local f, bad = fields(KEYS[1], ARGV[1])
if not f then return reply('corrupt_state', now, bad) end
if not f[1] then return reply('not_found', now, 'nothing committed under this key') end
local token, at, value = string.match(f[1], '^(%d+):(%d+):(.*)$')
if not (is_uint(token) and token ~= '0' and is_uint(at) and is_utf8(value)) then
  return reply('corrupt_state', now, 'commit record is unparsable')
end
return reply('found', now, 'value committed') .. '\0' .. token .. '\0' .. at .. '\0' .. value
