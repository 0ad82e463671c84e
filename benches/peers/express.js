// express with express-rate-limit and rate-limit-redis (ioredis): the same request shape,
// one fixed-window rule per user.
const express = require("express");
const Redis = require("ioredis");
const { rateLimit } = require("express-rate-limit");
const { RedisStore } = require("rate-limit-redis");

const client = new Redis(process.env.REDIS_URL);
const app = express();
app.use(express.json());
app.post(
  "/api/v1/check",
  rateLimit({
    windowMs: Number(process.env.WINDOW_S ?? 60) * 1000,
    limit: Number(process.env.LIMIT ?? 1000000000),
    standardHeaders: "draft-7",
    legacyHeaders: false,
    keyGenerator: (req) => `${req.body.policy}|user|${req.body.identifiers.user}`,
    validate: false,
    store: new RedisStore({ sendCommand: (...args) => client.call(...args), prefix: "erl:" }),
  }),
  (req, res) => res.json({ allowed: true }),
);
app.listen(Number(process.env.PORT), "127.0.0.1");
