-- lib.lua: helpers prepended to every targetlease script (not a script itself).
--
-- Every script returns one flat array of strings, decoded in one place
-- (src/store/valkey/reply.rs):
--   { outcome, now_ms, message }                                    -- no lease
--   { outcome, now_ms, message, lease_id, owner, token,
--     acquired_ms, expires_ms, max_expires_ms, metadata }           -- with a lease
-- lease_id is "" whenever the caller is not proven to be the holder.
-- max_expires_ms and metadata are "" when absent. Numbers are decimal strings:
-- tokens are kept as strings end to end because Lua numbers are doubles.
--
-- Lease record (hash, with a TTL equal to its stored expiry):
--   v=1, lease_id, owner, token, acquired_ms, expires_ms, max_expires_ms, meta
-- Request cache (hash, TTL = idempotency window): fp, lease_id, token

local MAX_TOKEN = '9223372036854775807'

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function str(n)
  return string.format('%.0f', n)
end

-- A canonical unsigned decimal that fits in a signed 64-bit integer.
local function is_uint(s)
  if type(s) ~= 'string' or not string.match(s, '^%d+$') then return false end
  if #s > 1 and string.sub(s, 1, 1) == '0' then return false end
  if #s > 19 or (#s == 19 and s > MAX_TOKEN) then return false end
  return true
end

-- a < b for canonical decimals, exact at any size.
local function dec_lt(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end

local function hash_of(key)
  local flat = redis.call('HGETALL', key)
  local h = {}
  for i = 1, #flat, 2 do h[flat[i]] = flat[i + 1] end
  return h
end

local function reply(outcome, now, message)
  return { outcome, str(now), message }
end

local function reply_lease(outcome, now, message, r, show_id)
  return { outcome, str(now), message, show_id and r.lease_id or '', r.owner, r.token,
           r.acquired_ms, r.expires_ms, r.max_expires_ms or '', r.meta or '' }
end

-- Reads the lease record at `key` as of `now`.
-- Returns 'none' | 'live', record | 'corrupt', identity-or-nil, why.
-- An expired record still present (same millisecond) counts as 'none'.
local function read_lease(key, now)
  local kind = redis.call('TYPE', key).ok
  if kind == 'none' then return 'none' end
  if kind ~= 'hash' then return 'corrupt', nil, 'lease key holds a ' .. kind end
  local r = hash_of(key)
  local ident = nil
  if r.lease_id and r.owner and is_uint(r.token) then ident = r end
  if r.v ~= '1' then return 'corrupt', ident, 'lease record has an unknown version' end
  if redis.call('PTTL', key) < 0 then return 'corrupt', ident, 'lease record has no expiry' end
  if not (ident and is_uint(r.acquired_ms) and is_uint(r.expires_ms)
          and (r.max_expires_ms == nil or r.max_expires_ms == '' or is_uint(r.max_expires_ms))) then
    return 'corrupt', ident, 'lease record is unparsable'
  end
  if tonumber(r.expires_ms) <= now then return 'none' end
  r.max_expires_ms = r.max_expires_ms or ''
  r.meta = r.meta or ''
  return 'live', r
end

local function holder_matches(r, owner, lease_id, token)
  return r.owner == owner and r.lease_id == lease_id and r.token == token
end

-- Reads a request-cache entry. Returns nil | entry | false (unreadable).
local function read_cache(key)
  local kind = redis.call('TYPE', key).ok
  if kind == 'none' then return nil end
  if kind ~= 'hash' then return false end
  local c = hash_of(key)
  if not c.fp then return false end
  return c
end

local function remember(key, fp, lease_id, token, window_ms)
  redis.call('DEL', key)
  redis.call('HSET', key, 'fp', fp, 'lease_id', lease_id, 'token', token)
  redis.call('PEXPIRE', key, window_ms)
end

-- Tells subscribers of "<prefix>:events" that a target may be free, with the
-- target's key base "<prefix>:{<ns>:<target>}" as the message. Best effort:
-- pcall, so a user without pub/sub permission still releases.
local function notify_free(lease_key)
  local base = string.sub(lease_key, 1, #lease_key - #':lease')
  local prefix = string.match(base, '^(.*):{')
  if prefix then redis.pcall('PUBLISH', prefix .. ':events', base) end
end

-- A write that changes nothing: a replayed request rewrites its cache entry's
-- expiry, so a durability WAIT after the replay (on any connection) also
-- covers the original write, which precedes it in the replication stream.
local function touch(key)
  local ttl = redis.call('PTTL', key)
  if ttl > 0 then redis.call('PEXPIRE', key, ttl) end
end

local function fingerprint(...)
  return redis.sha1hex(table.concat({ ... }, '\0'))
end

