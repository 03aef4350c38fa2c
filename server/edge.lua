-- The edge's request checks (Envoy's Lua filter), run before a request can reach tritonserver 2.51.
--
-- 2.51 sizes buffers from a request's declared shape before it compares the shape with the data or the
-- model, so a 100-byte JSON request declaring [1,1,8,2147483648] made it allocate 64 GiB and die; a
-- deeply nested JSON body crashed its parser. Here an inference request is parsed first (the JSON
-- header of a binary request, or the whole JSON body) and refused with 400 unless every input:
--   * is declared by the model's config (name, datatype, rank, fixed dims, batch <= max_batch_size),
--     where the model is known to the edge (models loaded later are held to the rules below only);
--   * has a shape of whole numbers whose tensor fits max_tensor_bytes;
--   * carries as much data as its shape says: a JSON "data" array of N elements takes at least
--     2N - 1 bytes, binary data must be exactly binary_data_size bytes within the body.
-- JSON deeper than max_depth is refused without being parsed further. A model load that carries files
-- ("file:..." parameters: code the server would run) is refused with 403. The body's size is capped by
-- Envoy's buffer filter before this runs (413), which also turns a chunked body into one with a length.
-- CONFIG (models and limits) is prepended by server/edge.py.

local function fail(pos, why)
  error({pos = pos, why = why}, 0)
end

local function skip_space(text, pos)
  return text:find("[^ \t\r\n]", pos) or #text + 1
end

local function parse_string(text, pos)
  -- pos is at the opening quote; returns the string (escapes kept simple) and the position after it
  local out, start = {}, pos + 1
  while true do
    local stop = text:find('["\\]', start)
    if not stop then fail(pos, "unterminated string") end
    out[#out + 1] = text:sub(start, stop - 1)
    if text:sub(stop, stop) == '"' then return table.concat(out), stop + 1 end
    out[#out + 1] = text:sub(stop + 1, stop + 1)
    start = stop + 2
  end
end

local function skip_value(text, pos, depth)
  -- skips any JSON value without building it; returns the position after it
  local c = text:sub(pos, pos)
  if c == '"' then
    local _, after = parse_string(text, pos)
    return after
  end
  if c ~= "[" and c ~= "{" then
    local stop = text:find("[,%]} \t\r\n]", pos) or #text + 1
    if stop == pos then fail(pos, "a value was expected") end
    return stop
  end
  local level, at = 0, pos
  while true do
    at = text:find('[%[%]{}"]', at)
    if not at then fail(pos, "unterminated array or object") end
    local d = text:sub(at, at)
    if d == '"' then
      local _, after = parse_string(text, at)
      at = after
    else
      if d == "[" or d == "{" then
        level = level + 1
        if depth + level > CONFIG.max_depth then fail(at, "nested deeper than " .. CONFIG.max_depth .. " levels") end
      else
        level = level - 1
      end
      at = at + 1
      if level == 0 then return at end
    end
  end
end

local parse_value

local function parse_array(text, pos, depth)
  local out, at = {}, skip_space(text, pos + 1)
  if text:sub(at, at) == "]" then return out, at + 1 end
  while true do
    local value
    value, at = parse_value(text, at, depth)
    out[#out + 1] = value
    at = skip_space(text, at)
    local c = text:sub(at, at)
    if c == "]" then return out, at + 1 end
    if c ~= "," then fail(at, "',' or ']' expected") end
    at = skip_space(text, at + 1)
  end
end

local function parse_object(text, pos, depth)
  local out, at = {}, skip_space(text, pos + 1)
  if text:sub(at, at) == "}" then return out, at + 1 end
  while true do
    if text:sub(at, at) ~= '"' then fail(at, "a key was expected") end
    local key
    key, at = parse_string(text, at)
    at = skip_space(text, at)
    if text:sub(at, at) ~= ":" then fail(at, "':' expected") end
    at = skip_space(text, at + 1)
    if key == "data" then -- tensor data: measured, not built
      local stop = skip_value(text, at, depth)
      out.data_bytes, at = stop - at, stop
    else
      out[key], at = parse_value(text, at, depth)
    end
    at = skip_space(text, at)
    local c = text:sub(at, at)
    if c == "}" then return out, at + 1 end
    if c ~= "," then fail(at, "',' or '}' expected") end
    at = skip_space(text, at + 1)
  end
end

parse_value = function(text, pos, depth)
  if depth >= CONFIG.max_depth then fail(pos, "nested deeper than " .. CONFIG.max_depth .. " levels") end
  local c = text:sub(pos, pos)
  if c == "{" then return parse_object(text, pos, depth + 1) end
  if c == "[" then return parse_array(text, pos, depth + 1) end
  if c == '"' then return parse_string(text, pos) end
  local stop = skip_value(text, pos, depth)
  local word = text:sub(pos, stop - 1)
  if word == "true" then return true, stop end
  if word == "false" then return false, stop end
  if word == "null" then return nil, stop end
  local number = tonumber(word)
  if number == nil then fail(pos, "unexpected '" .. word:sub(1, 20) .. "'") end
  return number, stop
end

local function parse_json(text)
  local value, at = parse_value(text, skip_space(text, 1), 0)
  if skip_space(text, at) <= #text then fail(at, "text after the JSON value") end
  return value
end

local SIZES = {BOOL = 1, INT8 = 1, UINT8 = 1, INT16 = 2, UINT16 = 2, FP16 = 2, BF16 = 2, INT32 = 4, UINT32 = 4,
               FP32 = 4, INT64 = 8, UINT64 = 8, FP64 = 8, BYTES = 4}

local function shape_of(input)
  local shape, elements = input.shape, 1
  if type(shape) ~= "table" then return nil, "has no shape" end
  for i = 1, #shape do
    local d = shape[i]
    if type(d) ~= "number" or d < 0 or d ~= math.floor(d) or d >= 2147483648 then
      return nil, "has shape dimension " .. tostring(d) .. ": dimensions are whole numbers in [0, 2^31)"
    end
    elements = elements * d
  end
  return elements
end

local function dims_text(dims)
  local parts = {}
  for i = 1, #dims do parts[i] = tostring(dims[i]) end
  return "[" .. table.concat(parts, ",") .. "]"
end

local function check_against_config(model, input)
  local known = CONFIG.models[model]
  if not known then return nil end
  local want = known.inputs[input.name]
  if not want then return "is not an input of " .. model end
  if input.datatype ~= want.datatype then
    return "has datatype " .. tostring(input.datatype) .. ", the model takes " .. want.datatype
  end
  local shape, dims, first = input.shape, want.dims, 0
  if known.max_batch_size > 0 then
    first = 1
    if #shape ~= #dims + 1 then return "has shape " .. dims_text(shape) .. ", the model takes [batch]+" .. dims_text(dims) end
    if shape[1] < 1 or shape[1] > known.max_batch_size then
      return "has batch " .. shape[1] .. ", the model takes 1.." .. known.max_batch_size
    end
  elseif #shape ~= #dims then
    return "has shape " .. dims_text(shape) .. ", the model takes " .. dims_text(dims)
  end
  for i = 1, #dims do
    if dims[i] ~= -1 and shape[i + first] ~= dims[i] then
      return "has shape " .. dims_text(shape) .. ", the model takes " .. (first == 1 and "[batch]+" or "") .. dims_text(dims)
    end
  end
  return nil
end

local function check_input(model, input, binary_bytes)
  if type(input) ~= "table" or type(input.name) ~= "string" then return "an input has no name" end
  local label = "input '" .. input.name .. "' "
  local elements, why = shape_of(input)
  if not elements then return label .. why end
  why = check_against_config(model, input)
  if why then return label .. why end
  local size = SIZES[input.datatype]
  if not size then return label .. "has unknown datatype " .. tostring(input.datatype) end
  if elements * size > CONFIG.max_tensor_bytes then
    return label .. "declares " .. elements .. " elements of " .. input.datatype .. ": over the limit of " ..
      CONFIG.max_tensor_bytes .. " bytes per tensor"
  end
  local params = type(input.parameters) == "table" and input.parameters or {}
  if input.data_bytes then
    if elements > (input.data_bytes + 1) / 2 then
      return label .. "declares " .. elements .. " elements but its data holds at most " ..
        math.floor((input.data_bytes + 1) / 2)
    end
  elseif params.binary_data_size ~= nil then
    local n = params.binary_data_size
    if type(n) ~= "number" or n < 0 or n > binary_bytes then
      return label .. "has binary_data_size " .. tostring(n) .. " beyond the " .. binary_bytes .. " bytes sent"
    end
    if input.datatype ~= "BYTES" and n ~= elements * size then
      return label .. "declares " .. elements * size .. " bytes of " .. input.datatype .. " but sends " .. n
    end
  elseif params.shared_memory_region == nil then
    return label .. "has no data, binary_data_size or shared_memory_region"
  end
  return nil
end

local function refuse(handle, status, why)
  local body = '{"error":"' .. why:gsub('[%c"\\]', " ") .. '"}'
  handle:respond({[":status"] = tostring(status), ["content-type"] = "application/json"}, body)
end

local function body_text(handle)
  local body = handle:body()
  if body == nil then return "" end
  return body:getBytes(0, body:length())
end

local function check_infer(handle, model)
  local text = body_text(handle)
  local header_length = handle:headers():get("inference-header-content-length")
  local json, binary_bytes = text, 0
  if header_length then
    local n = tonumber(header_length)
    if not n or n < 0 or n > #text then return 400, "Inference-Header-Content-Length " .. header_length .. " is beyond the body" end
    json, binary_bytes = text:sub(1, n), #text - n
  end
  local ok, request = pcall(parse_json, json)
  if not ok then
    local where = type(request) == "table" and (request.why .. " at byte " .. request.pos) or tostring(request)
    return 400, "the request is not valid JSON: " .. where
  end
  if type(request) ~= "table" or type(request.inputs) ~= "table" or #request.inputs == 0 then
    return 400, "the request has no inputs"
  end
  for _, input in ipairs(request.inputs) do
    local why = check_input(model, input, binary_bytes)
    if why then return 400, why .. " (refused at the edge, before the server)" end
  end
  return nil
end

local function check_load(handle)
  local ok, request = pcall(parse_json, body_text(handle))
  if not ok then return 400, "the load request is not valid JSON" end
  local params = type(request) == "table" and type(request.parameters) == "table" and request.parameters or {}
  for key, _ in pairs(params) do
    if type(key) == "string" and key:sub(1, 5) == "file:" then
      return 403, "a load cannot carry files (" .. key .. "): put the model in the repository and load it by name"
    end
  end
  return nil
end

function envoy_on_request(handle)
  local headers = handle:headers()
  if headers:get(":method") ~= "POST" then return end
  local path = (headers:get(":path") or ""):gsub("%?.*$", "")
  local model = path:match("^/v2/models/([^/]+)/infer$") or path:match("^/v2/models/([^/]+)/versions/[^/]+/infer$")
  local status, why
  if model then
    status, why = check_infer(handle, model)
  elseif path:match("^/v2/repository/models/[^/]+/load$") then
    status, why = check_load(handle)
  end
  if status then refuse(handle, status, why) end
end
