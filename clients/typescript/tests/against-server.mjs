// The TypeScript client against a real Spillway (started by tests/it/clients.rs): failure
// modes, the denial cache, leases, reserve-then-report, the Express and Hono middleware.
// Prints one line per part; any failed assertion exits non-zero.
import assert from "node:assert/strict";
import net from "node:net";

import express from "express";
import { Hono } from "hono";

import { Refused, Spillway } from "../dist/index.js";
import { spillwayExpress } from "../dist/express.js";
import { spillwayHono } from "../dist/hono.js";

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
    "ts-slow": { rules: [{ name: "one", algorithm: "concurrency", limit: 1, lease_ms: 1000 }] },
    "ts-budget": { rules: [hourly(1000), { name: "one", algorithm: "concurrency", limit: 1, lease_ms: 1000 }] },
    "ts-export": { rules: [{ name: "one", algorithm: "concurrency", limit: 1, lease_ms: 30000 }] },
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
  console.log("Hono middleware: ok");
}

await setup();
await denialCache();
await leases();
await reserve();
await failureModes();
await expressMiddleware();
await honoMiddleware();
