/**
 * The admin API's helpers a service's own tooling needs: reset an identifier's counters (and
 * undo it), look at them, add and remove overrides. They take an admin key, not the service
 * key the checks use, so they are a client of their own.
 *
 * ```ts
 * const admin = new Admin({ url: "http://spillway:3000", key: process.env.SPILLWAY_ADMIN_KEY! });
 * await admin.reset("user", "42", { reason: "support ticket 1234" });
 * await admin.addOverride("api", { match: "user=vip-*", action: "unlimited", reason: "partners" });
 * ```
 *
 * Every helper throws a SpillwayError naming the call and the cause when it fails (no failure
 * modes here: these are not on a request's path).
 */
import { SpillwayError, Unavailable, refused, send, type Call } from "./http.js";

/** Admin calls write policies and audit records: a budget of seconds, not milliseconds. */
export const DEFAULT_ADMIN_TIMEOUT_MS = 5000;

export interface AdminOptions {
  /** Spillway's base URL, `http://spillway:3000`. */
  url: string;
  /** An admin key. */
  key: string;
  /** Per call; 5000 ms unless said. */
  timeoutMs?: number;
  /** Another fetch (tests, proxies). */
  fetch?: typeof fetch;
}

/** An override as the API takes and answers it. */
export interface Override {
  /** `user=42`, `user=vip-*` or `ip=10.0.0.0/8`. */
  match: string;
  action: "unlimited" | "block" | "limit";
  /** With action `limit`: the rules that apply instead. */
  rules?: Record<string, unknown>[];
  /** Unix ms. */
  expires_at_ms?: number;
  reason?: string;
}

export interface OverrideList {
  policy: string;
  version: number;
  overrides: Override[];
}

export interface ResetOptions {
  /** Why (kept in the audit log). */
  reason: string;
  /** Only this policy. */
  policy?: string;
  /** Only this rule (needs `policy`). */
  rule?: string;
}

export interface ResetResult {
  identifier: string;
  /** The policies whose counters were reset. */
  policies: string[];
  deleted_keys: number;
  /** Present when counters were deleted: `undoReset(undo.token)` puts them back within a minute. */
  undo: { token: string; until_ms: number } | null;
}

export interface Inspection {
  identifier: string;
  at_ms: number;
  policies: { policy: string; version: number; status: string; rules: Record<string, unknown>[] }[];
  error?: string | null;
}

const segment = encodeURIComponent;

export class Admin {
  private readonly url: string;
  private readonly key: string;
  private readonly timeoutMs: number;
  private readonly fetch: typeof fetch;

  constructor(options: AdminOptions) {
    this.url = options.url.replace(/\/+$/, "");
    this.key = options.key;
    this.timeoutMs = options.timeoutMs ?? DEFAULT_ADMIN_TIMEOUT_MS;
    this.fetch = options.fetch ?? globalThis.fetch.bind(globalThis);
  }

  /** The live state of every rule of every policy for one identifier (nothing consumed). */
  inspect(dimension: string, value: string): Promise<Inspection> {
    return this.call("GET", identifier(dimension, value));
  }

  /**
   * Resets the identifier's counters (`DELETE /api/v1/identifiers/{dimension}/{value}`):
   * everywhere, in `policy`, or for one `rule` of it; `reason` goes to the audit log. Every
   * instance of Spillway forgets its cached denials at once (a client's own denial cache
   * keeps a denial until its Retry-After, at most 10 s).
   */
  reset(dimension: string, value: string, options: ResetOptions): Promise<ResetResult> {
    const query = new URLSearchParams({ reason: options.reason });
    if (options.policy !== undefined) query.set("policy", options.policy);
    if (options.rule !== undefined) query.set("rule", options.rule);
    return this.call("DELETE", `${identifier(dimension, value)}?${query}`);
  }

  /** Puts back what a reset deleted (within a minute of it, once). */
  undoReset(token: string): Promise<{ identifiers: string[]; restored_keys: number }> {
    return this.call("POST", `/api/v1/resets/${segment(token)}/undo`);
  }

  /** The policy's overrides, in order (the first that matches applies). */
  async overrides(policy: string): Promise<Override[]> {
    return (await this.call<OverrideList>("GET", overrides(policy))).overrides;
  }

  /** Adds an override (`POST /api/v1/policies/{policy}/overrides`); every instance follows at once. */
  addOverride(policy: string, override: Override): Promise<OverrideList> {
    return this.call("POST", overrides(policy), override);
  }

  /**
   * Removes an override (`DELETE /api/v1/policies/{policy}/overrides/{index}`): by its place
   * in the list (from 0), or the first whose `match` is `which`. (Looked up, then removed by
   * place: an override added or removed by someone else in between may shift it.)
   */
  async removeOverride(policy: string, which: number | string): Promise<OverrideList> {
    let index = which;
    if (typeof which === "string") {
      const matches = (await this.overrides(policy)).map((o) => o.match);
      index = matches.indexOf(which);
      if (index < 0) throw new SpillwayError(`no override of ${policy} matches ${JSON.stringify(which)} (it has ${JSON.stringify(matches)})`, 404);
    }
    return this.call("DELETE", `${overrides(policy)}/${index}`);
  }

  private async call<T>(method: Call["method"], path: string, body?: unknown): Promise<T> {
    let reply;
    try {
      reply = await send(this.fetch, { method, url: `${this.url}${path}`, key: this.key, body }, this.timeoutMs);
    } catch (e) {
      if (e instanceof Unavailable) throw new SpillwayError(`Spillway is unavailable: ${e.reason}`);
      throw e;
    }
    if (reply.status < 200 || reply.status >= 300) throw refused(method, reply);
    return reply.body as T;
  }
}

function identifier(dimension: string, value: string): string {
  return `/api/v1/identifiers/${segment(dimension)}/${segment(value)}`;
}

function overrides(policy: string): string {
  return `/api/v1/policies/${segment(policy)}/overrides`;
}
