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
-- Everything echoed from storage is checked by read_lease before a script
-- writes, so a reply the client cannot decode never follows a write.
--
-- Lease record (hash, with a TTL equal to its stored expiry):
--   v=1, lease_id, owner, token, acquired_ms, expires_ms, max_expires_ms, meta
-- Request cache (string, TTL = idempotency window), one GET / one SET PX:
--   "c1:<fp>:<token>:<outcome>:<lease_id>"   (lease_id last: it may hold ':')
-- Anything else under a request key is unreadable (corrupt_state).
--
-- Only the helpers a script names (and what they name) are sent with it
-- (src/store/valkey/scripts.rs): each helper starts at a line
-- "local function NAME" or "local NAME =", with its comment just above.

local MAX_TOKEN = '9223372036854775807'
-- Deepest metadata nesting (objects and arrays) accepted: the same limit as
-- MAX_METADATA_DEPTH in src/store.rs (a test ties the two).
local META_DEPTH = 64

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

-- Well-formed UTF-8 (no overlongs, no surrogates), as Rust strings require.
local function is_utf8(s)
  if not string.find(s, '[\128-\255]') then return true end
  local i, n = 1, #s
  while i <= n do
    local c = string.byte(s, i)
    local len
    if c < 0x80 then len = 1
    elseif c >= 0xC2 and c <= 0xDF then len = 2
    elseif c >= 0xE0 and c <= 0xEF then len = 3
    elseif c >= 0xF0 and c <= 0xF4 then len = 4
    else return false end
    if i + len - 1 > n then return false end
    for j = i + 1, i + len - 1 do
      local b = string.byte(s, j)
      if b < 0x80 or b > 0xBF then return false end
    end
    local b = string.byte(s, i + 1)
    if (c == 0xE0 and b < 0xA0) or (c == 0xED and b > 0x9F)
       or (c == 0xF0 and b < 0x90) or (c == 0xF4 and b > 0x8F) then
      return false
    end
    i = i + len
  end
  return true
end

local function finite_numbers(v)
  if type(v) == 'number' then return v == v and v ~= math.huge and v ~= -math.huge end
  if type(v) == 'table' then
    for _, x in pairs(v) do
      if not finite_numbers(x) then return false end
    end
  end
  return true
end

-- Stored metadata the client can decode: "" or a JSON object in UTF-8, at
-- most META_DEPTH deep, with finite numbers.
local function is_metadata(s)
  if s == '' then return true end
  if not is_utf8(s) or not string.find(s, '^%s*{') then return false end
  local bare = string.gsub(string.gsub(s, '\\.', ''), '"[^"]*"', '')
  local depth, deepest = 0, 0
  for ch in string.gmatch(bare, '[%[%]{}]') do
    if ch == '{' or ch == '[' then
      depth = depth + 1
      if depth > deepest then deepest = depth end
    else
      depth = depth - 1
    end
  end
  if deepest > META_DEPTH then return false end
  local ok, v = pcall(cjson.decode, s)
  return ok and type(v) == 'table' and finite_numbers(v)
end

local function hash_of(flat)
  local h = {}
  for i = 1, #flat, 2 do h[flat[i]] = flat[i + 1] end
  return h
end

-- The type of a key that answered a read with an error (WRONGTYPE).
local function type_of(key)
  return redis.call('TYPE', key).ok
end

-- The next canonical decimal after `s`, exact at any size.
local function dec_incr(s)
  local i = #s
  while i > 0 and string.byte(s, i) == 57 do i = i - 1 end
  if i == 0 then return '1' .. string.rep('0', #s) end
  return string.sub(s, 1, i - 1) .. string.char(string.byte(s, i) + 1) .. string.rep('0', #s - i)
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
-- An expired record still present (same millisecond) counts as 'none', with
-- `present` true (the caller deletes it before writing a new one).
-- One HGETALL (a wrong type is an error reply, caught) and, for a record,
-- one PTTL.
local function read_lease(key, now)
  local flat = redis.pcall('HGETALL', key)
  if flat.err then return 'corrupt', nil, 'lease key holds a ' .. type_of(key) end
  if #flat == 0 then return 'none' end
  local r = hash_of(flat)
  local ident = nil
  if r.lease_id and r.owner and is_uint(r.token) and r.token ~= '0' then ident = r end
  if r.v ~= '1' then return 'corrupt', ident, 'lease record has an unknown version' end
  if redis.call('PTTL', key) < 0 then return 'corrupt', ident, 'lease record has no expiry' end
  if not (ident and is_uint(r.acquired_ms) and is_uint(r.expires_ms)
          and (r.max_expires_ms == nil or r.max_expires_ms == '' or is_uint(r.max_expires_ms))
          and is_utf8(r.lease_id) and is_utf8(r.owner)) then
    return 'corrupt', ident, 'lease record is unparsable'
  end
  r.meta = r.meta or ''
  if not is_metadata(r.meta) then return 'corrupt', ident, 'lease record has unreadable metadata' end
  if tonumber(r.expires_ms) <= now then return 'none', nil, nil, true end
  r.max_expires_ms = r.max_expires_ms or ''
  return 'live', r
end

local function holder_matches(r, owner, lease_id, token)
  return r.owner == owner and r.lease_id == lease_id and r.token == token
end

-- One SET with the window as TTL (the key held no entry: replay() said so).
local function remember(key, fp, lease_id, token, window_ms, outcome)
  redis.call('SET', key, 'c1:' .. fp .. ':' .. token .. ':' .. (outcome or '') .. ':' .. lease_id,
    'PX', window_ms)
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

-- The request cache entry at `key`: nil when there is none; else a table
-- with fp, lease_id, token, outcome (fp nil when unreadable).
local function cached(key)
  local v = redis.pcall('GET', key)
  if not v then return nil end
  -- Another type (GET failed) is unreadable: no fp.
  if type(v) ~= 'string' then return {} end
  local fp, token, outcome, lease_id = string.match(v, '^c1:(%x+):(%d*):([%a_]*):(.*)$')
  return { fp = fp, token = token, outcome = outcome, lease_id = lease_id }
end

-- The one replay rule, shared by every mutating script (MemoryStore::replay
-- in src/store/memory.rs is the same rule). Returns nil when the request id
-- is new; otherwise the reply to return, without any other write than touch:
--   unreadable entry -> corrupt_state; other inputs -> idempotency_conflict;
--   rule.done (release, revoke, commit): the original outcome again, final;
--   else revalidated: the live lease with the cached lease id AND token ->
--   rule.live with the lease; a corrupt record -> corrupt_state; another live
--   lease -> rule.superseded(now, r); no live lease -> expired.
local function replay(key, fp, now, state, r, why, rule)
  local c = cached(key)
  if not c then return nil end
  if not c.fp then return reply('corrupt_state', now, 'request cache entry is unreadable') end
  if c.fp ~= fp then
    return reply('idempotency_conflict', now, 'request id was used with different inputs')
  end
  if rule.done then
    local outcome = rule.done
    if c.outcome and c.outcome ~= '' then outcome = c.outcome end
    touch(key)
    return reply(outcome, now, rule.done_msg[outcome] or (outcome .. ' (replayed request)'))
  end
  if state == 'corrupt' then return reply('corrupt_state', now, why) end
  if state == 'live' and r.lease_id == c.lease_id and r.token == c.token then
    touch(key)
    return reply_lease(rule.live, now, rule.live_msg, r, true)
  end
  if state == 'live' then return rule.superseded(now, r) end
  return reply('expired', now, rule.ended)
end
