// The TypeScript client against a real Spillway (started by tests/it/clients.rs): failure
// modes, the denial cache, leases, reserve-then-report, the Express and Hono middleware;
// caller limits, batches, peeks, the admin helpers, the bounded wait, the circuit breaker,
// errors that name their cause, and the in-memory fake under the middleware.
// Prints one line per part; any failed assertion exits non-zero.
import assert from "node:assert/strict";
import { once } from "node:events";
import http from "node:http";
import net from "node:net";

import express from "express";
import { Hono } from "hono";

import { Admin, Refused, Spillway, SpillwayError } from "../dist/index.js";
import { spillwayExpress } from "../dist/express.js";
import { spillwayHono } from "../dist/hono.js";
import { FakeSpillway } from "../dist/testing.js";

const URL = process.env.SPILLWAY_URL;
const KEY = process.env.SPILLWAY_SERVICE_KEY;
const ADMIN = { authorization: `Bearer ${process.env.SPILLWAY_ADMIN_KEY}`, "content-type": "application/json" };
const CLOSED = { unavailable: "closed", misconfigured: "closed" };
const quiet = { warn() {}, error() {} };
// The server under test is a debug build on a machine shared with other tests: a timeout that
// fits it, except where the timeout itself is tested (the client's default is 100 ms).
const TIMEOUT_MS = 5000;
const client = (failure = CLOSED, more = {}) =>
  new Spillway({ url: URL, key: KEY, failure, logger: quiet, timeoutMs: TIMEOUT_MS, ...more });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const hourly = (limit, more = {}) => ({ name: "hourly", algorithm: "fixed_window", limit, window_ms: 3600000, ...more });

async function setup() {
  const policies = {
    "ts-cache": { rules: [hourly(2)] },
    "ts-lease": { rules: [{ name: "one", algorithm: "concurrency", limit: 1, lease_ms: 2000 }] },
    "ts-tokens": { rules: [hourly(1000), { name: "one-at-a-time", algorithm: "concurrency", limit: 1, lease_ms: 60000 }] },
    "ts-shadow": { mode: "shadow", rules: [hourly(100)] },
    "ts-strict": { rules: [hourly(5, { dimensions: ["user"] })] },
    "ts-lenient": { strict: false, rules: [hourly(5, { dimensions: ["user"] })] },
    "ts-express": { rules: [hourly(2), { name: "in-flight", algorithm: "concurrency", limit: 5, lease_ms: 30000 }] },
    "ts-hono": { rules: [hourly(1)] },
    "ts-hono-stream": { rules: [{ name: "one", algorithm: "concurrency", limit: 1, lease_ms: 1000 }] },
    "ts-slow": { rules: [{ name: "one", algorithm: "concurrency", limit: 1, lease_ms: 1000 }] },
    "ts-budget": { rules: [hourly(1000), { name: "one", algorithm: "concurrency", limit: 1, lease_ms: 1000 }] },
    "ts-export": { rules: [{ name: "one", algorithm: "concurrency", limit: 1, lease_ms: 30000 }] },
    "ts-limits": { rules: [hourly(2, { caller_max: { limit: 1000 } })] },
    "ts-batch": { rules: [hourly(1)] },
    "ts-many": { rules: [hourly(1)] },
    "ts-peek": { rules: [hourly(3)] },
    "ts-penalty": { rules: [hourly(1, { block_ms: 3600000 })] },
    "ts-admin": { rules: [hourly(1)] },
    "ts-wait-long": { rules: [{ name: "sliding", algorithm: "sliding_window", limit: 1, window_ms: 3600000 }] },
    "ts-wait": { rules: [{ name: "second", algorithm: "fixed_window", limit: 1, window_ms: 1000 }] },
    "ts-wait-lease": { rules: [{ name: "one", algorithm: "concurrency", limit: 1, lease_ms: 30000 }] },
  };
  for (const [name, doc] of Object.entries(policies)) {
    const r = await fetch(`${URL}/api/v1/policies/${name}`, { method: "PUT", headers: ADMIN, body: JSON.stringify(doc) });
    assert.ok(r.ok, await r.text());
  }
}

async function remaining(policy, user, rule) {
  const state = await (await fetch(`${URL}/api/v1/identifiers/user/${user}`, { headers: ADMIN })).json();
  for (const p of state.policies) if (p.policy === policy) for (const r of p.rules) if (r.rule === rule) return r.remaining;
  throw new Error(`no ${policy}/${rule} for ${user}: ${JSON.stringify(state)}`);
}

async function deniedCount(policy) {
  const text = await (await fetch(`${URL}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith("spillway_checks_total") && l.includes(`policy="${policy}"`) && l.includes('outcome="denied"'));
  return line ? Number(line.split(" ").pop()) : 0;
}

async function denialCache() {
  const spillway = client();
  const first = await spillway.check("ts-cache", { user: "ada" });
  assert.equal(first.outcome, "allowed");
  assert.ok(first.allowed && !first.unmatched && !first.fromCache);
  const names = first.headers.map(([n]) => n);
  assert.ok(names.includes("ratelimit-policy") && names.includes("ratelimit") && !names.includes("retry-after"), names);
  await spillway.check("ts-cache", { user: "ada" });
  const denied = await spillway.check("ts-cache", { user: "ada" });
  assert.equal(denied.outcome, "limited");
  assert.ok(!denied.allowed && !denied.fromCache);
  const retry = Number(new Map(denied.headers).get("retry-after"));
  assert.equal(retry, denied.retryAfterSecs);
  assert.ok(retry >= 1 && retry <= 3600, String(retry));
  const problem = denied.problem();
  assert.equal(problem.status, 429);
  assert.equal(problem.title, "Too Many Requests");
  assert.equal(problem.retry_after, retry);
  assert.equal(await deniedCount("ts-cache"), 1);
  const again = await spillway.check("ts-cache", { user: "ada" });
  assert.ok(again.fromCache && !again.allowed && new Map(again.headers).has("retry-after"));
  assert.equal(await deniedCount("ts-cache"), 1, "a remembered denial still called");
  assert.ok((await spillway.check("ts-cache", { user: "bob" })).allowed);
  console.log("denial cache: ok");
}

async function leases() {
  const spillway = client();
  const other = client();
  const { denied, allowed } = await spillway.withLease("ts-lease", { user: "ada" }, async (decision) => {
    assert.equal(decision.leases.length, 1);
    let denied = 0;
    let allowed = 0;
    const started = Date.now();
    while (Date.now() - started < 5000) {
      const d = await other.check("ts-lease", { user: "ada" });
      assert.ok(!d.fromCache, "a concurrency denial was cached");
      if (d.allowed) {
        allowed += 1;
        await other.release(d.leases);
      } else {
        assert.equal(d.retryAfterSecs, 1);
        denied += 1;
      }
      await sleep(100);
    }
    return { denied, allowed };
  });
  // Renewed past its 2 s while held; released when the work ended.
  assert.equal(allowed, 0, `the lease ran out while held (${denied} denied)`);
  assert.ok(denied >= 3, String(denied));
  const after = await other.check("ts-lease", { user: "ada" });
  assert.ok(after.allowed, after.outcome);
  await other.release(after.leases);
  await assert.rejects(spillway.withLease("ts-lease", { user: "ada" }, async () => { throw new Error("the work failed"); }), /the work failed/);
  const freed = await other.check("ts-lease", { user: "ada" });
  assert.ok(freed.allowed, "a failed work's lease was not released");
  await assert.rejects(spillway.withLease("ts-lease", { user: "ada" }, async () => "let through"), (e) => e instanceof Refused && e.decision.outcome === "limited");
  await other.release(freed.leases);
  console.log("leases: ok");
}

async function reserve() {
  const spillway = client();
  const value = await spillway.reserve("ts-tokens", { user: "ada" }, 300, async (d) => {
    assert.equal(d.answer.results.find((r) => r.rule === "hourly").remaining, 700);
    return { value: "done", used: 120 };
  });
  assert.equal(value, "done");
  assert.equal(await remaining("ts-tokens", "ada", "hourly"), 880);
  await assert.rejects(spillway.reserve("ts-tokens", { user: "ada" }, 500, async () => { throw new Error("upstream failed"); }), /upstream failed/);
  assert.equal(await remaining("ts-tokens", "ada", "hourly"), 880);
  // Each reserve released its lease; a shadow-denied check gives nothing back.
  assert.equal(await remaining("ts-tokens", "ada", "one-at-a-time"), 1);
  assert.ok((await spillway.check("ts-shadow", { user: "ada" }, 60)).allowed);
  await assert.rejects(spillway.reserve("ts-shadow", { user: "ada" }, 50, async (d) => {
    assert.equal(d.answer.shadow_denied, true);
    throw new Error("upstream failed");
  }), /upstream failed/);
  assert.equal(await remaining("ts-shadow", "ada", "hourly"), 40);
  const tooMuch = await spillway.check("ts-tokens", { user: "ada" }, 5000);
  assert.equal(tooMuch.outcome, "too_costly");
  assert.ok(tooMuch.detail.includes("hourly"), tooMuch.detail);
  assert.equal(tooMuch.problem().status, 422);
  // Work that outlasts the lease keeps its slot (renewed): another check at 1.5 s of a 1 s
  // lease is refused; released when the work ends.
  const other = client();
  let during;
  await spillway.reserve("ts-budget", { user: "ada" }, 10, async () => {
    await sleep(1500);
    during = await other.check("ts-budget", { user: "ada" });
    await sleep(1000);
    return { value: null, used: 10 };
  });
  assert.equal(during.allowed, false, "the reservation's lease ran out while its work ran");
  assert.equal(during.answer.results.find((r) => !r.allowed).rule, "one");
  const after = await other.check("ts-budget", { user: "ada" });
  assert.ok(after.allowed, "released when the work ended");
  await other.release(after.leases);
  console.log("reserve then report: ok");
}

async function failureModes() {
  for (const [mode, goesOn] of [["open", true], ["closed", false]]) {
    const failure = { unavailable: mode, misconfigured: mode };
    const spillway = client(failure);
    for (const [policy, status] of [["ts-strict", 400], ["ts-missing", 404]]) {
      const d = await spillway.check(policy, { ip: "10.0.0.7" });
      assert.equal(d.outcome, "misconfigured", policy);
      assert.equal(d.status, status);
      assert.equal(d.allowed, goesOn);
    }
    const lenient = await spillway.check("ts-lenient", { ip: "10.0.0.7" });
    assert.ok(lenient.allowed && lenient.unmatched);
    const wrong = new Spillway({ url: URL, key: "spw_svc_wrong", failure, logger: quiet, timeoutMs: TIMEOUT_MS });
    const d = await wrong.check("ts-strict", { user: "ada" });
    assert.equal(d.outcome, "misconfigured");
    assert.equal(d.status, 401);
    assert.equal(d.allowed, goesOn);
    if (!goesOn) assert.equal(d.problem().status, 503);
  }
  // Nothing listening, and a listener that never answers: unavailable within the timeout.
  const free = net.createServer();
  await new Promise((r) => free.listen(0, "127.0.0.1", r));
  const closedUrl = `http://127.0.0.1:${free.address().port}`;
  await new Promise((r) => free.close(r));
  const held = [];
  const silent = net.createServer((socket) => held.push(socket));
  await new Promise((r) => silent.listen(0, "127.0.0.1", r));
  const silentUrl = `http://127.0.0.1:${silent.address().port}`;
  for (const url of [closedUrl, silentUrl]) {
    for (const [mode, goesOn] of [["open", true], ["closed", false]]) {
      const spillway = new Spillway({ url, key: KEY, failure: { unavailable: mode, misconfigured: mode }, timeoutMs: 200, logger: quiet });
      const started = Date.now();
      const d = await spillway.check("ts-strict", { user: "ada" });
      assert.equal(d.outcome, "unavailable", url);
      assert.equal(d.allowed, goesOn);
      assert.ok(Date.now() - started < 3000, "the timeout did not hold");
    }
  }
  for (const socket of held) socket.destroy();
  silent.close();
  assert.throws(() => new Spillway({ url: URL, key: KEY, failure: { unavailable: "open" } }), TypeError);
  console.log("failure modes: ok");
}

async function expressMiddleware() {
  const app = express();
  app.use(spillwayExpress(client(), "ts-express", (req) => ({ user: req.get("x-user") })));
  app.get("/work", (_req, res) => res.send("done"));
  app.get("/slow", spillwayExpress(client(), "ts-slow", (req) => ({ user: req.get("x-user") })), async (_req, res) => {
    await sleep(2500);
    res.send("slow");
  });
  const server = await new Promise((r) => { const s = app.listen(0, "127.0.0.1", () => r(s)); });
  const base = `http://127.0.0.1:${server.address().port}`;
  for (let i = 0; i < 2; i++) {
    const r = await fetch(`${base}/work`, { headers: { "x-user": "ada" } });
    assert.equal(r.status, 200);
    assert.equal(await r.text(), "done");
    assert.ok(r.headers.get("ratelimit-policy").includes("hourly") && r.headers.has("ratelimit"));
  }
  const r = await fetch(`${base}/work`, { headers: { "x-user": "ada" } });
  assert.equal(r.status, 429);
  assert.equal(r.headers.get("content-type").split(";")[0], "application/problem+json");
  const retry = Number(r.headers.get("retry-after"));
  const problem = await r.json();
  assert.equal(problem.status, 429);
  assert.equal(problem.retry_after, retry);
  assert.equal((await fetch(`${base}/work`)).status, 200, "no identifiers: unchecked");
  // A request longer than its 1 s lease keeps its slot (renewed): another at 1.5 s is refused.
  const slow = fetch(`${base}/slow`, { headers: { "x-user": "sam" } });
  await sleep(1500);
  assert.equal((await fetch(`${base}/slow`, { headers: { "x-user": "sam" } })).status, 429, "the slow request's lease ran out");
  assert.equal((await slow).status, 200);
  // Released after each response (in the background): free again long before the 30 s end.
  const started = Date.now();
  while ((await remaining("ts-express", "ada", "in-flight")) !== 5) {
    assert.ok(Date.now() - started < 5000, "a lease was not released");
    await sleep(20);
  }
  // A client that goes away does not free the slot while the route still works: the export
  // below runs 2.5 s after its caller left at 0.3 s, and holds the one slot until it ends.
  let exporting = 0;
  app.get("/export", spillwayExpress(client(), "ts-export", (req) => ({ user: req.get("x-user") })), async (_req, res) => {
    exporting += 1;
    await sleep(2500);
    res.send("exported");
  });
  const gone = new AbortController();
  const leaving = fetch(`${base}/export`, { headers: { "x-user": "eve" }, signal: gone.signal }).catch(() => "left");
  await sleep(300);
  gone.abort();
  assert.equal(await leaving, "left");
  await sleep(700);
  assert.equal(exporting, 1);
  assert.equal((await fetch(`${base}/export`, { headers: { "x-user": "eve" } })).status, 429, "a disconnect freed the slot of work still running");
  // Released once the route ended its response, long before the 30 s lease.
  const ended = Date.now();
  while ((await remaining("ts-export", "eve", "one")) !== 1) {
    assert.ok(Date.now() - ended < 6000, "the export's lease was not released when it ended");
    await sleep(50);
  }
  server.close();
  console.log("Express middleware: ok");
}

async function honoMiddleware() {
  const app = new Hono();
  app.use("*", spillwayHono(client(), "ts-hono", (c) => ({ user: c.req.header("x-user") })));
  app.get("/work", (c) => c.json({ done: true }));
  const ok = await app.request("/work", { headers: { "x-user": "ada" } });
  assert.equal(ok.status, 200);
  assert.deepEqual(await ok.json(), { done: true });
  assert.ok(ok.headers.get("ratelimit-policy").includes("hourly") && ok.headers.has("ratelimit"));
  const denied = await app.request("/work", { headers: { "x-user": "ada" } });
  assert.equal(denied.status, 429);
  assert.equal(denied.headers.get("content-type"), "application/problem+json");
  const problem = await denied.json();
  assert.equal(problem.retry_after, Number(denied.headers.get("retry-after")));
  // A streamed body holds its 1 s lease (renewed) as long as it streams, 2.5 s here: another
  // request 1.5 s in is refused; the slot is free once the body has been read to its end.
  const streaming = new Hono();
  streaming.use("*", spillwayHono(client(), "ts-hono-stream", (c) => ({ user: c.req.header("x-user") })));
  streaming.get("/stream", () => {
    let sent = 0;
    const body = new ReadableStream({
      async pull(controller) {
        if (sent === 1) await sleep(2500);
        if (sent === 2) return controller.close();
        controller.enqueue(new TextEncoder().encode(`part ${sent};`));
        sent += 1;
      },
    });
    return new Response(body);
  });
  const first = await streaming.request("/stream", { headers: { "x-user": "kim" } });
  assert.equal(first.status, 200);
  const text = first.text();
  await sleep(1500);
  assert.equal((await streaming.request("/stream", { headers: { "x-user": "kim" } })).status, 429, "the lease went back before the body was sent");
  assert.equal(await text, "part 0;part 1;");
  const sent = Date.now();
  while ((await remaining("ts-hono-stream", "kim", "one")) !== 1) {
    assert.ok(Date.now() - sent < 5000, "the streamed body's lease was not released when it ended");
    await sleep(20);
  }
  console.log("Hono middleware: ok");
}

/** A URL nothing listens on (a port bound, then let go). */
async function closedPortUrl() {
  const free = net.createServer();
  await new Promise((r) => free.listen(0, "127.0.0.1", r));
  const url = `http://127.0.0.1:${free.address().port}`;
  await new Promise((r) => free.close(r));
  return url;
}

/** `promise`, or a failure naming `what` once `ms` have passed: a bound on a wait, not a verdict on speed. */
async function within(ms, what, promise) {
  let timer;
  const late = new Promise((_, reject) => { timer = setTimeout(() => reject(new Error(`${what}: not done after ${ms} ms`)), ms); });
  try {
    return await Promise.race([promise, late]);
  } finally {
    clearTimeout(timer);
  }
}

/** Waits until `condition()` holds, for at most `ms`. */
async function eventually(what, condition, ms = 5000) {
  const started = Date.now();
  while (!(await condition())) {
    assert.ok(Date.now() - started < ms, what);
    await sleep(20);
  }
}

async function callerLimits() {
  const spillway = client();
  const ada = { user: "ada" };
  const plan = { limits: { hourly: { limit: 5 } } };
  let d;
  for (let i = 0; i < 5; i++) {
    d = await spillway.check("ts-limits", ada, 1, plan);
    assert.ok(d.allowed && d.answer.limit === 5, JSON.stringify(d));
  }
  // The headers describe the limit applied.
  assert.ok(new Map(d.headers).get("ratelimit-policy").includes("q=5"), JSON.stringify(d.headers));
  const denied = await spillway.check("ts-limits", ada, 1, plan);
  assert.equal(denied.outcome, "limited");
  assert.equal(denied.answer.limit, 5);
  // Each set of numbers is a counter of its own, and so is its remembered denial: the rule's
  // own numbers still let ada through.
  const own = await spillway.check("ts-limits", ada);
  assert.ok(own.allowed && !own.fromCache && own.answer.limit === 2, JSON.stringify(own));
  assert.ok((await spillway.check("ts-limits", ada, 1, plan)).fromCache);
  const bigger = await spillway.check("ts-limits", ada, 1, { limits: { hourly: { limit: 10 } } });
  assert.ok(bigger.allowed && bigger.answer.remaining === 9, JSON.stringify(bigger));
  // Over the rule's caller_max: a configuration error naming the field.
  const over = await spillway.check("ts-limits", ada, 1, { limits: { hourly: { limit: 5000 } } });
  assert.equal(over.outcome, "misconfigured");
  assert.equal(over.status, 400);
  assert.ok(over.detail.includes("limits.hourly.limit"), over.detail);
  // The middleware sends each request's limits (a customer's plan).
  const app = new Hono();
  app.use("*", spillwayHono(client(), "ts-limits", (c) => ({ user: c.req.header("x-user") }), { limits: (c) => ({ hourly: { limit: Number(c.req.header("x-plan")) } }) }));
  app.get("/work", (c) => c.text("done"));
  for (let i = 0; i < 3; i++) assert.equal((await app.request("/work", { headers: { "x-user": "eve", "x-plan": "3" } })).status, 200);
  const refused = await app.request("/work", { headers: { "x-user": "eve", "x-plan": "3" } });
  assert.equal(refused.status, 429);
  assert.ok(refused.headers.get("ratelimit-policy").includes("q=3"), refused.headers.get("ratelimit-policy"));
  assert.equal((await app.request("/work", { headers: { "x-user": "eve", "x-plan": "4" } })).status, 200);
  console.log("caller limits: ok");
}

async function batch() {
  const spillway = client();
  const ada = { user: "ada" };
  const bob = { user: "bob" };
  const decisions = await spillway.checkBatch([
    { policy: "ts-batch", identifiers: ada },
    { policy: "ts-batch", identifiers: bob, cost: 1 },
    { policy: "ts-batch", identifiers: ada }, // ada's second of 1 an hour
    { policy: "ts-missing", identifiers: ada },
    { policy: "ts-batch", identifiers: { user: "cy" }, cost: 5 },
    { policy: "ts-limits", identifiers: { user: "dee" }, limits: { hourly: { limit: 3 } } },
  ]);
  assert.deepEqual(decisions.map((d) => d.outcome), ["allowed", "allowed", "limited", "misconfigured", "too_costly", "allowed"]);
  const [, , denied, missing, costly, planned] = decisions;
  assert.ok(denied.retryAfterSecs >= 1 && denied.retryAfterSecs <= 3600, String(denied.retryAfterSecs));
  assert.equal(new Map(denied.headers).get("retry-after"), String(denied.retryAfterSecs));
  assert.ok(!denied.allowed && !missing.allowed && missing.status === 404 && missing.detail.includes("ts-missing"), JSON.stringify(missing));
  assert.ok(costly.status === 422 && costly.detail.includes("hourly"), JSON.stringify(costly));
  assert.ok(planned.answer.limit === 3 && planned.answer.remaining === 2, JSON.stringify(planned));
  // The denial is remembered: neither a batch nor a check sends it again.
  const calls = await deniedCount("ts-batch");
  assert.ok((await spillway.checkBatch([{ policy: "ts-batch", identifiers: ada }]))[0].fromCache);
  assert.ok((await spillway.check("ts-batch", ada)).fromCache);
  assert.equal(await deniedCount("ts-batch"), calls);
  // More than a batch call takes (100): sent in parts, answered in order.
  const many = await spillway.checkBatch(Array.from({ length: 150 }, (_, i) => ({ policy: "ts-many", identifiers: { user: `u${i}` } })));
  assert.deepEqual(many.map((d) => d.answer.results[0].identifier), Array.from({ length: 150 }, (_, i) => `user=u${i}`));
  assert.ok(many.every((d) => d.allowed));
  assert.deepEqual(await spillway.checkBatch([]), []);
  // The failure modes apply to each check: nothing listening, and a wrong key.
  const downUrl = await closedPortUrl();
  for (const [mode, goesOn] of [["open", true], ["closed", false]]) {
    const two = [{ policy: "ts-batch", identifiers: ada }, { policy: "ts-many", identifiers: bob }];
    const down = new Spillway({ url: downUrl, key: KEY, failure: { unavailable: mode, misconfigured: "closed" }, logger: quiet, timeoutMs: TIMEOUT_MS });
    const ds = await down.checkBatch(two);
    assert.deepEqual(ds.map((d) => [d.outcome, d.allowed]), [["unavailable", goesOn], ["unavailable", goesOn]]);
    assert.ok(ds[0].detail.includes("ECONNREFUSED") && ds[0].detail.includes("/api/v1/check/batch"), ds[0].detail);
    const wrong = new Spillway({ url: URL, key: "spw_svc_wrong", failure: { unavailable: "closed", misconfigured: mode }, logger: quiet, timeoutMs: TIMEOUT_MS });
    assert.deepEqual((await wrong.checkBatch(two)).map((d) => [d.outcome, d.status, d.allowed]), [["misconfigured", 401, goesOn], ["misconfigured", 401, goesOn]]);
  }
  console.log("batch: ok");
}

async function peek() {
  const spillway = client();
  const ada = { user: "ada" };
  for (let i = 0; i < 3; i++) {
    const p = await spillway.peek("ts-peek", ada);
    assert.ok(p.allowed && p.answer.remaining === 3, JSON.stringify(p));
  }
  assert.ok((await spillway.check("ts-peek", ada, 2)).allowed);
  assert.equal((await spillway.peek("ts-peek", ada)).answer.remaining, 1);
  assert.equal(await remaining("ts-peek", "ada", "hourly"), 1);
  // A denial of cost 2 is remembered; a peek is still asked of Spillway, and counts nothing.
  assert.equal((await spillway.check("ts-peek", ada, 2)).outcome, "limited");
  const after = await spillway.peek("ts-peek", ada);
  assert.ok(after.allowed && !after.fromCache && after.answer.remaining === 1, JSON.stringify(after));
  assert.ok((await spillway.check("ts-peek", ada, 2)).fromCache);
  // A peek holds no lease.
  const p = await spillway.peek("ts-wait-lease", ada);
  assert.ok(p.allowed && p.leases.length === 0, JSON.stringify(p));
  const held = await spillway.check("ts-wait-lease", ada);
  assert.ok(held.allowed && held.leases.length === 1);
  await spillway.release(held.leases);
  // A peek denied (a penalty box holding ada for an hour) is never remembered: once a reset
  // lifts the penalty, the next peek says so.
  assert.ok((await spillway.check("ts-penalty", ada)).allowed);
  assert.equal((await spillway.check("ts-penalty", ada)).outcome, "limited");
  const penalized = await spillway.peek("ts-penalty", ada);
  assert.ok(!penalized.allowed && penalized.retryAfterMs > 60000 && !penalized.fromCache, JSON.stringify(penalized));
  const reset = await fetch(`${URL}/api/v1/identifiers/user/ada?policy=ts-penalty&reason=peek`, { method: "DELETE", headers: ADMIN });
  assert.ok(reset.ok, await reset.text());
  const lifted = await spillway.peek("ts-penalty", ada);
  assert.ok(lifted.allowed && !lifted.fromCache && lifted.answer.remaining === 1, JSON.stringify(lifted));
  console.log("peek: ok");
}

async function adminHelpers() {
  const admin = new Admin({ url: URL, key: process.env.SPILLWAY_ADMIN_KEY, timeoutMs: TIMEOUT_MS });
  const spillway = client();
  const ada = { user: "ada" };
  const vip = { user: "vip" };
  assert.ok((await spillway.check("ts-admin", ada)).allowed);
  assert.ok(!(await spillway.check("ts-admin", ada)).allowed);
  const done = await admin.reset("user", "ada", { policy: "ts-admin", reason: "the TypeScript client's test" });
  assert.equal(done.identifier, "user=ada");
  assert.deepEqual(done.policies, ["ts-admin"]);
  assert.ok(done.deleted_keys >= 1 && done.undo.token, JSON.stringify(done));
  assert.equal((await spillway.peek("ts-admin", ada)).answer.remaining, 1);
  // Only that policy: ada's other counters are as they were.
  assert.equal(await remaining("ts-cache", "ada", "hourly"), 0);
  await admin.undoReset(done.undo.token);
  assert.equal((await spillway.peek("ts-admin", ada)).answer.remaining, 0);
  // A value with a slash and a space is one path segment.
  assert.ok((await spillway.check("ts-admin", { user: "a/b c" })).allowed);
  const odd = await admin.reset("user", "a/b c", { reason: "a value with a slash" });
  assert.ok(odd.identifier === "user=a/b c" && odd.policies.includes("ts-admin"), JSON.stringify(odd));
  assert.ok((await admin.inspect("user", "a/b c")).policies.some((p) => p.policy === "ts-admin"));
  // Overrides: added, in force at once, removed by their match.
  const added = await admin.addOverride("ts-admin", { match: "user=vip", action: "unlimited", reason: "a partner" });
  assert.deepEqual(added.overrides.map((o) => o.match), ["user=vip"]);
  for (let i = 0; i < 3; i++) assert.ok((await spillway.check("ts-admin", vip)).allowed);
  const removed = await admin.removeOverride("ts-admin", "user=vip");
  assert.deepEqual(removed.overrides, []);
  assert.deepEqual(await admin.overrides("ts-admin"), []);
  assert.ok((await spillway.check("ts-admin", vip)).allowed);
  assert.ok(!(await spillway.check("ts-admin", vip)).allowed);
  await admin.addOverride("ts-admin", { match: "user=blocked", action: "block" });
  assert.ok(!(await spillway.check("ts-admin", { user: "blocked" })).allowed);
  assert.deepEqual((await admin.removeOverride("ts-admin", 0)).overrides, []);
  // Refusals throw, naming the call and Spillway's reason.
  for (const [call, status, words] of [
    [() => admin.removeOverride("ts-admin", 0), 404, "overrides/0"],
    [() => admin.removeOverride("ts-admin", "user=nobody"), 404, "user=nobody"],
    [() => admin.reset("user", "ada", { policy: "ts-missing", reason: "no such policy" }), 404, "ts-missing"],
  ]) {
    await assert.rejects(call(), (e) => e instanceof SpillwayError && e.status === status && e.message.includes(words), words);
  }
  const notAdmin = new Admin({ url: URL, key: KEY, timeoutMs: TIMEOUT_MS });
  await assert.rejects(notAdmin.reset("user", "ada", { reason: "with a service key" }), (e) => {
    assert.ok([401, 403].includes(e.status) && e.message.includes(`DELETE ${URL}/api/v1/identifiers/user/ada`) && e.problem.status === e.status, e.message);
    return true;
  });
  console.log("admin reset and overrides: ok");
}

async function waiting() {
  const spillway = client();
  const ada = { user: "ada" };
  // Denied for up to an hour (a sliding window: no clock-aligned window ends meanwhile): a
  // wait of at most 1 s returns the denial within it (the outer bound turns a wait past it
  // into a failure; the slack is for a busy machine).
  assert.ok((await spillway.check("ts-wait-long", ada)).allowed);
  let started = performance.now();
  let d = await within(30000, "a wait of at most 1 s", spillway.waitUntilAllowed("ts-wait-long", ada, { maxWaitMs: 1000 }));
  let waited = performance.now() - started;
  assert.ok(d.outcome === "limited" && d.retryAfterMs > 1000, JSON.stringify(d));
  assert.ok(waited < 1000 + 2000, `waited ${waited} ms past a maxWaitMs of 1000`);
  // A denial of a 1 s window is waited out.
  await spillway.check("ts-wait", ada);
  d = await within(30000, "a wait for a 1 s window", spillway.waitUntilAllowed("ts-wait", ada, { maxWaitMs: 20000 }));
  assert.ok(d.allowed, JSON.stringify(d));
  // A concurrency rule's slot may free at any moment: waited for in hints of at most 1 s, and
  // never past the deadline.
  const other = client();
  const held = await other.check("ts-wait-lease", ada);
  assert.ok(held.allowed);
  started = performance.now();
  const short = await within(30000, "a wait of at most 300 ms", spillway.waitUntilAllowed("ts-wait-lease", ada, { maxWaitMs: 300 }));
  waited = performance.now() - started;
  assert.equal(short.outcome, "limited");
  assert.ok(waited >= 250 && waited < 300 + 2000, `waited ${waited} ms for a maxWaitMs of 300`);
  const freeing = sleep(500).then(() => other.release(held.leases));
  d = await within(30000, "a wait for a slot", spillway.waitUntilAllowed("ts-wait-lease", ada, { maxWaitMs: 20000 }));
  await freeing;
  assert.ok(d.allowed, JSON.stringify(d));
  await spillway.release(d.leases);
  // An unavailable check is answered as it came, with no wait.
  const down = new Spillway({ url: await closedPortUrl(), key: KEY, failure: { unavailable: "open", misconfigured: "closed" }, logger: quiet, timeoutMs: TIMEOUT_MS });
  d = await within(30000, "a wait on nothing listening", down.waitUntilAllowed("ts-wait", ada, { maxWaitMs: 60000 }));
  assert.ok(d.outcome === "unavailable" && d.allowed, JSON.stringify(d));
  console.log("wait until allowed: ok");
}

/**
 * An HTTP server that takes requests and answers none, until `answer` is set (then it answers
 * each a 200 allowed check). It counts the requests that reached it (fetch opens connections
 * ahead of need, so connections are no count of calls) and those it answered.
 */
class HungServer {
  answer = false;
  answered = 0;
  requests = 0;
  markers = new Set();

  async start() {
    this.server = http.createServer((req, res) => {
      if (req.url.startsWith("/marker-")) {
        this.markers.add(req.url);
        return;
      }
      this.requests += 1;
      if (!this.answer) return; // held: never answered
      req.resume();
      req.on("end", () => {
        this.answered += 1;
        res.writeHead(200, { "content-type": "application/json" });
        res.end(JSON.stringify({ allowed: true, policy: "ts-hung", policy_version: 1, mode: "enforce", degraded: false, unmatched: false, results: [] }));
      });
    });
    await new Promise((r) => this.server.listen(0, "127.0.0.1", r));
    this.port = this.server.address().port;
    this.url = `http://127.0.0.1:${this.port}`;
    return this;
  }

  /**
   * How many requests the clients made so far: every earlier request's bytes are in the
   * kernel before a marker request of our own is even connected, so once the marker is
   * seen (and the event loop has turned once more), every earlier one is counted.
   */
  async reached() {
    const path = `/marker-${this.markers.size}`;
    const marker = net.connect(this.port, "127.0.0.1");
    await once(marker, "connect");
    marker.write(`GET ${path} HTTP/1.1\r\nhost: marker\r\n\r\n`);
    await eventually("the hung server saw no request for 30 s", () => this.markers.has(path), 30000);
    await sleep(20);
    marker.destroy();
    return this.requests;
  }

  close() {
    this.server.closeAllConnections();
    this.server.close();
  }
}

async function circuitBreaker() {
  const ada = { user: "ada" };
  const hung = await new HungServer().start();
  const period = 1500;
  const failOpen = { unavailable: "open", misconfigured: "closed" };
  const spillway = new Spillway({ url: hung.url, key: KEY, failure: failOpen, timeoutMs: 100, breaker: { failures: 3, periodMs: period }, logger: quiet });
  // Three timeouts in a row: each a call to the hung server, each waiting its 100 ms out.
  for (let i = 0; i < 3; i++) {
    const started = performance.now();
    const d = await spillway.check("ts-hung", ada);
    const took = performance.now() - started;
    assert.ok(d.outcome === "unavailable" && d.allowed && !d.fromBreaker && d.detail.includes("timed out after 100 ms"), JSON.stringify(d));
    assert.ok(took >= 90, `a call to the hung server took ${took} ms, less than its timeout`);
  }
  // Each reached it (a call the timeout cut before its request was sent, on a stalled machine,
  // would not have: the count is an upper bound, the decisions say the rest).
  let reached = await hung.reached();
  assert.ok(reached >= 1 && reached <= 3, String(reached));
  // Open: answered at once as the failure mode says, saying why, and nothing is sent.
  const started = performance.now();
  for (let i = 0; i < 20; i++) {
    const d = await spillway.check("ts-hung", ada);
    assert.ok(d.outcome === "unavailable" && d.allowed && d.fromBreaker, JSON.stringify(d));
    assert.ok(d.detail.includes("circuit breaker open after 3 failures") && d.detail.includes("timed out after 100 ms"), d.detail);
  }
  // Twenty calls that each waited out the timeout would take 2 s at least.
  const took = performance.now() - started;
  assert.ok(took < 1000, `20 checks through an open breaker took ${took} ms`);
  assert.equal(await hung.reached(), reached, "an open breaker let a call through");
  await assert.rejects(spillway.report("ts-hung", ada, 1), (e) => e instanceof SpillwayError && e.message.includes("circuit breaker open"));
  const closedMode = new Spillway({ url: hung.url, key: KEY, failure: CLOSED, timeoutMs: 100, breaker: { failures: 1 }, logger: quiet });
  let d = await closedMode.check("ts-hung", ada);
  assert.ok(!d.fromBreaker && !d.allowed, JSON.stringify(d));
  d = await closedMode.check("ts-hung", ada);
  assert.ok(d.fromBreaker && !d.allowed && d.problem().status === 503, JSON.stringify(d));
  assert.ok((await hung.reached()) <= reached + 1, "an open breaker let a call through");
  reached = await hung.reached();
  // The period over: one trial call, the others answered by the breaker meanwhile.
  await sleep(period + 200);
  const tried = await Promise.all(Array.from({ length: 5 }, () => spillway.check("ts-hung", ada)));
  assert.equal(tried.filter((t) => !t.fromBreaker).length, 1, JSON.stringify(tried));
  assert.ok(tried.every((t) => t.outcome === "unavailable" && t.allowed), JSON.stringify(tried));
  assert.ok(tried.some((t) => (t.detail ?? "").includes("a trial call is under way")), JSON.stringify(tried));
  const trial = (await hung.reached()) - reached;
  assert.ok(trial <= 1, `${trial} calls reached the hung server during the trial`);
  reached += trial;
  // The trial failed: open again for a period.
  d = await spillway.check("ts-hung", ada);
  assert.ok(d.fromBreaker && d.detail.includes("not calling Spillway for another"), JSON.stringify(d));
  assert.equal(await hung.reached(), reached);
  // Spillway answers again: the next trial succeeds and closes the breaker.
  hung.answer = true;
  await sleep(period + 200);
  d = await spillway.check("ts-hung", ada);
  assert.ok(d.outcome === "allowed" && !d.fromBreaker, JSON.stringify(d));
  for (let i = 0; i < 3; i++) assert.equal((await spillway.check("ts-hung", ada)).outcome, "allowed");
  assert.equal(hung.answered, 4);
  // Off: every call is made.
  const off = new Spillway({ url: hung.url, key: KEY, failure: failOpen, timeoutMs: 100, breaker: false, logger: quiet });
  hung.answer = false;
  for (let i = 0; i < 4; i++) {
    d = await off.check("ts-hung", ada);
    assert.ok(d.outcome === "unavailable" && !d.fromBreaker, JSON.stringify(d));
  }
  hung.close();
  console.log("circuit breaker: ok");
}

async function errorCauses() {
  const ada = { user: "ada" };
  const lines = [];
  const logger = { warn: (line) => lines.push(line), error: (line) => lines.push(line) };
  const failOpen = { unavailable: "open", misconfigured: "closed" };
  const down = await closedPortUrl();
  const port = down.split(":").pop();
  let spillway = new Spillway({ url: down, key: KEY, failure: failOpen, timeoutMs: TIMEOUT_MS, breaker: false, logger });
  const d = await spillway.check("ts-cause", ada);
  const refused = `connect ECONNREFUSED 127.0.0.1:${port} calling ${down}/api/v1/check`;
  assert.equal(d.outcome, "unavailable");
  assert.equal(d.detail, refused);
  await assert.rejects(spillway.report("ts-cause", ada, 1), (e) => {
    assert.equal(e.message, `Spillway is unavailable: connect ECONNREFUSED 127.0.0.1:${port} calling ${down}/api/v1/report`);
    assert.equal(e.status, undefined);
    return e instanceof SpillwayError;
  });
  // Through withLease, the refusal says why too.
  await assert.rejects(new Spillway({ url: down, key: KEY, failure: CLOSED, logger: quiet }).withLease("ts-cause", ada, async () => {}), (e) => e instanceof Refused && e.message.includes("ECONNREFUSED"));
  const hung = await new HungServer().start();
  spillway = new Spillway({ url: hung.url, key: KEY, failure: failOpen, timeoutMs: 100, breaker: false, logger });
  const timedOut = `timed out after 100 ms calling ${hung.url}/api/v1/check`;
  assert.equal((await spillway.check("ts-cause", ada)).detail, timedOut);
  await assert.rejects(spillway.release(["a-lease"]), (e) => e instanceof SpillwayError && e.message.includes(`timed out after 100 ms calling ${hung.url}/api/v1/leases/release`));
  hung.close();
  // A refusal names the call and Spillway's reason.
  spillway = client();
  await assert.rejects(spillway.report("ts-missing", ada, 1), (e) => {
    assert.ok(e.status === 404 && e.message.includes(`POST ${URL}/api/v1/report (404)`) && e.message.includes("ts-missing"), e.message);
    assert.ok(e.problem.type.endsWith("unknown-policy"), JSON.stringify(e.problem));
    return true;
  });
  // The warning lines say the same.
  assert.ok(lines.some((l) => l.includes(refused)), lines.join("\n"));
  assert.ok(lines.some((l) => l.includes(timedOut)), lines.join("\n"));
  console.log("error causes: ok");
}

async function fakeUnderExpress() {
  const fake = new FakeSpillway({ "ts-fake": { limit: 2, windowMs: 60000, concurrency: 5 } });
  const app = express();
  app.use(spillwayExpress(fake, "ts-fake", (req) => ({ user: req.get("x-user") })));
  app.get("/work", (_req, res) => res.send("done"));
  const server = await new Promise((r) => { const s = app.listen(0, "127.0.0.1", () => r(s)); });
  const base = `http://127.0.0.1:${server.address().port}`;
  const get = (who) => fetch(`${base}/work`, { headers: who ? { "x-user": who } : {} });
  for (let i = 0; i < 2; i++) {
    const r = await get("ada");
    assert.equal(r.status, 200);
    assert.equal(await r.text(), "done");
    const policy = r.headers.get("ratelimit-policy");
    assert.ok(policy.includes('"window";q=2;w=60') && policy.includes("in-flight") && r.headers.has("ratelimit"), policy);
  }
  let r = await get("ada");
  assert.equal(r.status, 429);
  assert.equal(r.headers.get("content-type").split(";")[0], "application/problem+json");
  const retry = Number(r.headers.get("retry-after"));
  assert.ok(retry >= 1 && retry <= 60, String(retry));
  assert.equal((await r.json()).retry_after, retry);
  // Each allowed request's lease was released once it was answered.
  await eventually("the fake's leases released", () => fake.inFlight("ts-fake", { user: "ada" }) === 0);
  assert.equal(fake.calls.filter((c) => c.method === "release").length, 2);
  // Told to deny, once.
  fake.deny("ts-fake", { retryAfterMs: 30000, times: 1 });
  r = await get("bob");
  assert.ok(r.status === 429 && r.headers.get("retry-after") === "30", String(r.status));
  assert.equal((await get("bob")).status, 200);
  // Told Spillway is unavailable: the failure mode answers.
  fake.unavailable();
  assert.equal((await get("cy")).status, 503);
  fake.restore();
  assert.equal((await get("cy")).status, 200);
  assert.equal((await get()).status, 200, "no identifiers: unchecked");
  // The window ends.
  fake.advance(61000);
  assert.equal((await get("ada")).status, 200);
  server.close();
  assert.deepEqual(fake.checks("ts-fake").map((c) => c.identifiers.user), ["ada", "ada", "ada", "bob", "bob", "cy", "cy", "ada"]);
  await eventually("the fake's leases released", () => fake.inFlight("ts-fake", { user: "ada" }) === 0);
  // The rest of the interface behaves as the client's.
  const ada = { user: "ada" };
  assert.equal((await fake.peek("ts-fake", ada)).answer.remaining, 1);
  const batch = await fake.checkBatch([
    { policy: "ts-fake", identifiers: ada },
    { policy: "ts-fake", identifiers: ada },
    { policy: "nope", identifiers: ada },
  ]);
  assert.deepEqual(batch.map((b) => b.outcome), ["allowed", "limited", "misconfigured"]);
  await fake.release(batch[0].leases);
  const planned = await fake.check("ts-fake", ada, 1, { limits: { window: { limit: 10 } } });
  const window = planned.answer.results.find((x) => x.rule === "window");
  assert.ok(planned.allowed && window.limit === 10 && window.identifier === "user=ada", JSON.stringify(planned));
  await fake.release(planned.leases);
  fake.advance(61000);
  const value = await fake.reserve("ts-fake", ada, 2, async () => {
    assert.equal(fake.inFlight("ts-fake", ada), 1);
    return { value: "reserved", used: 1 };
  });
  assert.equal(value, "reserved");
  assert.deepEqual(fake.calls.slice(-2).map((c) => [c.method, c.cost]), [["release", undefined], ["report", -1]]);
  assert.equal(fake.inFlight("ts-fake", ada), 0);
  await fake.withLease("ts-fake", ada, async (decision) => assert.ok(decision.allowed && decision.leases.length === 1));
  fake.deny("ts-fake", { retryAfterMs: 200, times: 1 });
  const d = await within(30000, "the fake's wait", fake.waitUntilAllowed("ts-fake", { user: "dee" }, { maxWaitMs: 10000 }));
  assert.ok(d.allowed, JSON.stringify(d));
  assert.deepEqual(fake.checks().slice(-2).map((c) => c.identifiers), [{ user: "dee" }, { user: "dee" }]);
  await fake.release(d.leases);
  // And the Hono middleware takes it too.
  const hono = new Hono();
  hono.use("*", spillwayHono(fake, "ts-fake", (c) => ({ user: c.req.header("x-user") })));
  hono.get("/work", (c) => c.text("done"));
  for (const status of [200, 200, 429]) {
    const r = await hono.request("/work", { headers: { "x-user": "eve" } });
    assert.equal(r.status, status);
    // Read to its end: the body holds its lease until then.
    await r.text();
  }
  assert.equal(fake.inFlight("ts-fake", { user: "eve" }), 0);
  console.log("fake under the Express middleware: ok");
}

await setup();
await denialCache();
await leases();
await reserve();
await failureModes();
await expressMiddleware();
await honoMiddleware();
await callerLimits();
await batch();
await peek();
await adminHelpers();
await waiting();
await circuitBreaker();
await errorCauses();
await fakeUnderExpress();
