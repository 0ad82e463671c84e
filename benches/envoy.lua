-- wrk through Envoy: GET / as one of USERS users (the x-user header Envoy's rate limit
-- action turns into the descriptor `user`).
local users = tonumber(os.getenv("USERS") or "10000")
math.randomseed(os.time())
request = function()
  return wrk.format("GET", "/", { ["x-user"] = tostring(math.random(users)) })
end
