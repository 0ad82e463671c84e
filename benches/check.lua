-- wrk script: POST /api/v1/check with a random user out of $USERS (and an IP when $TWO=1),
-- or always the same user when $HOT is set.
local users = tonumber(os.getenv("USERS") or "10000")
local policy = os.getenv("POLICY") or "one"
local two = os.getenv("TWO") == "1"
local hot = os.getenv("HOT")
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. (os.getenv("KEY") or "")

request = function()
  local user = hot or tostring(math.random(users))
  local ids = string.format('"user":"%s"', user)
  if two then ids = ids .. string.format(',"ip":"10.%d.%d.%d"', math.random(0, 255), math.random(0, 255), math.random(1, 254)) end
  return wrk.format(nil, "/api/v1/check", nil, string.format('{"policy":"%s","identifiers":{%s}}', policy, ids))
end
