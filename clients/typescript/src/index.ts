/**
 * The official TypeScript client of Spillway, a rate limiter service backed by Redis.
 *
 * ```ts
 * const spillway = new Spillway({ url: "http://spillway:3000", key,
 *   failure: { unavailable: "open", misconfigured: "closed" } });
 * const decision = await spillway.check("api", { user: "42" });
 * ```
 *
 * What it does that every service otherwise writes by hand: a timeout on every call, an
 * explicit fail-open or fail-closed choice for outages and for configuration errors, a
 * circuit breaker (a hung Spillway costs one timeout per period, not one per request), errors
 * that name their cause, the rate-limit headers to pass on, an RFC 9457 problem for end
 * users, a cache of denials until Retry-After (never for a concurrency rule), caller-supplied
 * limits, batches, peeks, a bounded wait, leases and reserve-then-report.
 *
 * `SpillwayClient` is what the middleware takes: `Spillway` calls a real Spillway,
 * `FakeSpillway` (from `spillway-client/testing`) counts in memory for a service's own tests.
 * `Admin` resets identifiers and manages overrides with an admin key.
 */
import { Breaker, BreakerOpen } from "./breaker.js";
import { SpillwayError, Unavailable, detailOf, refused, send, type Reply } from "./http.js";

export { Admin, DEFAULT_ADMIN_TIMEOUT_MS } from "./admin.js";
export type { AdminOptions, Inspection, Override, OverrideList, ResetOptions, ResetResult } from "./admin.js";
export { SpillwayError };

/** What a check that could not be decided means for the request. */
export type FailMode = "open" | "closed";

export interface Failure {
  /** Spillway unreachable: a network error, a timeout, a 5xx. */
  unavailable: FailMode;
  /** A configuration error: 401/403 (the key), 404 (no such policy), 400 (a strict policy's unmatched identifiers). */
  misconfigured: FailMode;
}

/** Where warnings go; `info` (optional) hears that the circuit breaker closed. */
export type Logger = Pick<Console, "warn" | "error"> & Partial<Pick<Console, "info">>;

export interface BreakerOptions {
  /** Unavailable calls in a row that open it; 5 unless said. */
  failures?: number;
  /** How long it stays open before a trial call; 5000 ms unless said. */
  periodMs?: number;
}

export interface Options {
  /** Spillway's base URL, `http://spillway:3000`. */
  url: string;
  /** A service key. */
  key: string;
  failure: Failure;
  /** Per call; 100 ms unless said. */
  timeoutMs?: number;
  /** The circuit breaker's numbers; `false` turns it off. */
  breaker?: BreakerOptions | false;
  /** Another fetch (tests, proxies). */
  fetch?: typeof fetch;
  /** Where warnings go; console unless said. */
  logger?: Logger;
}

/** How long a call may take before Spillway counts as unavailable. */
export const DEFAULT_TIMEOUT_MS = 100;
/** The circuit breaker's defaults: this many unavailable calls in a row open it, for this long. */
export const DEFAULT_BREAKER_FAILURES = 5;
export const DEFAULT_BREAKER_PERIOD_MS = 5000;
/** Most checks in one batch call (the server's limit); longer batches are sent in parts. */
export const MAX_BATCH = 100;

export type Identifiers = Record<string, string>;

/** Caller-supplied limits: `{ "<rule>": { limit: 500 } }`, each at most the rule's `caller_max`. */
export type Limits = Record<string, Record<string, number>>;

export interface CheckOptions {
  /** The named rules' numbers for this check only (a counter, and a cached denial, of their own). */
  limits?: Limits;
}

/** One check of a batch. */
export interface BatchCheck {
  policy: string;
  identifiers: Identifiers;
  /** 1 unless said. */
  cost?: number;
  limits?: Limits;
}

export interface WaitOptions {
  /** The longest the wait may last, from the call. */
  maxWaitMs: number;
  /** 1 unless said. */
  cost?: number;
  limits?: Limits;
}

export interface RuleResult {
  rule: string;
  identifier: string;
  algorithm: string;
  allowed: boolean;
  limit: number;
  remaining: number;
  reset_ms: number;
  retry_after_ms?: number | null;
  binding?: boolean;
  lease?: string | null;
}

export interface CheckAnswer {
  allowed: boolean;
  policy: string;
  policy_version: number;
  mode: "enforce" | "shadow";
  limit?: number | null;
  remaining?: number | null;
  reset_ms?: number | null;
  retry_after_ms?: number | null;
  degraded: boolean;
  unmatched: boolean;
  shadow_denied?: boolean | null;
  results: RuleResult[];
}

/**
 * `allowed`; `limited` (denied by a limit); `too_costly` (a cost no rule could ever allow,
 * 422); `unavailable` (network error, timeout, 5xx, or the circuit breaker open);
 * `misconfigured` (401, 403, 404, 400).
 */
export type Outcome = "allowed" | "limited" | "too_costly" | "unavailable" | "misconfigured";

export interface Problem {
  type: string;
  title: string;
  status: number;
  detail: string;
  retry_after?: number;
}

const PASSED_ON = ["ratelimit-policy", "ratelimit", "retry-after"] as const;
const CACHE_CAPACITY = 10_000;
/** A denial is remembered at most this long (a support reset or a new override then shows soon). */
export const MAX_CACHED_MS = 10_000;

export class Decision {
  constructor(
    readonly outcome: Outcome,
    /** Whether the request goes on: allowed, or undecided and failing open. */
    readonly allowed: boolean,
    readonly answer?: CheckAnswer,
    /** `RateLimit-Policy`, `RateLimit` and (denied) `Retry-After`, to copy onto the response. */
    readonly headers: [string, string][] = [],
    readonly retryAfterMs?: number,
    readonly fromCache = false,
    readonly status?: number,
    /** Why, for any outcome but `allowed` and `limited`: the cause of an unavailable check
     * (`connect ECONNREFUSED … calling …`, `timed out after 100 ms calling …`, `circuit
     * breaker open …`), Spillway's reason for a refusal. */
    readonly detail?: string,
    /** Answered by the open circuit breaker, with no call made. */
    readonly fromBreaker = false,
  ) {}

  /** No rule counted the identifiers (a lenient policy let the check through). */
  get unmatched(): boolean {
    return this.answer?.unmatched === true;
  }

  /** The leases of the check's concurrency rules. */
  get leases(): string[] {
    return (this.answer?.results ?? []).flatMap((r) => (r.lease ? [r.lease] : []));
  }

  get retryAfterSecs(): number | undefined {
    if (this.outcome !== "limited" || this.retryAfterMs === undefined) return undefined;
    return Math.ceil(this.retryAfterMs / 1000);
  }

  /** The status and RFC 9457 problem for an end user who is not let through. */
  problem(): Problem {
    if (this.outcome === "too_costly") {
      return { type: "about:blank", title: "Unprocessable Content", status: 422, detail: "This request asks for more than the rate limit allows at once." };
    }
    if (this.outcome === "unavailable" || this.outcome === "misconfigured") {
      return { type: "about:blank", title: "Service Unavailable", status: 503, detail: "The request could not be checked against its rate limit; try again shortly." };
    }
    const secs = this.retryAfterSecs;
    const problem: Problem = {
      type: "about:blank",
      title: "Too Many Requests",
      status: 429,
      detail: secs === undefined ? "Too many requests: try again later." : `Too many requests: try again in ${secs} s.`,
    };
    if (secs !== undefined) problem.retry_after = secs;
    return problem;
  }

  /** Headers for the end user's answer: the rate-limit headers, and for a refusal the problem's content type. */
  responseHeaders(): [string, string][] {
    const headers = [...this.headers];
    if (!this.allowed) {
      headers.push(["content-type", "application/problem+json"]);
      if (this.problem().status === 503) headers.push(["retry-after", "1"]);
    }
    return headers;
  }
}

/** Thrown by the helpers when a check does not let the work go on. */
export class Refused extends Error {
  constructor(readonly decision: Decision) {
    super(`rate limit check: ${decision.outcome}${decision.detail ? ` (${decision.detail})` : ""}`);
    this.name = "Refused";
  }
}

/**
 * Every denying rule is a `concurrency` rule: a release may free a slot at any moment, so its
 * Retry-After is only a hint (and such denials are never cached).
 */
export function deniedByConcurrencyOnly(answer: CheckAnswer | undefined): boolean {
  const denied = (answer?.results ?? []).filter((r) => !r.allowed);
  return denied.length > 0 && denied.every((r) => r.algorithm === "concurrency");
}

/**
 * What the middleware takes and services call: `Spillway` against a real Spillway,
 * `FakeSpillway` in memory for tests.
 */
export interface SpillwayClient {
  /** Checks `cost` units of `policy` for `identifiers`. Never throws: a check that could not
   * be decided is a Decision saying why, allowed as the failure modes say. */
  check(policy: string, identifiers: Identifiers, cost?: number, options?: CheckOptions): Promise<Decision>;
  /** The identifiers' state without consuming anything (a check of cost 0, never cached). */
  peek(policy: string, identifiers: Identifiers, options?: CheckOptions): Promise<Decision>;
  /** One Decision per check, in order. */
  checkBatch(checks: BatchCheck[]): Promise<Decision[]>;
  /** Checks until allowed, sleeping each denial's Retry-After, never past `maxWaitMs`; the last Decision. */
  waitUntilAllowed(policy: string, identifiers: Identifiers, options: WaitOptions): Promise<Decision>;
  report(policy: string, identifiers: Identifiers, cost: number): Promise<void>;
  release(leases: string[]): Promise<void>;
  renew(leases: string[]): Promise<void>;
  holdLeases(decision: Decision): () => Promise<void>;
  withLease<T>(policy: string, identifiers: Identifiers, work: (decision: Decision) => Promise<T>): Promise<T>;
  reserve<T>(policy: string, identifiers: Identifiers, estimate: number, work: (decision: Decision) => Promise<{ value: T; used: number }>): Promise<T>;
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/**
 * What every client does on top of its checks, reports, releases and renewals: peeks,
 * batches (one check after another, unless a client has better), the bounded wait, leases
 * and reserve-then-report.
 */
export abstract class SpillwayBase implements SpillwayClient {
  protected constructor(protected readonly log: Logger) {}

  abstract check(policy: string, identifiers: Identifiers, cost?: number, options?: CheckOptions): Promise<Decision>;
  abstract report(policy: string, identifiers: Identifiers, cost: number): Promise<void>;
  abstract release(leases: string[]): Promise<void>;
  abstract renew(leases: string[]): Promise<void>;

  /** The identifiers' state under `policy` without consuming anything (a check of cost 0,
   * holding no lease, never answered from nor kept in the denial cache):
   * `decision.answer.remaining` is what is left of the binding rule. */
  peek(policy: string, identifiers: Identifiers, options: CheckOptions = {}): Promise<Decision> {
    return this.check(policy, identifiers, 0, options);
  }

  async checkBatch(checks: BatchCheck[]): Promise<Decision[]> {
    const decisions: Decision[] = [];
    for (const c of checks) decisions.push(await this.check(c.policy, c.identifiers, c.cost ?? 1, { limits: c.limits }));
    return decisions;
  }

  /**
   * Checks; while denied by a limit, sleeps the denial's Retry-After and checks again, never
   * sleeping past `maxWaitMs` from the call. Returns the last Decision: allowed, or the
   * denial still standing (at once when its Retry-After ends after the deadline: no wait
   * would let it pass, unless only a concurrency rule denied, whose slot may free sooner), or
   * an unavailable or misconfigured check as it came.
   */
  async waitUntilAllowed(policy: string, identifiers: Identifiers, options: WaitOptions): Promise<Decision> {
    const { maxWaitMs, cost = 1, limits } = options;
    if (!Number.isFinite(maxWaitMs) || maxWaitMs < 0) throw new TypeError("maxWaitMs must be a number of milliseconds, 0 or more");
    const deadline = performance.now() + maxWaitMs;
    for (;;) {
      const decision = await this.check(policy, identifiers, cost, { limits });
      if (decision.outcome !== "limited" || decision.retryAfterMs === undefined) return decision;
      const left = deadline - performance.now();
      // A little past Retry-After, so the denial cache has let go of it by then.
      const wait = Math.max(decision.retryAfterMs, 0) + 10;
      if (left <= 0 || (wait > left && !deniedByConcurrencyOnly(decision.answer))) return decision;
      await sleep(Math.min(wait, left));
    }
  }

  /**
   * Holds a check's leases while work runs: renews them every third of the shortest time one
   * has left; the returned function stops renewing and releases them (its promise settles
   * once released; a failure is logged, the leases then end with their lease time).
   */
  holdLeases(decision: Decision): () => Promise<void> {
    const leases = decision.leases;
    if (leases.length === 0) return async () => {};
    const ends = (decision.answer?.results ?? []).filter((r) => r.lease).map((r) => r.reset_ms);
    const timer = setInterval(() => {
      this.renew(leases).catch((e: unknown) => this.log.warn(`spillway: renewing leases failed: ${String(e)}`));
    }, Math.max(Math.min(...ends) / 3, 50));
    // Renewing alone never keeps a process alive (a test that drops a response unread).
    timer.unref?.();
    let done = false;
    return async () => {
      if (done) return;
      done = true;
      clearInterval(timer);
      await this.release(leases).catch((e: unknown) => this.log.warn(`spillway: releasing leases failed: ${String(e)}`));
    };
  }

  /**
   * Checks `policy` (cost 1), runs `work` if allowed, renews the check's leases while it runs
   * and releases them however it ends. Throws Refused when not allowed.
   */
  async withLease<T>(policy: string, identifiers: Identifiers, work: (decision: Decision) => Promise<T>): Promise<T> {
    const decision = await this.check(policy, identifiers, 1);
    if (!decision.allowed) throw new Refused(decision);
    const stop = this.holdLeases(decision);
    try {
      return await work(decision);
    } finally {
      await stop();
    }
  }

  /**
   * Reserve, then report: checks `estimate`, runs `work` if allowed; `work` answers its value
   * and what it really used, and the difference is reported. When `work` throws, the whole
   * estimate is given back. Throws Refused when not allowed.
   */
  async reserve<T>(
    policy: string,
    identifiers: Identifiers,
    estimate: number,
    work: (decision: Decision) => Promise<{ value: T; used: number }>,
  ): Promise<T> {
    const decision = await this.check(policy, identifiers, estimate);
    if (!decision.allowed) throw new Refused(decision);
    // Only what Spillway counted is settled: not a check let through open, degraded or
    // shadow-denied (which consumed nothing).
    const answer = decision.answer;
    const counted = answer !== undefined && !answer.degraded && answer.shadow_denied !== true;
    // The check's own leases (a policy with a concurrency rule too) are renewed while the
    // work runs, however long it takes, and released when it ends.
    const stop = this.holdLeases(decision);
    let out: { value: T; used: number };
    try {
      out = await work(decision);
    } catch (e) {
      if (counted) await this.settle(policy, identifiers, -estimate);
      throw e;
    } finally {
      await stop();
    }
    if (counted) await this.settle(policy, identifiers, out.used - estimate);
    return out.value;
  }

  private async settle(policy: string, identifiers: Identifiers, delta: number): Promise<void> {
    if (delta === 0) return;
    await this.report(policy, identifiers, delta).catch((e: unknown) => this.log.warn(`spillway: reporting usage of ${policy} failed (${delta}): ${String(e)}`));
  }
}

function cacheKey(policy: string, identifiers: Identifiers, cost: number, limits: Limits | undefined): string {
  const ids = Object.keys(identifiers).sort().map((k) => `${k}=${identifiers[k]}`);
  // Each set of caller limits is a counter of its own: so is its denial.
  const numbers = Object.keys(limits ?? {}).sort().map((rule) => {
    const n = limits?.[rule] ?? {};
    return `${rule}:${Object.keys(n).sort().map((k) => `${k}=${n[k]}`).join(",")}`;
  });
  return [policy, String(cost), ...ids, "\u0001", ...numbers].join("\u0000");
}

function checkBody(policy: string, identifiers: Identifiers, cost: number, limits: Limits | undefined): Record<string, unknown> {
  const body: Record<string, unknown> = { policy, identifiers, cost };
  if (limits && Object.keys(limits).length > 0) body.limits = limits;
  return body;
}

function isCheckAnswer(body: unknown): body is CheckAnswer {
  return body !== null && typeof body === "object" && typeof (body as { allowed?: unknown }).allowed === "boolean" && Array.isArray((body as { results?: unknown }).results);
}

/** What a call's answer means to the breaker: a value, and why the call found Spillway unavailable when it did. */
interface Read<T> {
  value: T;
  failure?: string;
}

export class Spillway extends SpillwayBase {
  readonly failure: Failure;
  private readonly url: string;
  private readonly key: string;
  private readonly timeoutMs: number;
  private readonly fetch: typeof fetch;
  private readonly breaker: Breaker | undefined;
  private readonly denials = new Map<string, { until: number; retryAt: number; decision: Decision }>();
  private readonly warnedUnmatched = new Set<string>();

  constructor(options: Options) {
    super(options.logger ?? console);
    const { unavailable, misconfigured } = options.failure ?? {};
    for (const mode of [unavailable, misconfigured]) {
      if (mode !== "open" && mode !== "closed") {
        throw new TypeError("failure.unavailable and failure.misconfigured must each be \"open\" or \"closed\"");
      }
    }
    this.failure = options.failure;
    this.url = options.url.replace(/\/+$/, "");
    this.key = options.key;
    this.timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    // Bound: Workers and browsers refuse a fetch called on another object ("Illegal invocation").
    this.fetch = options.fetch ?? globalThis.fetch.bind(globalThis);
    const breaker = options.breaker ?? {};
    this.breaker = breaker === false ? undefined : new Breaker(breaker.failures ?? DEFAULT_BREAKER_FAILURES, breaker.periodMs ?? DEFAULT_BREAKER_PERIOD_MS);
  }

  /**
   * A POST through the circuit breaker, its answer read in full within the timeout, then
   * `read`: what the answer means, and whether it found Spillway unavailable (a 5xx, an
   * answer that is not Spillway's). Throws Unavailable naming the cause, or the open breaker.
   */
  private async post<T>(path: string, body: unknown, read: (reply: Reply) => Read<T>): Promise<T> {
    const breaker = this.breaker;
    let trial = false;
    try {
      trial = breaker ? breaker.enter() : false;
    } catch (e) {
      if (e instanceof BreakerOpen) throw new Unavailable(e.message, true);
      throw e;
    }
    let reply: Reply;
    try {
      reply = await send(this.fetch, { method: "POST", url: `${this.url}${path}`, key: this.key, body }, this.timeoutMs);
    } catch (e) {
      if (e instanceof Unavailable) this.failed(trial, e.reason);
      else breaker?.abandoned(trial);
      throw e;
    }
    let out: Read<T>;
    try {
      out = read(reply);
    } catch (e) {
      breaker?.abandoned(trial);
      throw e;
    }
    if (out.failure !== undefined) this.failed(trial, out.failure);
    else if (breaker?.succeeded()) this.log.info?.("spillway: Spillway answers again: circuit breaker closed");
    return out.value;
  }

  private failed(trial: boolean, reason: string): void {
    const breaker = this.breaker;
    if (!breaker?.failed(trial, reason)) return;
    const why = trial ? "the trial call failed too" : `Spillway unavailable ${breaker.failures} times in a row, the last`;
    this.log.warn(`spillway: circuit breaker open: ${why} (${reason}); not calling Spillway for ${breaker.periodMs} ms, checks fail ${this.failure.unavailable} meanwhile`);
  }

  /**
   * Checks `cost` units of `policy` for `identifiers`, with the rules' numbers `limits` sends
   * (`{ limits: { "<rule>": { limit: 500 } } }`) when given. Never throws: a check that could
   * not be decided is a Decision saying why, allowed as the failure modes say.
   */
  async check(policy: string, identifiers: Identifiers, cost = 1, options: CheckOptions = {}): Promise<Decision> {
    const key = cacheKey(policy, identifiers, cost, options.limits);
    // A peek (cost 0) asks how things stand now: never answered from the cache, never kept.
    const caching = cost !== 0;
    const cached = caching ? this.cached(key) : undefined;
    if (cached) return cached;
    try {
      return await this.post("/api/v1/check", checkBody(policy, identifiers, cost, options.limits), (reply) => {
        const headers: [string, string][] = [];
        for (const name of PASSED_ON) {
          const value = reply.headers.get(name);
          if (value !== null) headers.push([name, value]);
        }
        const decision = this.judge(policy, key, caching, reply.status, reply.body, headers, reply.url, reply.text);
        return { value: decision, failure: decision.outcome === "unavailable" ? decision.detail : undefined };
      });
    } catch (e) {
      if (e instanceof Unavailable) return this.unavailable(policy, e.reason, e.fromBreaker);
      throw e;
    }
  }

  /**
   * One Decision per check, in order, from one call per 100 checks (`POST
   * /api/v1/check/batch`). The failure modes and the denial cache apply to each check as to
   * `check`. A batch's answer carries no RateLimit headers: a denied check's `headers` hold
   * its `Retry-After`.
   */
  async checkBatch(checks: BatchCheck[]): Promise<Decision[]> {
    const decisions: (Decision | undefined)[] = [];
    const todo: number[] = [];
    checks.forEach((c, i) => {
      const cost = c.cost ?? 1;
      const cached = cost !== 0 ? this.cached(cacheKey(c.policy, c.identifiers, cost, c.limits)) : undefined;
      decisions[i] = cached;
      if (!cached) todo.push(i);
    });
    for (let start = 0; start < todo.length; start += MAX_BATCH) {
      const part = todo.slice(start, start + MAX_BATCH);
      const answered = await this.batch(part.map((i) => checks[i] as BatchCheck));
      part.forEach((i, j) => (decisions[i] = answered[j]));
    }
    return decisions as Decision[];
  }

  private async batch(items: BatchCheck[]): Promise<Decision[]> {
    const body = { checks: items.map((c) => checkBody(c.policy, c.identifiers, c.cost ?? 1, c.limits)) };
    try {
      return await this.post("/api/v1/check/batch", body, (reply) => this.judgeBatch(items, reply));
    } catch (e) {
      if (e instanceof Unavailable) return this.allUnavailable(items, e.reason, e.fromBreaker);
      throw e;
    }
  }

  private judgeBatch(items: BatchCheck[], reply: Reply): Read<Decision[]> {
    const where = reply.url;
    if (reply.status !== 200) {
      // The batch as a whole was not answered: each of its checks is unavailable, or refused
      // as a configuration error (a wrong key); said once.
      const detail = detailOf(reply);
      if (reply.status >= 500) {
        const reason = `${reply.status} from ${where}: ${detail}`;
        return { value: this.allUnavailable(items, reason), failure: reason };
      }
      this.log.error(`spillway: a batch of ${items.length} was refused (${reply.status} from ${where}): ${detail}; a configuration error`);
      const open = this.failure.misconfigured === "open";
      return { value: items.map(() => new Decision("misconfigured", open, undefined, [], undefined, false, reply.status, detail)) };
    }
    const results = (reply.body as { results?: unknown } | undefined)?.results;
    if (!Array.isArray(results) || results.length !== items.length) {
      const reason = `an unreadable batch answer (${reply.status}) from ${where}`;
      return { value: this.allUnavailable(items, reason), failure: reason };
    }
    const value = items.map((item, i) => {
      const result = results[i] as { status?: unknown; body?: unknown } | null;
      const status = typeof result?.status === "number" ? result.status : 0;
      const answer = result?.body;
      const headers: [string, string][] = [];
      if (status === 429 && isCheckAnswer(answer) && typeof answer.retry_after_ms === "number") {
        headers.push(["retry-after", String(Math.max(1, Math.ceil(answer.retry_after_ms / 1000)))]);
      }
      const cost = item.cost ?? 1;
      const key = cacheKey(item.policy, item.identifiers, cost, item.limits);
      return this.judge(item.policy, key, cost !== 0, status, answer, headers, `${where} (checks[${i}])`, JSON.stringify(answer ?? null));
    });
    // Every check a 5xx (Redis down under policies that fail closed): Spillway is unavailable,
    // as a single check's 503 says.
    const failure = value.length > 0 && value.every((d) => d.status !== undefined && d.status >= 500) ? `${value[0]?.detail} (each of ${value.length} checks)` : undefined;
    return { value, failure };
  }

  /** The Decision for one check's answer: its status and its body (the check's answer for 200 and 429, else a problem). */
  private judge(policy: string, key: string, caching: boolean, status: number, body: unknown, headers: [string, string][], where: string, text: string): Decision {
    if (status === 200 || status === 429) {
      if (!isCheckAnswer(body)) return this.unavailable(policy, `an answer that is not a check's (${status}) from ${where}`);
      return this.decided(key, caching, body, headers);
    }
    const said = (body as { detail?: unknown } | undefined)?.detail;
    const detail = typeof said === "string" ? said : text;
    if (status === 422) return new Decision("too_costly", false, undefined, [], undefined, false, 422, detail);
    if (status >= 500) return this.unavailable(policy, `${status} from ${where}: ${detail}`, false, status);
    this.log.error(`spillway: the check of ${policy} was refused (${status} from ${where}): ${detail}; a configuration error`);
    return new Decision("misconfigured", this.failure.misconfigured === "open", undefined, [], undefined, false, status, detail);
  }

  private unavailable(policy: string, reason: string, fromBreaker = false, status?: number): Decision {
    // The breaker said once, when it opened, why: each check it answers meanwhile is not worth a warning.
    if (!fromBreaker) this.log.warn(`spillway: unavailable for ${policy} (failing ${this.failure.unavailable}): ${reason}`);
    return new Decision("unavailable", this.failure.unavailable === "open", undefined, [], undefined, false, status, reason, fromBreaker);
  }

  /** Every check of a batch that could not be made: said once. */
  private allUnavailable(items: BatchCheck[], reason: string, fromBreaker = false): Decision[] {
    const policies = [...new Set(items.map((c) => c.policy))].sort().join(", ");
    this.unavailable(`a batch of ${items.length} (${policies})`, reason, fromBreaker);
    const open = this.failure.unavailable === "open";
    return items.map(() => new Decision("unavailable", open, undefined, [], undefined, false, undefined, reason, fromBreaker));
  }

  private decided(key: string, caching: boolean, answer: CheckAnswer, headers: [string, string][]): Decision {
    if (answer.unmatched && !this.warnedUnmatched.has(answer.policy)) {
      this.warnedUnmatched.add(answer.policy);
      this.log.warn(`spillway: no rule of policy ${answer.policy} counts the identifiers sent: nothing is limited (fix the identifiers or the policy's dimensions)`);
    }
    if (answer.allowed) return new Decision("allowed", true, answer, headers);
    const decision = new Decision("limited", false, answer, headers, answer.retry_after_ms ?? undefined);
    if (caching) this.remember(key, decision);
    return decision;
  }

  /** Denials are remembered until Retry-After; never one by a concurrency rule. */
  private remember(key: string, decision: Decision): void {
    const answer = decision.answer;
    const byConcurrency = (answer?.results ?? []).some((r) => !r.allowed && r.algorithm === "concurrency");
    if (!answer || byConcurrency || answer.degraded || !decision.retryAfterMs) return;
    if (this.denials.size >= CACHE_CAPACITY) {
      const now = Date.now();
      for (const [k, v] of this.denials) if (v.until <= now) this.denials.delete(k);
      if (this.denials.size >= CACHE_CAPACITY) this.denials.clear();
    }
    const now = Date.now();
    this.denials.set(key, { until: now + Math.min(decision.retryAfterMs, MAX_CACHED_MS), retryAt: now + decision.retryAfterMs, decision });
  }

  private cached(key: string): Decision | undefined {
    const entry = this.denials.get(key);
    if (!entry) return undefined;
    const now = Date.now();
    if (entry.until <= now) {
      this.denials.delete(key);
      return undefined;
    }
    const left = entry.retryAt - now;
    // The stored RateLimit header's reset is stale: the policy and a fresh Retry-After.
    const headers = entry.decision.headers.filter(([name]) => name === "ratelimit-policy");
    headers.push(["retry-after", String(Math.ceil(left / 1000))]);
    return new Decision("limited", false, entry.decision.answer, headers, left, true);
  }

  /** Usage known after the fact, added to every rule; a negative cost gives back. */
  report(policy: string, identifiers: Identifiers, cost: number): Promise<void> {
    return this.call("/api/v1/report", { policy, identifiers, cost });
  }

  /** Releases leases (idempotent). */
  async release(leases: string[]): Promise<void> {
    if (leases.length > 0) await this.call("/api/v1/leases/release", { leases });
  }

  /** Extends leases by their rule's lease length from now. */
  async renew(leases: string[]): Promise<void> {
    if (leases.length > 0) await this.call("/api/v1/leases/renew", { leases });
  }

  private async call(path: string, body: unknown): Promise<void> {
    let reply: Reply;
    try {
      reply = await this.post(path, body, (r) => ({ value: r, failure: r.status >= 500 ? `${r.status} from ${r.url}: ${detailOf(r)}` : undefined }));
    } catch (e) {
      if (e instanceof Unavailable) throw new SpillwayError(`Spillway is unavailable: ${e.reason}`);
      throw e;
    }
    if (reply.status < 200 || reply.status >= 300) throw refused("POST", reply);
  }
}
