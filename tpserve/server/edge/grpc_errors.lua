-- The gRPC listener's answers on the SystemSharedMemoryRegister route (server/edge/envoy_config.py): a registration
-- of the server's own memory, which server/triton/front/wrappers.c refuses inside tritonserver, says why, instead of
-- tritonserver's "Unable to open shared memory region" (INTERNAL). Only Triton's answer is read.
local RESERVED = "triton_python_backend"
local WHY = "refused: shared-memory names beginning '" .. RESERVED .. "' are the server's own memory " ..
  "(the Python backend's); register a region your client created"

local function clearer(status, message)
  if status == nil or status == "0" or message == nil then return nil end
  if message:find("Unable to open shared memory region", 1, true) and message:find(RESERVED, 1, true) then
    return "7" -- PERMISSION_DENIED
  end
  return nil
end

local function rewrite(map)
  local status = clearer(map:get("grpc-status"), map:get("grpc-message"))
  if status == nil then return false end
  map:replace("grpc-status", status)
  map:replace("grpc-message", WHY)
  return true
end

function envoy_on_response(handle)
  if rewrite(handle:headers()) then return end -- a trailers-only answer
  local trailers = handle:trailers()
  if trailers ~= nil then rewrite(trailers) end
end
