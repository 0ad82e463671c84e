-- wrk script: POST /api/v1/check with a random user out of $USERS (and a random IP when
-- $TWO=1), or always the same user when $HOT is set.
--
-- Requests are put together as cheaply as Lua allows: the load generator shares a core with
-- Redis, so what it spends on a request is taken from the server under test. Each user's
-- request is built once, in init; with an IP, each request's body is new (an IP out of 16
-- million, as before), and only the head is reused, one per body length. Building every
-- request with wrk.format cost the load generator about 1.2 µs a request.
local users = tonumber(os.getenv("USERS") or "10000")
local policy = os.getenv("POLICY") or "one"
local two = os.getenv("TWO") == "1"
local hot = os.getenv("HOT")
local path = "/api/v1/check"
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. (os.getenv("KEY") or "")

local function body(ids)
  return string.format('{"policy":"%s","identifiers":{%s}}', policy, ids)
end

local function user_ids(user)
  return string.format('"user":"%s"', user)
end

-- Whole requests, one per user (only with no IP).
local built = {}
-- The head of a request (request line and headers) for each body length.
local heads = {}

local function head(length)
  local h = heads[length]
  if not h then
    local filler = string.rep("x", length)
    local whole = wrk.format(nil, path, nil, filler)
    h = string.sub(whole, 1, #whole - length)
    heads[length] = h
  end
  return h
end

init = function()
  if hot then
    built[1] = wrk.format(nil, path, nil, body(user_ids(hot)))
  elseif not two then
    for i = 1, users do built[i] = wrk.format(nil, path, nil, body(user_ids(tostring(i)))) end
  end
end

request = function()
  if not two then return built[hot and 1 or math.random(users)] end
  local ids = user_ids(hot or tostring(math.random(users)))
    .. string.format(',"ip":"10.%d.%d.%d"', math.random(0, 255), math.random(0, 255), math.random(1, 254))
  local b = body(ids)
  return head(#b) .. b
end
