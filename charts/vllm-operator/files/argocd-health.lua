-- Argo CD health check for vllm-operator.io/VLLMServer
-- (argocd-cm key: resource.customizations.health.vllm-operator.io_VLLMServer).
-- Lua 5.1, as Argo CD runs it. It reads only the status the operator writes:
-- observedGeneration and the conditions SpecValid, Degraded, Ready and Progressing.
local hs = {}

local function condition(conditionType)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == conditionType then
      return c
    end
  end
  return nil
end

local function message(c, fallback)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  return fallback
end

if obj.status == nil or obj.status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to report status"
  return hs
end

-- A status written for an older spec says nothing about the current one.
local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. generation
  return hs
end

local specValid = condition("SpecValid")
if specValid ~= nil and specValid.status == "False" then
  hs.status = "Degraded"
  -- the reason names the cause (InvalidSpec, DoesNotFit, ModelUnknown, GPUUnknown, ...), as kubectl get shows it
  local reason = specValid.reason
  if reason == nil or reason == "" then
    reason = "InvalidSpec"
  end
  hs.message = "Invalid spec (" .. reason .. "): " .. message(specValid, "see the SpecValid condition")
  return hs
end

local degraded = condition("Degraded")
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = message(degraded, "Degraded")
  return hs
end

local ready = condition("Ready")
local progressing = condition("Progressing")
if ready ~= nil and ready.status == "True" then
  if progressing ~= nil and progressing.status == "True" then
    hs.status = "Progressing"
    hs.message = message(progressing, "Rolling out")
  elseif ready.reason == "ScaledToZero" and obj.spec ~= nil and obj.spec.autoscaling ~= nil
      and obj.spec.autoscaling.enabled and obj.spec.autoscaling.minReplicas == 0 then
    -- idle on purpose (autoscaling.minReplicas 0): serving, the next request wakes a replica
    hs.status = "Healthy"
    hs.message = message(ready, "Idle: scaled to zero")
  elseif ready.reason == "ScaledToZero" and (obj.spec == nil or obj.spec.workload ~= "DaemonSet") then
    -- replicas: 0 on purpose (a DaemonSet with no GPU node to run on is not suspended)
    hs.status = "Suspended"
    hs.message = message(ready, "Scaled to zero replicas")
  else
    hs.status = "Healthy"
    hs.message = message(ready, "Ready")
  end
  return hs
end

-- Not ready yet and nothing failing: models take minutes to load.
hs.status = "Progressing"
hs.message = message(ready, message(progressing, "Waiting for replicas to become ready"))
return hs
