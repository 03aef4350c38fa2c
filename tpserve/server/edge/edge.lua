-- The edge's request checks (Envoy's Lua filter), run before a request can reach tritonserver 2.51.
--
-- Why: 2.51 sizes buffers from a request's declared shape before it compares the shape with the data or
-- the model (a 100-byte request declaring [1,1,8,2147483648] made it allocate 64 GiB and die), its JSON
-- parser recurses without a limit (200,000 '[' crashed it) and its HTTP parse is quadratic in the number
-- of parameters. So every request is held to three rules here:
--
-- 1. Only the paths this file knows reach Triton (ROUTES below: health, metadata, config, statistics,
--    inference, the admin APIs); everything else is refused (404/405). generate and generate_stream are
--    not served through the edge.
-- 2. Every JSON body is read strictly, so that the reading here is the reading Triton makes (rapidjson):
--    RFC 8259 grammar, no duplicate keys, no escape sequences in keys, escapes in string values decoded
--    exactly (no lone surrogates, no control characters), numbers that this file interprets (shapes,
--    sizes) written as plain whole numbers, NaN/Infinity only inside tensor data, nesting, keys per object
--    and items per array bounded. A body two JSON parsers could read differently is refused, not guessed.
-- 3. An inference request must be one Triton can serve without harm: every input declared by the model
--    (name, datatype, rank, fixed dims, batch <= max_batch_size) where the model is known to the edge, a
--    shape whose tensor fits max_tensor_bytes, and data of exactly the size the shape says (JSON data is
--    counted element by element; binary data is exactly binary_data_size bytes, all within the body).
--    A model load may not carry files ("file:" parameters: code) and its config override may not point
--    outside the model's folder.
--
-- Content-Encoding other than identity is refused with 415 (Triton would inflate the body after these
-- checks). Envoy itself caps the body (buffer filter, 413) and the headers (431) before this runs.
-- CONFIG (models and limits) is appended by server/edge/request_checks.py.

local KIND = {} -- key of the marker telling objects from arrays in parsed values
local DATA = {} -- key under which an object holds the element count of its "data" array
local DATA_KINDS = {} -- and what its elements are besides numbers (string, boolean, null: true where seen)

local function fail(pos, why)
  error({pos = pos, why = why}, 0)
end

local function skip_space(text, pos)
  return text:find("[^ \t\r\n]", pos) or #text + 1
end

local ESCAPES = {['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n", r = "\r", t = "\t"}

local function utf8_char(code)
  if code < 0x80 then return string.char(code) end
  if code < 0x800 then return string.char(0xC0 + math.floor(code / 64), 0x80 + code % 64) end
  if code < 0x10000 then
    return string.char(0xE0 + math.floor(code / 4096), 0x80 + math.floor(code / 64) % 64, 0x80 + code % 64)
  end
  return string.char(0xF0 + math.floor(code / 262144), 0x80 + math.floor(code / 4096) % 64,
    0x80 + math.floor(code / 64) % 64, 0x80 + code % 64)
end

local function hex4(text, pos)
  local digits = text:sub(pos, pos + 3)
  if not digits:match("^%x%x%x%x$") then fail(pos, "\\u needs 4 hex digits") end
  return tonumber(digits, 16)
end

local function unicode_escape(text, pos, strict)
  -- pos is at the 'u' of \uXXXX; returns the character and the position after the escape
  local code = hex4(text, pos + 1)
  local after = pos + 5
  if code >= 0xDC00 and code <= 0xDFFF then fail(pos, "a lone low surrogate \\u escape") end
  if code >= 0xD800 and code <= 0xDBFF then
    if text:sub(after, after + 1) ~= "\\u" then fail(pos, "a high surrogate \\u escape without its pair") end
    local low = hex4(text, after + 2)
    if low < 0xDC00 or low > 0xDFFF then fail(pos, "a high surrogate \\u escape without its pair") end
    code, after = 0x10000 + (code - 0xD800) * 1024 + (low - 0xDC00), after + 6
  end
  if strict and code < 0x20 then fail(pos, "an escaped control character outside tensor data") end
  return utf8_char(code), after
end

local function parse_string(text, pos, mode)
  -- pos is at the opening quote. mode "key": no escapes at all; "value": escapes decoded, no control
  -- characters; "data": escapes checked, not kept. Returns the string and the position after it.
  local out, start = {}, pos + 1
  while true do
    local stop = text:find('[%z\1-\31"\\]', start)
    if not stop then fail(pos, "unterminated string") end
    local c = text:sub(stop, stop)
    if c ~= '"' and c ~= "\\" then fail(stop, "a control character inside a string") end
    if mode ~= "data" then out[#out + 1] = text:sub(start, stop - 1) end
    if c == '"' then return table.concat(out), stop + 1 end
    if mode == "key" then fail(stop, "an escape sequence in a key (write keys plainly)") end
    local e = text:sub(stop + 1, stop + 1)
    if e == "u" then
      local char
      char, start = unicode_escape(text, stop + 1, mode == "value")
      out[#out + 1] = char
    elseif ESCAPES[e] then
      if mode == "value" and e ~= '"' and e ~= "\\" and e ~= "/" then
        fail(stop, "an escaped control character outside tensor data")
      end
      out[#out + 1], start = ESCAPES[e], stop + 2
    else
      fail(stop, "an invalid escape sequence")
    end
  end
end

local function number_end(text, pos)
  -- RFC 8259 number at pos that a double holds (rapidjson refuses 1e400): the position after it, or nil
  local s, e = text:find("^-?%d+", pos)
  if not s then return nil end
  local first = text:byte(pos) == 45 and pos + 1 or pos
  if text:byte(first) == 48 and e > first then return nil end -- leading zero
  local _, f = text:find("^%.%d+", e + 1)
  if f then e = f elseif text:byte(e + 1) == 46 then return nil end
  local _, x = text:find("^[eE][-+]?%d+", e + 1)
  if x then e = x elseif text:find("^[eE]", e + 1) then return nil end
  if (x or e - pos > 300) and math.abs(tonumber(text:sub(pos, e)) or math.huge) == math.huge then return nil end
  return e + 1
end

local LITERALS = {t = "true", f = "false", n = "null"}
local DATA_WORDS = {"NaN", "Infinity", "-Infinity"} -- Triton reads these in tensor data (kParseNanAndInfFlag)

local function scalar_end(text, pos, in_data)
  -- a number or literal at pos (strings are handled by the caller): its end, or a failure
  local literal = LITERALS[text:sub(pos, pos)]
  if literal and text:sub(pos, pos + #literal - 1) == literal then return pos + #literal end
  local stop = number_end(text, pos)
  if stop then return stop end
  if in_data then
    for _, word in ipairs(DATA_WORDS) do
      if text:sub(pos, pos + #word - 1) == word then return pos + #word end
    end
  end
  fail(pos, "unexpected '" .. text:sub(pos, pos + 19) .. "'")
end

local function check_after(text, at, closer)
  local c = text:sub(at, at)
  if c ~= "," and c ~= closer then fail(at, "',' or '" .. closer .. "' expected") end
  return c
end

local function scan_data(text, pos, depth)
  -- tensor data: an array of scalars or of nested arrays, checked and counted, never built.
  -- Returns the number of scalars and the position after the array.
  local count, level, at, kinds = 0, 0, pos, {}
  while true do
    local c = text:sub(at, at)
    if c == "[" then
      level = level + 1
      if depth + level > CONFIG.max_depth then fail(at, "nested deeper than " .. CONFIG.max_depth .. " levels") end
      at = skip_space(text, at + 1)
      if text:sub(at, at) == "]" then
        c = "]"
      else
        goto continue
      end
    elseif c == '"' then
      local _
      _, at = parse_string(text, at, "data")
      count = count + 1
      kinds.string = true
    else
      local first = text:sub(at, at)
      at = scalar_end(text, at, true)
      count = count + 1
      if first == "t" or first == "f" then kinds.boolean = true end
      if first == "n" then kinds.null = true end
    end
    -- after a value (or an empty array's '[' when c == "]"): ',' or ']'
    while true do
      if c ~= "]" then
        at = skip_space(text, at)
        c = check_after(text, at, "]")
      end
      if c == "," then
        at = skip_space(text, at + 1)
        break
      end
      level = level - 1 -- c == "]"
      at = at + 1
      if level == 0 then return count, at, kinds end
      c = nil
    end
    ::continue::
  end
end

local parse_value
local json_null = setmetatable({}, {__tostring = function() return "null" end}) -- a null kept in an object

local function parse_array(text, pos, depth)
  local out, at = {[KIND] = "array"}, skip_space(text, pos + 1)
  if text:sub(at, at) == "]" then return out, at + 1 end
  while true do
    if #out >= CONFIG.max_items then fail(at, "an array of more than " .. CONFIG.max_items .. " items") end
    local value
    value, at = parse_value(text, at, depth)
    out[#out + 1] = value == nil and json_null or value
    at = skip_space(text, at)
    if check_after(text, at, "]") == "]" then return out, at + 1 end
    at = skip_space(text, at + 1)
  end
end

local function parse_object(text, pos, depth)
  local out, keys, at = {[KIND] = "object"}, 0, skip_space(text, pos + 1)
  if text:sub(at, at) == "}" then return out, at + 1 end
  while true do
    if text:sub(at, at) ~= '"' then fail(at, "a key was expected") end
    local key
    key, at = parse_string(text, at, "key")
    if out[key] ~= nil or (key == "data" and out[DATA] ~= nil) then fail(at, "the key '" .. key .. "' appears twice") end
    keys = keys + 1
    if keys > CONFIG.max_keys then fail(at, "an object of more than " .. CONFIG.max_keys .. " keys") end
    at = skip_space(text, at)
    if text:sub(at, at) ~= ":" then fail(at, "':' expected") end
    at = skip_space(text, at + 1)
    if key == "data" and text:sub(at, at) == "[" then -- tensor data: counted, not built
      out[DATA], at, out[DATA_KINDS] = scan_data(text, at, depth)
    else
      local value
      value, at = parse_value(text, at, depth)
      out[key] = value == nil and json_null or value
    end
    at = skip_space(text, at)
    if check_after(text, at, "}") == "}" then return out, at + 1 end
    at = skip_space(text, at + 1)
  end
end

parse_value = function(text, pos, depth)
  if depth >= CONFIG.max_depth then fail(pos, "nested deeper than " .. CONFIG.max_depth .. " levels") end
  local c = text:sub(pos, pos)
  if c == "{" then return parse_object(text, pos, depth + 1) end
  if c == "[" then return parse_array(text, pos, depth + 1) end
  if c == '"' then return parse_string(text, pos, "value") end
  if c == "" then fail(pos, "a value was expected") end
  local stop = scalar_end(text, pos, false)
  local word = text:sub(pos, stop - 1)
  if word == "true" then return true, stop end
  if word == "false" then return false, stop end
  if word == "null" then return nil, stop end
  return {[KIND] = "number", text = word, value = tonumber(word)}, stop
end

function parse_json(text)
  local value, at = parse_value(text, skip_space(text, 1), 0)
  if skip_space(text, at) <= #text then fail(at, "text after the JSON value") end
  return value
end

local function kind(value)
  if type(value) == "table" then return value[KIND] end
  return type(value)
end

-- Whole numbers as this file reads them: plain digits, no sign, fraction or exponent (rapidjson reads
-- 1e2 or 8.0 as a double, which Triton refuses for sizes), at most 15 digits (exact in Lua's doubles).
local function whole(value)
  if kind(value) ~= "number" or not value.text:match("^%d+$") or #value.text > 15 then return nil end
  if #value.text > 1 and value.text:sub(1, 1) == "0" then return nil end
  return value.value
end

local SIZES = {BOOL = 1, INT8 = 1, UINT8 = 1, INT16 = 2, UINT16 = 2, FP16 = 2, BF16 = 2, INT32 = 4, UINT32 = 4,
               FP32 = 4, INT64 = 8, UINT64 = 8, FP64 = 8, BYTES = 4}
local INPUT_KEYS = {name = true, shape = true, datatype = true, parameters = true, data = true}
local OUTPUT_KEYS = {name = true, parameters = true}
local REQUEST_KEYS = {id = true, parameters = true, inputs = true, outputs = true}

local function unknown_key(object, allowed)
  for key, _ in pairs(object) do
    if type(key) == "string" and not allowed[key] then return key end
  end
  return nil
end

local function dims_text(dims)
  local parts = {}
  for i = 1, #dims do parts[i] = tostring(dims[i]) end
  return "[" .. table.concat(parts, ",") .. "]"
end

local function shape_of(input)
  if kind(input.shape) ~= "array" or #input.shape == 0 then return nil, "has no shape (an array of dimensions)" end
  local shape, elements = {}, 1
  for i = 1, #input.shape do
    local d = whole(input.shape[i])
    if d == nil or d >= 2147483648 then
      local shown = kind(input.shape[i]) == "number" and input.shape[i].text or tostring(input.shape[i])
      return nil, "has shape dimension " .. shown .. ": dimensions are whole numbers in [0, 2^31), written plainly"
    end
    shape[i], elements = d, elements * d
  end
  return shape, elements
end

local function check_against_config(model, name, datatype, shape)
  local known = CONFIG.models[model]
  if not known then return nil end
  local want = known.inputs[name]
  if not want then return "is not an input of " .. model end
  if datatype ~= want.datatype then return "has datatype " .. datatype .. ", the model takes " .. want.datatype end
  local dims, first = want.dims, 0
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

-- request: the request's own parameters (not a tensor's), where the call id's name (any case) is the server's own:
-- tritonserver hands them and the forwarded x-edge-call header to the model as one set.
local function check_parameters(params, label, request)
  if params == nil then return {} end
  if kind(params) ~= "object" then return nil, label .. "has parameters that are not an object" end
  for key, value in pairs(params) do
    local k = kind(value)
    if type(key) == "string" and k ~= "string" and k ~= "number" and k ~= "boolean" then
      return nil, label .. "has parameter '" .. key .. "' that is not a string, number or boolean"
    end
    if request and type(key) == "string" and key:lower() == "x-edge-call" then
      return nil, label .. "has parameter '" .. key .. "': the server's own (each call's id): leave it out"
    end
  end
  return params
end

local function data_source(input, params, label, elements, size, binary)
  -- Triton takes binary data first, then shared memory, then JSON data: so does this.
  if params.binary_data_size ~= nil then
    local n = whole(params.binary_data_size)
    if n == nil then return nil, label .. "has a binary_data_size that is not a plain whole number" end
    if n > binary.left then
      return nil, label .. "has binary_data_size " .. n .. " beyond the " .. binary.left .. " bytes left in the body"
    end
    if input.datatype ~= "BYTES" and n ~= elements * size then
      return nil, label .. "declares " .. elements * size .. " bytes of " .. input.datatype .. " but sends " .. n
    end
    binary.left = binary.left - n
    return "binary " .. n
  end
  if params.shared_memory_region ~= nil then
    if kind(params.shared_memory_region) ~= "string" then return nil, label .. "names a shared memory region that is not a string" end
    for _, key in ipairs({"shared_memory_byte_size", "shared_memory_offset"}) do
      if params[key] ~= nil and whole(params[key]) == nil then return nil, label .. "has a " .. key .. " that is not a plain whole number" end
    end
    return "shm " .. params.shared_memory_region
  end
  local count = input[DATA]
  if count == nil then return nil, label .. "has no data (an array), binary_data_size or shared_memory_region" end
  if count ~= elements then return nil, label .. "declares " .. elements .. " elements but its data holds " .. count end
  -- tritonserver reads a numeric tensor's elements as numbers: a string, null or boolean among them was a 500
  local kinds, dtype = input[DATA_KINDS] or {}, input.datatype
  local odd = nil
  if dtype ~= "BYTES" then
    if kinds.string then odd = "a string" elseif kinds.null then odd = "null"
    elseif kinds.boolean and dtype ~= "BOOL" then odd = "true or false" end
  end
  if odd then
    local want = dtype == "BOOL" and "true or false" or "numbers"
    return nil, label .. "has " .. odd .. " in its " .. dtype .. " data: give " .. want .. " (NaN and Infinity unquoted)"
  end
  return "json " .. count
end

local function check_input(model, input, binary)
  if kind(input) ~= "object" or kind(input.name) ~= "string" or input.name == "" then return nil, "an input has no name" end
  local label = "input '" .. input.name .. "' "
  local extra = unknown_key(input, INPUT_KEYS)
  if extra then return nil, label .. "has an unknown key '" .. extra .. "'" end
  if kind(input.datatype) ~= "string" or not SIZES[input.datatype] then
    return nil, label .. "has unknown datatype " .. tostring(input.datatype)
  end
  local shape, elements = shape_of(input)
  if not shape then return nil, label .. elements end
  local why = check_against_config(model, input.name, input.datatype, shape)
  if why then return nil, label .. why end
  local size = SIZES[input.datatype]
  if elements * size > CONFIG.max_tensor_bytes then
    return nil, label .. "declares " .. elements .. " elements of " .. input.datatype .. ": over the limit of " ..
      CONFIG.max_tensor_bytes .. " bytes per tensor"
  end
  local params
  params, why = check_parameters(input.parameters, label)
  if not params then return nil, why end
  local source
  source, why = data_source(input, params, label, elements, size, binary)
  if not source then return nil, why end
  return input.name .. ":" .. input.datatype .. ":" .. dims_text(shape) .. ":" .. source
end

local function check_outputs(outputs)
  if outputs == nil then return nil end
  if kind(outputs) ~= "array" then return "'outputs' is not an array" end
  for _, output in ipairs(outputs) do
    if kind(output) ~= "object" or kind(output.name) ~= "string" then return "an output has no name" end
    local extra = unknown_key(output, OUTPUT_KEYS)
    if extra then return "output '" .. output.name .. "' has an unknown key '" .. extra .. "'" end
    local _, why = check_parameters(output.parameters, "output '" .. output.name .. "' ")
    if why then return why end
  end
  return nil
end

local function header_value(handle, name)
  -- the single value of a header, or nil; a repeated header is refused (two readers could pick different ones)
  local headers = handle:headers()
  local count = headers:getNumValues(name)
  if count == 0 then return nil end
  if count > 1 then fail(0, "the header " .. name .. " appears " .. count .. " times") end
  return headers:get(name)
end

local function body_text(handle)
  local body = handle:body()
  if body == nil then return "" end
  return body:getBytes(0, body:length())
end

local function read_json(text, what)
  local ok, value = pcall(parse_json, text)
  if ok then return value end
  local where = type(value) == "table" and (value.why .. " at byte " .. value.pos) or tostring(value)
  fail(0, what .. " is not JSON the edge accepts: " .. where)
end

local function check_infer(handle, model)
  local text = body_text(handle)
  local header_length = header_value(handle, "inference-header-content-length")
  local json, binary = text, {left = 0}
  if header_length then
    if not header_length:match("^%d+$") or #header_length > 9 or (#header_length > 1 and header_length:sub(1, 1) == "0") then
      return 400, "Inference-Header-Content-Length '" .. header_length:sub(1, 20) .. "' is not a plain whole number"
    end
    local n = tonumber(header_length)
    if n > #text then return 400, "Inference-Header-Content-Length " .. n .. " is beyond the body's " .. #text .. " bytes" end
    json, binary.left = text:sub(1, n), #text - n
  end
  local request = read_json(json, "the request")
  if kind(request) ~= "object" or kind(request.inputs) ~= "array" or #request.inputs == 0 then
    return 400, "the request has no inputs"
  end
  local extra = unknown_key(request, REQUEST_KEYS)
  if extra then return 400, "the request has an unknown key '" .. extra .. "'" end
  local _, why = check_parameters(request.parameters, "the request ", true)
  why = why or check_outputs(request.outputs)
  if why then return 400, why end
  local reading = {}
  for i, input in ipairs(request.inputs) do
    reading[i], why = check_input(model, input, binary)
    if not reading[i] then return 400, why .. " (refused at the edge, before the server)" end
  end
  if CONFIG.echo_reading then handle:streamInfo():dynamicMetadata():set("edge", "read", table.concat(reading, ";")) end
  if CONFIG.record then
    local recorded = {}
    for i, input in ipairs(request.inputs) do recorded[i] = {input.name, input.datatype, (shape_of(input))} end
    record_inputs(handle, model, recorded, text, header_length and tonumber(header_length))
  end
  return nil
end

local function outside_folder(name)
  return name:find("/", 1, true) or name:find("\\", 1, true) or name == "." or name == ".." or name:find("%z")
end

local function check_override(config_text)
  -- a load's config override: read as Triton reads it (JSON), and kept inside the model's folder
  local config = read_json(config_text, "the config override")
  if kind(config) ~= "object" then return 400, "the config override is not a JSON object" end
  local filename = config.default_model_filename
  if filename ~= nil and (kind(filename) ~= "string" or outside_folder(filename)) then
    return 403, "default_model_filename must name a file inside the model's version folder (no '/', '..')"
  end
  for _, key in ipairs(CONFIG.refused_override_keys) do
    if config[key] ~= nil then return 403, "a config override cannot set '" .. key .. "': change the repository instead" end
  end
  return nil
end

local function check_load(handle)
  local text = body_text(handle)
  if text:find("[^ \t\r\n]") == nil then return nil end
  local request = read_json(text, "the load request")
  if kind(request) ~= "object" then return 400, "the load request is not a JSON object" end
  local params = request.parameters
  if params == nil then return nil end
  if kind(params) ~= "object" then return 400, "the load request's parameters are not an object" end
  for key, _ in pairs(params) do -- files first, whatever the order pairs() walks in
    if type(key) == "string" and key:sub(1, 5) == "file:" then
      return 403, "a load cannot carry files (" .. key .. "): put the model in the repository and load it by name"
    end
  end
  if params.config == nil then return nil end
  if kind(params.config) ~= "string" then return 400, "the config override is not a string" end
  return check_override(params.config)
end

local RESERVED_REGIONS = "triton_python_backend" -- the Python backend's IPC regions (server/triton/front/wrappers.c)

local function check_shm_register(handle)
  -- a system shared-memory region is the client's own: never one the server created for itself
  local text = body_text(handle)
  if text:find("[^ \t\r\n]") == nil then return nil end
  local request = read_json(text, "the registration")
  local key = kind(request) == "object" and request.key or nil
  if kind(key) == "string" and key:gsub("^/+", ""):sub(1, #RESERVED_REGIONS) == RESERVED_REGIONS then
    return 403, "shared-memory names beginning '" .. RESERVED_REGIONS .. "' are the server's own memory " ..
      "(the Python backend's); register a region your client created"
  end
  return nil
end

local function check_body(handle)
  -- any other POST: its JSON body (if any) must be one the edge accepts
  local text = body_text(handle)
  if text:find("[^ \t\r\n]") ~= nil then read_json(text, "the body") end
  return nil
end

-- The paths Triton serves that reach it through the edge: {methods, Lua pattern, check of the body}.
-- NAME excludes '/', '%' and names made of dots only (checked below); versions are digits.
local N, V = "([%w_%.%-]+)", "[0-9]+"
local ROUTES = {
  {"GET", "^/v2$"}, {"GET", "^/v2/health/live$"}, {"GET", "^/v2/health/ready$"},
  {"GET", "^/v2/models/stats$"},
  {"GET", "^/v2/models/" .. N .. "$"}, {"GET", "^/v2/models/" .. N .. "/versions/" .. V .. "$"},
  {"GET", "^/v2/models/" .. N .. "/ready$"}, {"GET", "^/v2/models/" .. N .. "/versions/" .. V .. "/ready$"},
  {"GET", "^/v2/models/" .. N .. "/config$"}, {"GET", "^/v2/models/" .. N .. "/versions/" .. V .. "/config$"},
  {"GET", "^/v2/models/" .. N .. "/stats$"}, {"GET", "^/v2/models/" .. N .. "/versions/" .. V .. "/stats$"},
  {"POST", "^/v2/models/" .. N .. "/infer$", check_infer},
  {"POST", "^/v2/models/" .. N .. "/versions/" .. V .. "/infer$", check_infer},
  {"POST", "^/v2/repository/index$", check_body},
  {"POST", "^/v2/repository/models/" .. N .. "/load$", check_load},
  {"POST", "^/v2/repository/models/" .. N .. "/unload$", check_body},
  {"GET", "^/v2/systemsharedmemory/status$"}, {"GET", "^/v2/systemsharedmemory/region/" .. N .. "/status$"},
  {"POST", "^/v2/systemsharedmemory/region/" .. N .. "/register$", check_shm_register},
  {"POST", "^/v2/systemsharedmemory/region/" .. N .. "/unregister$", check_body},
  {"POST", "^/v2/systemsharedmemory/unregister$", check_body},
  {"GET", "^/v2/cudasharedmemory/status$"}, {"GET", "^/v2/cudasharedmemory/region/" .. N .. "/status$"},
  {"POST", "^/v2/cudasharedmemory/region/" .. N .. "/register$", check_body},
  {"POST", "^/v2/cudasharedmemory/region/" .. N .. "/unregister$", check_body},
  {"POST", "^/v2/cudasharedmemory/unregister$", check_body},
  {"GET", "^/v2/trace/setting$"}, {"POST", "^/v2/trace/setting$", check_body},
  {"GET", "^/v2/models/" .. N .. "/trace/setting$"}, {"POST", "^/v2/models/" .. N .. "/trace/setting$", check_body},
  {"GET", "^/v2/logging$"}, {"POST", "^/v2/logging$", check_body},
}

local function route_of(method, path)
  -- the route and the name in the path (model or region), or nil and the status to refuse with
  local known_path = false
  for _, route in ipairs(ROUTES) do
    local found = {path:match(route[2])}
    if #found > 0 then
      known_path = true
      local name = found[1]
      if type(name) == "string" and name:match("^%.+$") then return nil, 400 end
      if route[1] == method then return route, name end
    end
  end
  return nil, known_path and 405 or 404
end

local function refuse(handle, status, why)
  local body = '{"error":"' .. why:gsub('[%c"\\]', " ") .. '"}'
  handle:respond({[":status"] = tostring(status), ["content-type"] = "application/json", ["x-edge"] = "refused"}, body)
end

local function check(handle)
  local headers = handle:headers()
  local method, path = headers:get(":method"), headers:get(":path") or ""
  if method ~= "GET" and method ~= "POST" then return 405, "method " .. tostring(method) .. " is not served here" end
  if path:find("[?#%%]") then return 400, "paths with a query, fragment or percent-escape are not served here" end
  local route, name = route_of(method, path)
  if not route then
    if name == 405 then return 405, method .. " " .. path:sub(1, 80) .. " is not served here" end
    if name == 400 then return 400, "a name made of dots is not a model or region name" end
    return 404, path:sub(1, 80) .. " is not a path the edge serves (generate and generate_stream are not served)"
  end
  local encoding = header_value(handle, "content-encoding")
  if encoding and encoding ~= "identity" then
    return 415, "Content-Encoding '" .. encoding:sub(1, 20) .. "' is not accepted at the edge: send the body uncompressed"
  end
  if route[3] then return route[3](handle, name) end
  return nil
end

local INFER_PATH = "^/v2/models/([%w_%.%-]+)/infer$"
local INFER_VERSION_PATH = "^/v2/models/([%w_%.%-]+)/versions/([0-9]+)/infer$"

local function record_path(handle)
  -- a recording (server/edge/record.lua) names every inference request's model, refused ones included
  local path = handle:headers():get(":path") or ""
  local model, version = path:match(INFER_VERSION_PATH)
  model = model or path:match(INFER_PATH)
  if model then record_start(handle, model, version) end
end

function envoy_on_request(handle)
  if CONFIG.record then record_path(handle) end
  local ok, status, why = pcall(check, handle)
  if not ok then
    local err = status
    status, why = 400, type(err) == "table" and err.why or tostring(err)
  end
  if CONFIG.record then record_end(handle) end
  if status then refuse(handle, status, why) end
end

-- Tests only: the edge's reading as a response header (server/edge/request_checks.py defines envoy_on_response as this
-- when echo_reading is set; otherwise Envoy runs no Lua on responses at all).
function edge_echo_reading(handle)
  local read = handle:streamInfo():dynamicMetadata():get("edge")
  if read and read.read then handle:headers():add("x-edge-read", read.read) end
end
