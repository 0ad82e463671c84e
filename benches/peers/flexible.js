// rate-limiter-flexible (RateLimiterRedis) with ioredis behind node:http: the same request
// shape as Spillway's POST /api/v1/check, one fixed-window rule per user.
const http = require("node:http");
const Redis = require("ioredis");
const { RateLimiterRedis } = require("rate-limiter-flexible");

const redis = new Redis(process.env.REDIS_URL, { enableOfflineQueue: true });
const limiter = new RateLimiterRedis({
  storeClient: redis,
  keyPrefix: "rlflx",
  points: Number(process.env.LIMIT ?? 1000000000),
  duration: Number(process.env.WINDOW_S ?? 60),
});

http
  .createServer((req, res) => {
    let body = "";
    req.on("data", (chunk) => (body += chunk));
    req.on("end", () => {
      let check;
      try {
        check = JSON.parse(body);
      } catch {
        res.writeHead(400).end();
        return;
      }
      const user = check.identifiers.user;
      limiter
        .consume(`${check.policy}|user|${user}`, check.cost ?? 1)
        .then((r) => {
          res.writeHead(200, { "content-type": "application/json" });
          res.end(JSON.stringify({ allowed: true, remaining: r.remainingPoints, reset_ms: r.msBeforeNext }));
        })
        .catch((r) => {
          res.writeHead(429, { "content-type": "application/json" });
          res.end(JSON.stringify({ allowed: false, remaining: 0, retry_after_ms: r.msBeforeNext }));
        });
    });
  })
  .listen(Number(process.env.PORT), "127.0.0.1");
