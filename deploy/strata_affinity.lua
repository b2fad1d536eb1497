-- Conversation affinity for HAProxy in front of several Strata hosts (deploy/haproxy.cfg, docs/DEPLOY.md).
--
-- Contract: the fetch `lua.strata_key` returns the text a request's host is chosen by (`balance hash`):
--   1. the X-Conversation-Id header, when sent;
--   2. else the body's `user` field (OpenAI's end-user id), when a string;
--   3. else the conversation's first user message: the first element of `messages` (OpenAI, Anthropic,
--      Ollama) or `input` (Responses) whose role is "user", its content as text (a list of parts: their
--      `text` joined); a string `input`, `prompt` (completions, llama.cpp, Ollama generate) itself;
--   4. else "" (no key: HAProxy's hash of an empty key sends every such request to one host, which is fine
--      for GETs and health checks).
-- The body is decoded as JSON, so the key does not depend on the order of the fields (role before or after
-- content, `messages` before or after `model`): every turn of one conversation carries the same first user
-- message, so every turn lands on the host whose prompt cache holds that conversation.
-- Why Lua and not `req.body,json_query(...)`: json_query takes a fixed path (`$.messages[0].content`), which is
-- the system prompt when one comes first, and cannot pick "the first element whose role is user".
-- Limits: HAProxy hands over at most tune.bufsize of a body: a longer one is decoded as far as it goes (a
-- conversation's first user message comes early), and a text that is not JSON gives what parsed before the fault.

local MAX_BODY_BYTES = 1048576   -- a key is looked for in at most this much body

local decode   -- forward declaration: decode(s, i) -> value, next index (nil on a malformed text)

local function skip(s, i)
  return (s:find("[^ \t\r\n]", i)) or (#s + 1)
end

local ESCAPES = { ['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n", r = "\r", t = "\t" }

local function decode_string(s, i)   -- s:sub(i, i) == '"'
  local out, j = {}, i + 1
  while j <= #s do
    local c = s:sub(j, j)
    if c == '"' then
      return table.concat(out), j + 1
    elseif c == "\\" then
      local e = s:sub(j + 1, j + 1)
      if e == "u" then
        local hex = s:sub(j + 2, j + 5)
        local code = tonumber(hex, 16)
        if not code then return nil end
        out[#out + 1] = utf8.char(code)   -- a surrogate pair stays two code points: fine for a hash key
        j = j + 6
      elseif ESCAPES[e] then
        out[#out + 1] = ESCAPES[e]
        j = j + 2
      else
        return nil
      end
    else
      local k = s:find('["\\]', j)
      if not k then return nil end
      out[#out + 1] = s:sub(j, k - 1)
      j = k
    end
  end
  return nil
end

local function decode_array(s, i)
  local out, j = {}, skip(s, i + 1)
  if s:sub(j, j) == "]" then return out, j + 1 end
  while true do
    local v
    v, j = decode(s, j)
    out[#out + 1] = v
    if j == nil then return out, nil end   -- cut or malformed: what came before still counts
    j = skip(s, j)
    local c = s:sub(j, j)
    if c == "]" then return out, j + 1 end
    if c ~= "," then return out, nil end
    j = skip(s, j + 1)
  end
end

local function decode_object(s, i)
  local out, j = {}, skip(s, i + 1)
  if s:sub(j, j) == "}" then return out, j + 1 end
  while true do
    if s:sub(j, j) ~= '"' then return out, nil end
    local k
    k, j = decode_string(s, j)
    if j == nil then return out, nil end
    j = skip(s, j)
    if s:sub(j, j) ~= ":" then return out, nil end
    local v
    v, j = decode(s, skip(s, j + 1))
    out[k] = v
    if j == nil then return out, nil end   -- cut or malformed: the fields before it still count
    j = skip(s, j)
    local c = s:sub(j, j)
    if c == "}" then return out, j + 1 end
    if c ~= "," then return out, nil end
    j = skip(s, j + 1)
  end
end

decode = function(s, i)
  i = skip(s, i)
  local c = s:sub(i, i)
  if c == "{" then return decode_object(s, i) end
  if c == "[" then return decode_array(s, i) end
  if c == '"' then return decode_string(s, i) end
  local lit = s:match("^[%w%.%+%-]+", i)   -- a number, true, false or null: not needed for the key
  if not lit then return nil end
  return lit, i + #lit
end

local function text_of(content)
  if type(content) == "string" then return content end
  if type(content) ~= "table" then return nil end
  local parts = {}
  for _, part in ipairs(content) do
    if type(part) == "string" then
      parts[#parts + 1] = part
    elseif type(part) == "table" and type(part.text) == "string" then
      parts[#parts + 1] = part.text
    end
  end
  return table.concat(parts, "\n")
end

local function first_user(list)
  if type(list) == "string" then return list end
  if type(list) ~= "table" then return nil end
  for _, m in ipairs(list) do
    if type(m) == "table" and m.role == "user" then return text_of(m.content) end
  end
  return nil
end

-- The key of one request (exposed for tests: strata_key_of(header_value, body)).
function strata_key_of(conv_id, body)
  if conv_id and conv_id ~= "" then return "c:" .. conv_id end
  if not body or #body == 0 then return "" end
  if #body > MAX_BODY_BYTES then body = body:sub(1, MAX_BODY_BYTES) end
  local obj = decode(body, 1)
  if type(obj) ~= "table" then return "" end
  if type(obj.user) == "string" and obj.user ~= "" then return "u:" .. obj.user end
  local text = first_user(obj.messages) or first_user(obj.input)
  if not text and type(obj.prompt) == "string" then text = obj.prompt end
  return text and ("m:" .. text) or ""
end

if core then
  core.register_fetches("strata_key", function(txn)
    local hdrs = txn.http:req_get_headers()
    local conv = hdrs["x-conversation-id"] and hdrs["x-conversation-id"][0]
    return strata_key_of(conv, txn.f:req_body())
  end)
end
