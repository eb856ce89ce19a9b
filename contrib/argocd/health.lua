-- Argo CD health check for targetlease.dev/TargetLease.
--
-- Install it as the argocd-cm key
--   resource.customizations.health.targetlease.dev_TargetLease
-- (docs/install.md, "GitOps"). Tested in CI with gopher-lua, the engine Argo
-- CD runs it in, with Argo CD's own restrictions: custom checks get only the
-- base and table libraries (no string library), and numbers are doubles, so
-- a fencing token above 2^53 is never printed from status.fencingToken: the
-- Held condition's message carries it as text.
--
--   BackendAvailable=False          Degraded, whatever the phase
--   no status / no phase yet        Progressing
--   status older than the spec      Progressing
--   Held                            Healthy (Degraded if Held=Unknown)
--   Pending, Released               Progressing (a queued lease works as intended)
--   Lost, Error, Unknown, other     Degraded
-- Every message says why, and is never empty.

local hs = {}
local st = obj.status

local function find(type_)
  if st == nil or st.conditions == nil then
    return nil
  end
  for _, c in ipairs(st.conditions) do
    if c.type == type_ then
      return c
    end
  end
  return nil
end

-- "<what>: <reason>: <message>", leaving out what is missing.
local function explain(what, c)
  local text = what
  if c ~= nil and c.reason ~= nil and c.reason ~= "" then
    text = text .. ": " .. c.reason
  end
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    text = text .. ": " .. c.message
  end
  return text
end

local held = find("Held")
local backend = find("BackendAvailable")
local spec = find("SpecValid")
local phase = nil
if st ~= nil then
  phase = st.phase
end

if backend ~= nil and backend.status == "False" then
  hs.status = "Degraded"
  hs.message = explain("Valkey is unavailable (phase " .. tostring(phase or "none") .. ")", backend)
  return hs
end

if phase == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the targetlease operator to publish a status"
  return hs
end

local generation = obj.metadata and obj.metadata.generation
if st.observedGeneration ~= nil and generation ~= nil and st.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the targetlease operator to observe generation " .. tostring(generation)
  return hs
end

if phase == "Held" then
  if held ~= nil and held.status == "Unknown" then
    hs.status = "Degraded"
    hs.message = explain("Held, unconfirmed", held)
  else
    hs.status = "Healthy"
    if held ~= nil and held.message ~= nil and held.message ~= "" then
      hs.message = "Held: " .. held.message
    else
      hs.message = "Held by " .. tostring(st.holder or "an unnamed holder")
    end
  end
elseif phase == "Pending" or phase == "Released" then
  hs.status = "Progressing"
  hs.message = explain(phase, held)
else
  hs.status = "Degraded"
  if spec ~= nil and spec.status == "False" then
    hs.message = explain(tostring(phase), spec)
  else
    hs.message = explain(tostring(phase), held)
  end
end
return hs
