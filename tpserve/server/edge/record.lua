-- Traffic recording of gRPC in Lua (server/edge/recording.py): where values are kept, and where the Envoy binary is
-- not the one the native recorder (server/edge/record_grpc.c) is built for. HTTP is recorded by the edge's checks
-- module (server/edge/checks_module.c), from its own reading.
--
-- What an inference request carried goes into Envoy's dynamic metadata under "traffic": "request", JSON text of
-- its model, version, each input's name, datatype and shape, and the batch; "values", the body, only where
-- values are recorded. Envoy's access log writes it, with the arrival time, status, bytes and duration, as one
-- JSON line per request (common/traffic.py reads it).
-- ModelInfer's protobuf header is read here (grpc_on_request). Its raw tensor contents are skipped.
-- Shapes only: the body streams through as it comes (bodyChunks: nothing is buffered, which would hold each
-- request back until its last byte). It copies the message's first 512 bytes (HEAD_FIRST) and reads on, up to
-- record_head_bytes, only where the inputs run past them. The reading stops at the first field that runs past
-- the bytes copied. That is fine at outputs (6) or the raw tensor contents (7): every protobuf serializer writes
-- fields in number order, so the inputs are read. Earlier, the message goes on unrecorded. A message that puts
-- a field after its raw contents (no serializer does) is recorded as far as read.
-- Values: the whole body is buffered (it is what is kept).
-- Recording refuses nothing: a message it cannot read, or one past 64 inputs, 64 dims or 256-byte names, goes
-- on unrecorded (Triton decides what it is). It reads repeated scalar fields as protobuf does: the last one.

local TRAFFIC = "traffic"
local B64 = {}
do
  local alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
  for i = 0, 63 do B64[i] = alphabet:sub(i + 1, i + 1) end
end

local function base64(bytes)
  local out, n = {}, #bytes
  for i = 1, n, 3 do
    local a, b, c = bytes:byte(i, i + 2)
    local v = a * 65536 + (b or 0) * 256 + (c or 0)
    local d1, d2 = math.floor(v / 262144) % 64, math.floor(v / 4096) % 64
    local d3, d4 = math.floor(v / 64) % 64, v % 64
    out[#out + 1] = B64[d1] .. B64[d2] .. (b and B64[d3] or "=") .. (c and B64[d4] or "=")
  end
  return table.concat(out)
end

-- One key per request, "request": the line's model, version, inputs and batch as JSON text, written by one
-- call (each key set is a call into Envoy, and a Lua table becomes a protobuf Struct: both cost, per request).

local function json_string(s)
  -- s as a JSON string: quotes, backslashes and control bytes escaped; other bytes as they are
  if s:find('[%c"\\]') then
    s = s:gsub('[%c"\\]', function(c) return string.format("\\u%04x", c:byte()) end)
  end
  return '"' .. s .. '"'
end

local function dims_text(dims)
  local out = {}
  for i, d in ipairs(dims) do out[i] = string.format("%d", d) end
  return table.concat(out, ",")
end

local REPLAY_HEADER = "x-traffic-replay" -- a replay's requests carry it (common/traffic.py: REPLAY_HEADER)

local function request_line(handle, model, version, inputs, batch)
  local parts = {}
  for i, input in ipairs(inputs) do
    parts[i] = "[" .. json_string(input[1]) .. "," .. json_string(input[2]) .. ",[" .. dims_text(input[3]) .. "]]"
  end
  return '{"model":' .. json_string(model) .. ',"version":' .. json_string(version or "") .. ',"inputs":['
    .. table.concat(parts, ",") .. '],"batch":' .. string.format("%d", batch)
    .. (handle:headers():get(REPLAY_HEADER) and ',"replayed":true}' or "}")
end

local function record_inputs(handle, model, inputs, body, header_length, version)
  -- inputs: {{name, datatype, {dims}}, ...}; body: the request as sent (kept only where values are recorded)
  local md = handle:streamInfo():dynamicMetadata()
  local known, batch = CONFIG.models[model], 1
  if known and known.max_batch_size > 0 and inputs[1] and #inputs[1][3] > 0 then batch = inputs[1][3][1] end
  md:set(TRAFFIC, "request", request_line(handle, model, version, inputs, batch))
  if CONFIG.record_values and body and #body <= CONFIG.record_value_bytes then
    md:set(TRAFFIC, "values", {body = base64(body), header_length = header_length or 0})
  end
end

-- Protocol buffers: just enough to read ModelInferRequest (inference.proto) without its tensor contents.

local function varint(s, pos)
  local value, scale = 0, 1
  while true do
    local b = s:byte(pos)
    if b == nil or scale > 2 ^ 63 then error("not a varint") end
    pos, value = pos + 1, value + (b % 128) * scale
    if b < 128 then return value, pos end
    scale = scale * 128
  end
end

local function each_field(s, pos, stop, visit, cut)
  -- visit(number, wire, value) for varints; visit(number, 2, first, last) for length-delimited fields.
  -- cut: s is the message's first bytes only; a length-delimited field running past them ends the walk, and
  -- its number is returned (nil: the whole message was read).
  while pos <= stop do
    local key
    key, pos = varint(s, pos)
    local number, wire = math.floor(key / 8), key % 8
    if wire == 0 then
      local value
      value, pos = varint(s, pos)
      visit(number, 0, value)
    elseif wire == 2 then
      local length
      length, pos = varint(s, pos)
      if cut and pos + length - 1 > stop then return number end
      if pos + length - 1 > stop then error("a field runs past its message") end
      visit(number, 2, pos, pos + length - 1)
      pos = pos + length
    elseif wire == 1 or wire == 5 then
      pos = pos + (wire == 1 and 8 or 4)
    else
      error("wire type " .. wire .. " is not read here")
    end
  end
end

local MAX_ITEMS, MAX_NAME = 64, 256 -- a message past these is not recorded (a line stays small)

local function text(s, a, b)
  if b - a + 1 > MAX_NAME then error("a name past " .. MAX_NAME .. " bytes") end
  return s:sub(a, b)
end

local function add_dim(shape, value)
  if #shape >= MAX_ITEMS then error("a shape past " .. MAX_ITEMS .. " dims") end
  shape[#shape + 1] = value
end

local function read_tensor(s, first, last)
  local name, datatype, shape = "", "", {}
  each_field(s, first, last, function(number, wire, a, b)
    if number == 1 and wire == 2 then name = text(s, a, b)
    elseif number == 2 and wire == 2 then datatype = text(s, a, b)
    elseif number == 3 and wire == 0 then add_dim(shape, a)
    elseif number == 3 and wire == 2 then
      local pos, value = a, nil
      while pos <= b do
        value, pos = varint(s, pos)
        add_dim(shape, value)
      end
    end
  end)
  return {name, datatype, shape}
end

local function read_infer(message, cut)
  -- cut: message holds only the first bytes; the inputs must all be read before the field that runs past them
  -- (false where they are not: more bytes are needed)
  local model, version, inputs = nil, "", {}
  local stopped_at = each_field(message, 1, #message, function(number, wire, a, b)
    if number == 1 and wire == 2 then model = text(message, a, b)
    elseif number == 2 and wire == 2 then version = text(message, a, b)
    elseif number == 5 and wire == 2 then
      if #inputs >= MAX_ITEMS then error("more than " .. MAX_ITEMS .. " inputs") end
      inputs[#inputs + 1] = read_tensor(message, a, b)
    end
  end, cut)
  if stopped_at and stopped_at < 6 then return false end -- the inputs run past the bytes read: read more
  return model, version, inputs
end

local GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"

local function frame_length(bytes)
  -- a gRPC frame's message length, or nil if compressed
  local flag, b1, b2, b3, b4 = bytes:byte(1, 5)
  if flag ~= 0 then return nil end
  return ((b1 * 256 + b2) * 256 + b3) * 256 + b4
end

local function record_message(handle, message, cut)
  -- false: the header runs past the bytes in message (cut), read more
  local model, version, inputs = read_infer(message, cut)
  if model == false then return false end
  if not model or model == "" then return true end
  record_inputs(handle, model, inputs, not cut and message or nil, 0, version)
  return true
end

local function record_grpc(handle)
  -- values: the whole body, buffered
  local body = handle:body()
  if body == nil or body:length() < 5 then return end
  local bytes = body:getBytes(0, body:length())
  if frame_length(bytes) ~= #bytes - 5 then return end -- compressed, or not one whole message
  record_message(handle, bytes:sub(6), false)
end

local HEAD_FIRST = 512 -- a message's header is tried from its first bytes, before record_head_bytes

local function record_grpc_streaming(handle)
  -- shapes: the message's first bytes as they pass, HEAD_FIRST and, where its header runs longer, up to
  -- record_head_bytes; a copy of those bytes only, never of the tensor contents behind them
  local parts, have, want = {}, 0, nil
  local limit = 5 + math.min(HEAD_FIRST, CONFIG.record_head_bytes)
  for chunk in handle:bodyChunks() do
    local length, used = chunk:length(), 0
    while true do
      local take = math.min(length - used, limit - have)
      if take > 0 then
        parts[#parts + 1] = chunk:getBytes(used, take)
        used, have = used + take, have + take
      end
      local bytes = #parts == 1 and parts[1] or table.concat(parts)
      parts = {bytes}
      if not want and have >= 5 then
        want = frame_length(bytes)
        if not want then return end -- compressed: not read
      end
      if not want or have < math.min(5 + want, limit) then break end -- the next chunk
      local head = bytes:sub(6, 5 + want)
      local ok, done = pcall(record_message, handle, head, #head < want)
      if not ok or done or limit >= 5 + CONFIG.record_head_bytes then return end
      limit = 5 + CONFIG.record_head_bytes
    end
  end
end

function grpc_on_request(handle)
  if handle:headers():get(":path") ~= GRPC_INFER then return end -- streams and other calls pass untouched
  if CONFIG.record_values then
    pcall(record_grpc, handle)
  else
    pcall(record_grpc_streaming, handle)
  end
end
