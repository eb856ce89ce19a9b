-- lib.lua: the helpers of the targetlease function library (not a script
-- itself): src/store/valkey/scripts.rs puts this file first in the library
-- and each lua/<op>.lua after it as a function of its own, so a helper is
-- defined once when the library loads, not on every call.
--
-- Every script returns one string of fields joined by NUL bytes, decoded in
-- one place (src/store/valkey/reply.rs):
--   outcome, now_ms, message                                        -- no lease
--   outcome, now_ms, message, lease_id, token, acquired_ms,
--     expires_ms, max_expires_ms, metadata, owner                   -- with a lease
--   outcome, now_ms, message, token, committed_ms, value           -- read, a commit
-- One string, not an array: the server builds an array reply with a length
-- it only knows at the end, which costs about as much as a command. No field
-- holds a NUL but the last (the messages are the scripts' own, a lease id
-- with one is refused: unechoable, metadata is strict JSON); the owner and a
-- committed value are last, so even one written by hand with a NUL decodes
-- whole.
-- lease_id is "" whenever the caller is not proven to be the holder (it is
-- never stored, so a script can only echo the one its caller proved).
-- max_expires_ms and metadata are "" when absent. Numbers are decimal strings:
-- tokens are kept as strings end to end because Lua numbers are doubles.
-- Everything echoed from storage is checked by read_lease before a script
-- writes, so a reply the client cannot decode never follows a write.
--
-- One hash per target, KEYS[1] = "<prefix>:{<ns>:<target>}": every script
-- touches that one key, so a Cluster slot migration moves a target whole
-- (never some of its state on each node, which Valkey answers TRYAGAIN).
-- Fields (hash-field expiry and HSETEX: Valkey 9.0 or newer):
--   fence         the fencing counter, a decimal; no expiry, never deleted
--   lease         the live lease, expiring with it:
--                 "1:<token>:<acquired_ms>:<expires_ms>:<max_expires_ms>:<id_sha>:<owner bytes>:<owner><metadata>"
--                 id_sha is the SHA-1 of the lease id: the id itself is not stored
--   q:<op>:<scope>:<request id hash>   the request cache, expiring after its
--                 window: "<fp>:<token>:<outcome>:<id_sha>" (the request id is
--                 hashed by the client: a derived lease id follows from it)
--   c:<key>       the last fenced commit under <key>: "<token>:<committed_ms>:<value>"
--
-- Each script lists the helpers it calls on its "-- uses:" header lines (a
-- test checks the list against the helpers the script's code names): each
-- helper starts at a line "local function NAME" or "local NAME =", with its
-- comment just above. Nothing here may call the server when the library
-- loads (Valkey refuses it then): helpers run only inside a call.

local MAX_TOKEN = '9223372036854775807'
-- Deepest metadata nesting (objects and arrays) accepted: the same limit as
-- MAX_METADATA_DEPTH in src/store/mod.rs (a test ties the two).
local META_DEPTH = 64
-- The largest lease record a script writes: an owner of at most
-- MAX_NAME_BYTES and metadata of at most MAX_METADATA_BYTES (src/store/mod.rs,
-- a test ties them), its numbers and separators in 200 more. Anything
-- larger was written by hand (a user with raw hash writes) and is refused
-- as corrupt before any pattern or JSON scan runs over it, so one planted
-- record cannot hold the server for seconds on every read.
local RECORD_BYTES = 256 + 4096 + 200
-- The longest owner and metadata a script accepts: MAX_NAME_BYTES and
-- MAX_METADATA_BYTES of src/store/mod.rs (a test ties them). The client never
-- sends more; a raw FCALL that does is refused before anything is
-- written, so no script writes a record larger than RECORD_BYTES.
local NAME_BYTES = 256
local META_BYTES = 4096

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

-- The same test as is_uint for a string already known to be digits only (a
-- field the record's pattern captured): no leading zero, at most MAX_TOKEN.
-- Cheaper: no pattern match.
local function uint_digits(s)
  local n = #s
  if n > 1 and string.byte(s) == 48 then return false end
  return n < 19 or (n == 19 and s <= MAX_TOKEN)
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

-- JSON as strict as the client's decoder (serde_json), which cjson is not:
-- cjson takes 01, 0x10, +1, 1. and raw control characters in strings. Checks
-- the escapes, that no string holds a byte below 0x20, and that every bare
-- token is a JSON number or literal; cjson then checks the structure.
local function is_strict_json(s)
  if string.find(s, '\\[^"\\/bfnrtu]') then return false end
  if string.find((string.gsub(s, '\\u%x%x%x%x', '')), '\\u') then return false end
  local plain = string.gsub(s, '\\.', 'e')
  for str in string.gmatch(plain, '"[^"]*"') do
    if string.find(str, '[%z\1-\31]') then return false end
  end
  local bare = string.gsub(string.gsub(plain, '"[^"]*"', '"'), '[ \t\n\r]', '')
  for tok in string.gmatch(bare, '[^{}%[%],:]+') do
    if tok ~= '"' and tok ~= 'true' and tok ~= 'false' and tok ~= 'null' then
      local int, rest = string.match(tok, '^%-?(%d+)(.*)$')
      if not int or (#int > 1 and string.sub(int, 1, 1) == '0') then return false end
      rest = string.gsub(rest, '^%.%d+', '', 1)
      rest = string.gsub(rest, '^[eE][+-]?%d+', '', 1)
      if rest ~= '' then return false end
    end
  end
  return true
end

-- Stored metadata the client can decode: "" or a JSON object in UTF-8, at
-- most META_DEPTH deep, with finite numbers.
local function is_metadata(s)
  if s == '' then return true end
  if not is_utf8(s) or not string.find(s, '^%s*{') or not is_strict_json(s) then return false end
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

-- Why a caller's owner and metadata cannot be written (nil when they can):
-- too long (see NAME_BYTES and META_BYTES), or metadata that is not a JSON
-- object the client can decode (every read would find the record corrupt).
local function unwritable(owner, meta)
  if #owner > NAME_BYTES then
    return 'owner is ' .. #owner .. ' bytes; at most ' .. NAME_BYTES .. ' are allowed'
  end
  if #meta > META_BYTES then
    return 'metadata is ' .. #meta .. ' bytes; at most ' .. META_BYTES .. ' are allowed'
  end
  if not is_metadata(meta) then return 'metadata is not a JSON object' end
  return nil
end

-- Why a caller's lease id cannot be echoed in a reply (nil when it can): a
-- NUL byte would split the reply's fields. The client never sends one (no
-- control characters); a raw FCALL that does is refused before anything
-- is written.
local function unechoable(id)
  if string.find(id, '\0', 1, true) then return 'lease id holds a NUL byte' end
  return nil
end

-- The type of a key that answered a read with an error (WRONGTYPE).
local function type_of(key)
  return redis.call('TYPE', key).ok
end

-- The target's fields named by the arguments after `key`, in order (false
-- where absent), by one HMGET (no table of names: each table a script builds
-- costs time); nil and why when the key is not a hash (nothing may be written then).
local function fields(key, ...)
  local v = redis.pcall('HMGET', key, ...)
  if v.err then return nil, 'target key holds a ' .. type_of(key) end
  return v
end

-- The expiry (Unix ms) of the target's field `field`, by one HPEXPIRETIME:
-- -1 for a field without expiry, -2 for no such field.
local function field_expiry(key, field)
  return redis.call('HPEXPIRETIME', key, 'FIELDS', 1, field)[1]
end

-- The next canonical decimal after `s`, exact at any size.
local function dec_incr(s)
  local i = #s
  while i > 0 and string.byte(s, i) == 57 do i = i - 1 end
  if i == 0 then return '1' .. string.rep('0', #s) end
  return string.sub(s, 1, i - 1) .. string.char(string.byte(s, i) + 1) .. string.rep('0', #s - i)
end

local function reply(outcome, now, message)
  return outcome .. '\0' .. str(now) .. '\0' .. message
end

-- A reply with the lease `r`; `id` is the lease id the caller proved ("" when
-- it proved none).
local function reply_lease(outcome, now, message, r, id)
  return outcome .. '\0' .. str(now) .. '\0' .. message .. '\0' .. id .. '\0' .. r.token
    .. '\0' .. r.acquired_ms .. '\0' .. r.expires_ms .. '\0' .. r.max_expires_ms
    .. '\0' .. r.meta .. '\0' .. r.owner
end

-- The lease field packed from a record.
local function pack_lease(r)
  return '1:' .. r.token .. ':' .. r.acquired_ms .. ':' .. r.expires_ms .. ':'
    .. r.max_expires_ms .. ':' .. r.id_sha .. ':' .. #r.owner .. ':' .. r.owner .. r.meta
end

-- Reads the lease field `packed` (false when absent) of the target `key` as
-- of `now`, with the target's counter `fence` (false when absent). Returns
-- 'none' | 'live', record | 'corrupt', identity-or-nil, why. The identity
-- (token, id_sha, owner) is given when the record reads cleanly enough to
-- name its holder, so that the holder can still end it. A record whose field
-- expiry is not its stored expiry, or whose counter is missing or behind its
-- token, is corrupt (the counter is not the record's fault: no identity).
-- An expired field still present (same millisecond) counts as 'none'. One
-- HPEXPIRETIME for a present field.
local function read_lease(key, packed, fence, now)
  if not packed then return 'none' end
  if #packed > RECORD_BYTES then
    return 'corrupt', nil, 'lease record is larger than any a script writes'
  end
  -- One match for the version and the fields (the version alone when it fails).
  local token, acquired, expires, max_expires, id_sha, olen, rest =
    string.match(packed, '^1:(%d+):(%d+):(%d+):(%d*):(%x*):(%d+):(.*)$')
  if not token and string.match(packed, '^(%w+):') ~= '1' then
    return 'corrupt', nil, 'lease record has an unknown version'
  end
  if not token then return 'corrupt', nil, 'lease record is unparsable' end
  olen = tonumber(olen)
  if olen > #rest then return 'corrupt', nil, 'lease record is unparsable' end
  local r = {
    token = token, acquired_ms = acquired, expires_ms = expires,
    max_expires_ms = max_expires, id_sha = id_sha,
    owner = string.sub(rest, 1, olen), meta = string.sub(rest, olen + 1),
  }
  local ident = nil
  if uint_digits(token) and token ~= '0' and #id_sha == 40 and is_utf8(r.owner) then ident = r end
  if not (ident and uint_digits(acquired) and uint_digits(expires)
          and (max_expires == '' or uint_digits(max_expires))) then
    return 'corrupt', ident, 'lease record is unparsable'
  end
  if not (is_uint(fence or '') and not dec_lt(fence, token)) then
    return 'corrupt', nil, 'fence counter is missing or behind the lease'
  end
  local at = redis.call('HPEXPIRETIME', key, 'FIELDS', 1, 'lease')[1]
  if at < 0 then return 'corrupt', ident, 'lease record has no expiry' end
  local exp = tonumber(expires)
  if at ~= exp or tonumber(acquired) > exp
     or (max_expires ~= '' and exp > tonumber(max_expires)) then
    return 'corrupt', ident, "lease record's expiry disagrees with itself"
  end
  if r.meta ~= '' and not is_metadata(r.meta) then
    return 'corrupt', ident, 'lease record has unreadable metadata'
  end
  if exp <= now then return 'none' end
  return 'live', r
end

local function handle_matches(r, owner, id_sha, token)
  return r.owner == owner and r.id_sha == id_sha and r.token == token
end

-- Writes the request cache entry `field` (it held none: replay() said so),
-- expiring after `window_ms`, by one HSETEX. Every writing script's first
-- write sets a field with its expiry (HSETEX), so a server without
-- hash-field expiry refuses the script before it changed anything.
local function remember(key, field, fp, id_sha, token, window_ms, outcome)
  redis.call('HSETEX', key, 'PX', window_ms, 'FIELDS', 1, field,
    fp .. ':' .. token .. ':' .. (outcome or '') .. ':' .. id_sha)
end

-- Tells subscribers of "<prefix>:events" that a target may be free, with the
-- target's key "<prefix>:{<ns>:<target>}" as the message. Best effort:
-- pcall, so a user without pub/sub permission still releases.
local function notify_free(key)
  local prefix = string.match(key, '^(.*):{')
  if prefix then redis.pcall('PUBLISH', prefix .. ':events', key) end
end

-- A write that changes nothing: a replayed request rewrites its cache entry's
-- expiry, so a durability WAIT after the replay (on any connection) also
-- covers the original write, which precedes it in the replication stream.
local function touch(key, field)
  local at = field_expiry(key, field)
  if at >= 0 then redis.call('HPEXPIREAT', key, at, 'FIELDS', 1, field) end
end

-- True when `field` (from ARGV) is a field of the kind `prefix` ("q:" for
-- the request cache, "c:" for commits), never the counter or the lease.
local function field_of(prefix, field)
  return string.sub(field, 1, #prefix) == prefix
end

local function fingerprint(...)
  return redis.sha1hex(table.concat({ ... }, '\0'))
end

-- The one replay rule, shared by every mutating script (MemoryStore::replay
-- in src/store/memory.rs is the same rule). `entry` is the request cache
-- field `field` as read (false when absent). Returns nil when the request id
-- is new; otherwise the reply to return, without any other write than touch:
--   unreadable entry -> corrupt_state; other inputs -> idempotency_conflict;
--   rule.done (release, revoke, commit): the original outcome again, final;
--   else revalidated: the live lease with the cached lease id AND token ->
--   rule.live with the lease and the caller's id; a corrupt record ->
--   corrupt_state; another live lease -> rule.superseded(now, r); no live
--   lease -> expired.
local function replay(key, field, entry, fp, now, state, r, why, rule)
  if not entry then return nil end
  local c_fp, c_token, c_outcome, c_id = string.match(entry, '^(%x+):(%d*):([%a_]*):(%x*)$')
  if not c_fp then return reply('corrupt_state', now, 'request cache entry is unreadable') end
  if c_fp ~= fp then
    return reply('idempotency_conflict', now, 'request id was used with different inputs')
  end
  if rule.done then
    local outcome = rule.done
    if c_outcome ~= '' then outcome = c_outcome end
    touch(key, field)
    return reply(outcome, now, rule.done_msg[outcome] or (outcome .. ' (replayed request)'))
  end
  if state == 'corrupt' then return reply('corrupt_state', now, why) end
  if state == 'live' and r.id_sha == c_id and r.token == c_token then
    touch(key, field)
    return reply_lease(rule.live, now, rule.live_msg, r, rule.id)
  end
  if state == 'live' then return rule.superseded(now, r) end
  return reply('expired', now, rule.ended)
end
