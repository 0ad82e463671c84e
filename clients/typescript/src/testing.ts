/**
 * An in-memory Spillway for a service's own tests: the client's interface (`check`, `peek`,
 * `checkBatch`, `waitUntilAllowed`, `withLease`, `reserve`, `holdLeases`, `report`, `release`,
 * `renew`), counting in memory, so the Express and Hono middleware run without a server.
 *
 * ```ts
 * import { FakeSpillway } from "spillway-client/testing";
 * const fake = new FakeSpillway({ api: { limit: 2, windowMs: 60_000, concurrency: 4 } });
 * app.use(spillwayExpress(fake, "api", (req) => ({ user: req.get("x-user") })));
 * fake.deny("api");            // the next checks of api are denied (until fake.restore())
 * fake.unavailable({ times: 1 }); // the next check finds Spillway unavailable
 * assert.deepEqual(fake.checks("api").map((c) => c.identifiers), [{ user: "ada" }]);
 * ```
 *
 * Each policy is a fixed window per identifiers (`limit` per `windowMs`, the window starting
 * at its first check) and, with `concurrency`, at most that many leases in flight (each held
 * `leaseMs` unless renewed). It answers as Spillway does: bodies and RateLimit headers of the
 * same shape, 429 denials with Retry-After, a cost over the limit `too_costly`, an unknown
 * policy or an unknown rule in `limits` `misconfigured` (404, 400), the failure modes chosen
 * as for `Spillway`. It is a fake, not a model: one window rule and one concurrency rule per
 * policy, no `caller_max` (any `limits` number is taken), no overrides, no denial cache.
 */
import {
  Decision,
  SpillwayBase,
  SpillwayError,
  type BatchCheck,
  type CheckAnswer,
  type CheckOptions,
  type Failure,
  type Identifiers,
  type Limits,
  type Logger,
  type RuleResult,
} from "./index.js";

/** A policy's window when none is given. */
export const DEFAULT_WINDOW_MS = 60_000;
/** How long a lease lasts unless renewed. */
export const DEFAULT_LEASE_MS = 30_000;
/** A concurrency denial's Retry-After at most, as Spillway's (a slot frees whenever one is released). */
export const CONCURRENCY_RETRY_HINT_MS = 1000;

export interface FakePolicy {
  /** Checks' cost allowed per window (no window rule when left out). */
  limit?: number;
  /** 60 s unless said. */
  windowMs?: number;
  /** The window rule's name; `window` unless said. */
  rule?: string;
  /** Leases in flight at most (no concurrency rule when left out). */
  concurrency?: number;
  /** 30 s unless said. */
  leaseMs?: number;
  /** The concurrency rule's name; `in-flight` unless said. */
  concurrencyRule?: string;
}

export interface FakeOptions {
  /** Closed for both unless said (a test sees what a refusal does). */
  failure?: Failure;
  /** The fake's clock in ms (`Date.now` unless said); `advance(ms)` moves it on too. */
  now?: () => number;
  /** Where the lease helpers' warnings go; console unless said. */
  logger?: Logger;
}

/** One call the code under test made. */
export interface FakeCall {
  method: "check" | "peek" | "checkBatch" | "report" | "release" | "renew";
  policy?: string;
  identifiers?: Identifiers;
  cost?: number;
  limits?: Limits;
  leases?: string[];
}

export interface Times {
  /** How many checks it applies to; every one until `restore()` unless said. */
  times?: number;
}

interface Forced {
  kind: "deny" | "unavailable" | "misconfigured";
  policy: string | undefined;
  times: number | undefined;
  retryAfterMs: number;
  status: number;
}

interface Spec {
  rule: string;
  limit: number | undefined;
  windowMs: number;
  concurrency: number | undefined;
  leaseMs: number;
  concurrencyRule: string;
}

function spec(given: number | FakePolicy): Spec {
  const p: FakePolicy = typeof given === "number" ? { limit: given } : given;
  const known = ["limit", "windowMs", "rule", "concurrency", "leaseMs", "concurrencyRule"];
  const unknown = Object.keys(p).filter((k) => !known.includes(k));
  if (unknown.length > 0) throw new TypeError(`a fake policy takes ${known.join(", ")}; not ${unknown.join(", ")}`);
  return {
    rule: p.rule ?? "window",
    limit: p.limit,
    windowMs: p.windowMs ?? DEFAULT_WINDOW_MS,
    concurrency: p.concurrency,
    leaseMs: p.leaseMs ?? DEFAULT_LEASE_MS,
    concurrencyRule: p.concurrencyRule ?? "in-flight",
  };
}

function idsKey(identifiers: Identifiers): string {
  return Object.keys(identifiers).sort().map((k) => `${k}=${identifiers[k]}`).join("&");
}

export class FakeSpillway extends SpillwayBase {
  readonly failure: Failure;
  /** Every call made, in order. */
  readonly calls: FakeCall[] = [];
  private readonly policies = new Map<string, Spec>();
  private readonly clock: () => number;
  private skew = 0;
  private readonly windows = new Map<string, { ends: number; used: number }>();
  private readonly heldLeases = new Map<string, { policy: string; ids: string; ends: number }>();
  private forced: Forced[] = [];
  private nextLease = 1;

  /** `policies` maps each policy's name to its limit per window (a number) or to a FakePolicy. */
  constructor(policies: Record<string, number | FakePolicy> = {}, options: FakeOptions = {}) {
    super(options.logger ?? console);
    for (const [name, given] of Object.entries(policies)) this.policies.set(name, spec(given));
    this.failure = options.failure ?? { unavailable: "closed", misconfigured: "closed" };
    this.clock = options.now ?? Date.now;
  }

  // --- what a test tells it -------------------------------------------------------------

  /** The next checks (of `policy`; of any when left out) are denied, `retryAfterMs` to wait (1 s unless said). */
  deny(policy?: string, options: Times & { retryAfterMs?: number } = {}): void {
    this.forced.push({ kind: "deny", policy, times: options.times, retryAfterMs: options.retryAfterMs ?? 1000, status: 429 });
  }

  /** The next checks find Spillway unavailable (answered as `failure.unavailable` says), and
   * `report`, `release` and `renew` throw SpillwayError meanwhile. */
  unavailable(policy?: string, options: Times = {}): void {
    this.forced.push({ kind: "unavailable", policy, times: options.times, retryAfterMs: 0, status: 503 });
  }

  /** The next checks are refused as a configuration error (answered as `failure.misconfigured` says). */
  misconfigured(policy?: string, options: Times & { status?: number } = {}): void {
    this.forced.push({ kind: "misconfigured", policy, times: options.times, retryAfterMs: 0, status: options.status ?? 404 });
  }

  /** Ends every `deny`, `unavailable` and `misconfigured`. */
  restore(): void {
    this.forced = [];
  }

  /** Moves the fake's clock on: windows end and leases run out without waiting. */
  advance(ms: number): void {
    this.skew += ms;
  }

  /** The checks made (`check`, `peek`, each of a `checkBatch`), of `policy` or all. */
  checks(policy?: string): FakeCall[] {
    return this.calls.filter((c) => (c.method === "check" || c.method === "peek" || c.method === "checkBatch") && (policy === undefined || c.policy === policy));
  }

  /** Leases held now by `identifiers` under `policy`. */
  inFlight(policy: string, identifiers: Identifiers): number {
    const ids = idsKey(identifiers);
    const now = this.now();
    return [...this.heldLeases.values()].filter((l) => l.policy === policy && l.ids === ids && l.ends > now).length;
  }

  // --- the client's interface -----------------------------------------------------------

  async check(policy: string, identifiers: Identifiers, cost = 1, options: CheckOptions = {}): Promise<Decision> {
    return this.decide(cost === 0 ? "peek" : "check", policy, identifiers, cost, options.limits);
  }

  async checkBatch(checks: BatchCheck[]): Promise<Decision[]> {
    return checks.map((c) => this.decide("checkBatch", c.policy, c.identifiers, c.cost ?? 1, c.limits));
  }

  async report(policy: string, identifiers: Identifiers, cost: number): Promise<void> {
    this.calls.push({ method: "report", policy, identifiers: { ...identifiers }, cost });
    this.throwIfUnavailable("report");
    const s = this.policies.get(policy);
    if (!s) throw new SpillwayError(`Spillway refused POST fake/api/v1/report (404): policy: no policy named "${policy}"`, 404);
    if (s.limit !== undefined) {
      const key = `${policy}\u0000${idsKey(identifiers)}\u0000${s.limit}`;
      const w = this.window(key, s);
      this.windows.set(key, { ends: w.ends, used: Math.max(0, w.used + cost) });
    }
  }

  async release(leases: string[]): Promise<void> {
    if (leases.length === 0) return;
    this.calls.push({ method: "release", leases: [...leases] });
    this.throwIfUnavailable("leases/release");
    for (const lease of leases) this.heldLeases.delete(lease);
  }

  async renew(leases: string[]): Promise<void> {
    if (leases.length === 0) return;
    this.calls.push({ method: "renew", leases: [...leases] });
    this.throwIfUnavailable("leases/renew");
    const now = this.now();
    for (const lease of leases) {
      const held = this.heldLeases.get(lease);
      const s = held && this.policies.get(held.policy);
      if (held && s && held.ends > now) held.ends = now + s.leaseMs;
    }
  }

  // --- deciding -------------------------------------------------------------------------

  private now(): number {
    return this.clock() + this.skew;
  }

  private forcedFor(policy: string): Forced | undefined {
    for (const f of this.forced) {
      if ((f.policy === undefined || f.policy === policy) && f.times !== 0) {
        if (f.times !== undefined) f.times -= 1;
        return f;
      }
    }
    return undefined;
  }

  private throwIfUnavailable(path: string): void {
    if (this.forced.some((f) => f.kind === "unavailable" && f.times !== 0)) {
      throw new SpillwayError(`Spillway is unavailable: FakeSpillway.unavailable() says so (POST fake/api/v1/${path})`);
    }
  }

  private window(key: string, s: Spec): { ends: number; used: number } {
    const now = this.now();
    const w = this.windows.get(key);
    return w && w.ends > now ? w : { ends: now + s.windowMs, used: 0 };
  }

  private misconfiguredDecision(status: number, detail: string): Decision {
    return new Decision("misconfigured", this.failure.misconfigured === "open", undefined, [], undefined, false, status, detail);
  }

  private decide(method: FakeCall["method"], policy: string, identifiers: Identifiers, cost: number, limits: Limits | undefined): Decision {
    this.calls.push({ method, policy, identifiers: { ...identifiers }, cost, ...(limits ? { limits } : {}) });
    const forced = this.forcedFor(policy);
    if (forced?.kind === "unavailable") {
      return new Decision("unavailable", this.failure.unavailable === "open", undefined, [], undefined, false, undefined, "FakeSpillway.unavailable() says so");
    }
    if (forced?.kind === "misconfigured") return this.misconfiguredDecision(forced.status, "FakeSpillway.misconfigured() says so");
    const s = this.policies.get(policy);
    if (!s) return this.misconfiguredDecision(404, `policy: no policy named "${policy}"`);
    let limit = s.limit;
    for (const [rule, numbers] of Object.entries(limits ?? {})) {
      const keys = Object.keys(numbers);
      if (rule !== s.rule || s.limit === undefined || keys.length !== 1 || keys[0] !== "limit") {
        return this.misconfiguredDecision(400, `limits.${rule}: the fake's policy ${policy} takes only ${s.rule}.limit`);
      }
      limit = numbers.limit ?? limit;
    }
    const ids = idsKey(identifiers);
    const now = this.now();
    const results: RuleResult[] = [];
    let allowed = true;
    let counted: { key: string; ends: number; used: number } | undefined;
    if (limit !== undefined) {
      if (cost > limit) {
        return new Decision("too_costly", false, undefined, [], undefined, false, 422, `cost: ${cost} is more than rule ${s.rule} ever admits (${limit})`);
      }
      const key = `${policy}\u0000${ids}\u0000${limit}`;
      const w = this.window(key, s);
      const ok = w.used + cost <= limit;
      results.push(result(s.rule, ids, "fixed_window", ok, limit, limit - w.used, w.ends - now, ok ? undefined : w.ends - now));
      allowed = ok;
      counted = { key, ...w };
    }
    if (s.concurrency !== undefined) {
      // Leases neither released nor renewed run out, as Spillway's do.
      for (const [id, held] of this.heldLeases) if (held.ends <= now) this.heldLeases.delete(id);
      const live = [...this.heldLeases.values()].filter((l) => l.policy === policy && l.ids === ids);
      const ok = cost === 0 || live.length < s.concurrency;
      const soonest = live.length > 0 ? Math.min(...live.map((l) => l.ends)) - now : 0;
      results.push(result(s.concurrencyRule, ids, "concurrency", ok, s.concurrency, s.concurrency - live.length, soonest, ok ? undefined : Math.min(soonest, CONCURRENCY_RETRY_HINT_MS)));
      allowed = allowed && ok;
    }
    if (forced?.kind === "deny") {
      allowed = false;
      if (results.length === 0) results.push(result(s.rule, ids, "fixed_window", false, 0, 0, 0, undefined));
      for (const r of results) {
        r.allowed = false;
        r.remaining = 0;
        r.retry_after_ms = r.reset_ms = Math.max(1, Math.ceil(forced.retryAfterMs));
      }
    }
    if (allowed && cost > 0) {
      // All or nothing, as Spillway: a denied check consumes nothing.
      for (const r of results) {
        if (r.algorithm === "fixed_window" && counted) {
          this.windows.set(counted.key, { ends: counted.ends, used: counted.used + cost });
          r.remaining -= cost;
        } else if (r.algorithm === "concurrency") {
          const lease = `fake-lease-${this.nextLease++}`;
          this.heldLeases.set(lease, { policy, ids, ends: now + s.leaseMs });
          r.lease = lease;
          r.remaining -= 1;
          r.reset_ms = s.leaseMs;
        }
      }
    }
    return this.decision(policy, s, results, allowed);
  }

  private decision(policy: string, s: Spec, results: RuleResult[], allowed: boolean): Decision {
    // The binding rule: of those that denied, the one to wait longest for; else the one with
    // least left.
    const denied = results.filter((r) => !r.allowed);
    const pool = denied.length > 0 ? denied : results;
    const score = (r: RuleResult) => (denied.length > 0 ? -(r.retry_after_ms ?? 0) : r.remaining / Math.max(r.limit, 1));
    const binding = pool.reduce<RuleResult | undefined>((best, r) => (best === undefined || score(r) < score(best) ? r : best), undefined);
    if (binding) binding.binding = true;
    const answer: CheckAnswer = {
      allowed,
      policy,
      policy_version: 1,
      mode: "enforce",
      limit: binding?.limit ?? null,
      remaining: binding?.remaining ?? null,
      reset_ms: binding?.reset_ms ?? null,
      retry_after_ms: binding?.retry_after_ms ?? null,
      degraded: false,
      unmatched: false,
      results,
    };
    const headers: [string, string][] = [];
    if (binding) {
      const quotas = results.map((r) => (r.algorithm === "concurrency" ? `"${r.rule}";q=${r.limit};qu="concurrent-requests"` : `"${r.rule}";q=${r.limit};w=${Math.ceil(s.windowMs / 1000)}`));
      headers.push(["ratelimit-policy", quotas.join(", ")]);
      headers.push(["ratelimit", `"${binding.rule}";r=${binding.remaining};t=${Math.ceil(binding.reset_ms / 1000)}`]);
    }
    if (allowed) return new Decision("allowed", true, answer, headers);
    const retry = answer.retry_after_ms ?? 1000;
    headers.push(["retry-after", String(Math.max(1, Math.ceil(retry / 1000)))]);
    return new Decision("limited", false, answer, headers, retry);
  }
}

function result(rule: string, identifier: string, algorithm: string, allowed: boolean, limit: number, remaining: number, resetMs: number, retryMs: number | undefined): RuleResult {
  return {
    rule,
    identifier,
    algorithm,
    allowed,
    limit,
    remaining: Math.max(0, remaining),
    reset_ms: Math.max(0, Math.ceil(resetMs)),
    retry_after_ms: retryMs === undefined ? null : Math.max(1, Math.ceil(retryMs)),
    binding: false,
  };
}
