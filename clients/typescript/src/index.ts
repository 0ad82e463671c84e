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
 * explicit fail-open or fail-closed choice for outages and for configuration errors, the
 * rate-limit headers to pass on, an RFC 9457 problem for end users, a cache of denials until
 * Retry-After (never for a concurrency rule), leases, and reserve-then-report.
 */

/** What a check that could not be decided means for the request. */
export type FailMode = "open" | "closed";

export interface Failure {
  /** Spillway unreachable: a network error, a timeout, a 5xx. */
  unavailable: FailMode;
  /** A configuration error: 401/403 (the key), 404 (no such policy), 400 (a strict policy's unmatched identifiers). */
  misconfigured: FailMode;
}

export interface Options {
  /** Spillway's base URL, `http://spillway:3000`. */
  url: string;
  /** A service key. */
  key: string;
  failure: Failure;
  /** Per call; 100 ms unless said. */
  timeoutMs?: number;
  /** Another fetch (tests, proxies). */
  fetch?: typeof fetch;
  /** Where warnings go; console unless said. */
  logger?: Pick<Console, "warn" | "error">;
}

/** How long a call may take before Spillway counts as unavailable. */
export const DEFAULT_TIMEOUT_MS = 100;

export type Identifiers = Record<string, string>;

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
 * 422); `unavailable` (network error, timeout, 5xx); `misconfigured` (401, 403, 404, 400).
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
    readonly detail?: string,
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
    super(`rate limit check: ${decision.outcome}`);
    this.name = "Refused";
  }
}

/** A call that is not a check (report, release, renew) failed. */
export class SpillwayError extends Error {
  constructor(message: string, readonly status?: number) {
    super(message);
    this.name = "SpillwayError";
  }
}

function cacheKey(policy: string, identifiers: Identifiers, cost: number): string {
  const ids = Object.keys(identifiers).sort().map((k) => `${k}=${identifiers[k]}`);
  return [policy, String(cost), ...ids].join("\u0000");
}

async function detailOf(response: Response): Promise<string> {
  const text = await response.text().catch(() => "");
  try {
    const detail = (JSON.parse(text) as { detail?: unknown }).detail;
    return typeof detail === "string" ? detail : text;
  } catch {
    return text;
  }
}

export class Spillway {
  readonly failure: Failure;
  private readonly url: string;
  private readonly key: string;
  private readonly timeoutMs: number;
  private readonly fetch: typeof fetch;
  private readonly log: Pick<Console, "warn" | "error">;
  private readonly denials = new Map<string, { until: number; retryAt: number; decision: Decision }>();
  private readonly warnedUnmatched = new Set<string>();

  constructor(options: Options) {
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
    this.log = options.logger ?? console;
  }

  private post(path: string, body: unknown): Promise<Response> {
    return this.fetch(`${this.url}${path}`, {
      method: "POST",
      headers: { authorization: `Bearer ${this.key}`, "content-type": "application/json" },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(this.timeoutMs),
    });
  }

  /**
   * Checks `cost` units of `policy` for `identifiers`. Never throws: a check that could not
   * be decided is a Decision saying why, allowed as the failure modes say.
   */
  async check(policy: string, identifiers: Identifiers, cost = 1): Promise<Decision> {
    const key = cacheKey(policy, identifiers, cost);
    const cached = this.cached(key);
    if (cached) return cached;
    let response: Response;
    let answer: CheckAnswer | undefined;
    try {
      response = await this.post("/api/v1/check", { policy, identifiers, cost });
      if (response.status === 200 || response.status === 429) {
        answer = (await response.json()) as CheckAnswer;
      }
    } catch (e) {
      return this.unavailable(policy, e instanceof Error ? `${e.name}: ${e.message}` : String(e));
    }
    const headers: [string, string][] = [];
    for (const name of PASSED_ON) {
      const value = response.headers.get(name);
      if (value !== null) headers.push([name, value]);
    }
    if (answer) return this.decided(key, answer, headers);
    const detail = await detailOf(response);
    if (response.status === 422) return new Decision("too_costly", false, undefined, [], undefined, false, 422, detail);
    if (response.status >= 500) return this.unavailable(policy, `${response.status}: ${detail}`);
    this.log.error(`spillway: the check of ${policy} was refused (${response.status}): ${detail}; a configuration error`);
    return new Decision("misconfigured", this.failure.misconfigured === "open", undefined, [], undefined, false, response.status, detail);
  }

  private unavailable(policy: string, reason: string): Decision {
    this.log.warn(`spillway: unavailable for ${policy} (failing ${this.failure.unavailable}): ${reason}`);
    return new Decision("unavailable", this.failure.unavailable === "open", undefined, [], undefined, false, undefined, reason);
  }

  private decided(key: string, answer: CheckAnswer, headers: [string, string][]): Decision {
    if (answer.unmatched && !this.warnedUnmatched.has(answer.policy)) {
      this.warnedUnmatched.add(answer.policy);
      this.log.warn(`spillway: no rule of policy ${answer.policy} counts the identifiers sent: nothing is limited (fix the identifiers or the policy's dimensions)`);
    }
    if (answer.allowed) return new Decision("allowed", true, answer, headers);
    const decision = new Decision("limited", false, answer, headers, answer.retry_after_ms ?? undefined);
    this.remember(key, decision);
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
    let response: Response;
    try {
      response = await this.post(path, body);
    } catch (e) {
      throw new SpillwayError(`Spillway is unavailable: ${e instanceof Error ? e.message : String(e)}`);
    }
    if (response.ok) {
      await response.body?.cancel();
      return;
    }
    throw new SpillwayError(`Spillway refused (${response.status}): ${await detailOf(response)}`, response.status);
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
