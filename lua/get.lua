-- get: read the live lease, never its lease id.
--
-- KEYS[1] target     the target's hash (fields: see lib.lua)
-- uses: now_ms, fields, reply, reply_lease, read_lease
--
-- Read-only (no-writes, called with FCALL_RO): it runs on a full server,
-- with min-replicas-to-write unmet, and on a replica.
-- Returns:
--   found + lease without id      a live lease exists
--   not_found                     none
--   corrupt_state                 unreadable record; nothing changed
local now = now_ms()
local f, bad = fields(KEYS[1], 'lease', 'fence')
if not f then return reply('corrupt_state', now, bad) end
local state, r, why = read_lease(KEYS[1], f[1], f[2], now)
if state == 'corrupt' then return reply('corrupt_state', now, why) end
if state == 'none' then return reply('not_found', now, 'target has no live lease') end
return reply_lease('found', now, 'target is held', r, '')
