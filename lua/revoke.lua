-- revoke: administratively delete whatever record sits at the lease key.
-- No owner check; the fence counter is untouched, so the next token is still higher.
--
-- KEYS[1] lease record
-- ARGV[1] reason (informational; not stored)
-- Publishes the key base "<prefix>:{<ns>:<target>}" on "<prefix>:events" (best effort).
-- Returns:
--   revoked [+ lease without id]  a live or corrupt record was deleted
--   not_found                     nothing live was there
local now = now_ms()
local state, r = read_lease(KEYS[1], now)
redis.call('DEL', KEYS[1])
if state ~= 'none' then notify_free(KEYS[1]) end
if state == 'none' then return reply('not_found', now, 'target has no live lease') end
if state == 'corrupt' then return reply('revoked', now, 'corrupt lease record removed') end
return reply_lease('revoked', now, 'lease revoked', r, false)
