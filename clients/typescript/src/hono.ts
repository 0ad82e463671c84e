/**
 * Hono middleware: checks each request before the handler sees it.
 *
 * ```ts
 * app.use("/api/*", spillwayHono(spillway, "api", (c) => ({ user: c.req.header("x-user") })));
 * ```
 *
 * An allowed request goes on, its response carrying `RateLimit-Policy` and `RateLimit`; the
 * leases of a concurrency rule are released once the handler is done, however it ends. A
 * refused one is answered with an RFC 9457 problem (429 with `Retry-After`, 422, or 503 for
 * a check failing closed). A request `identify` names no identifiers for goes on unchecked.
 *
 * `client` is a `Spillway`, or a `FakeSpillway` (`spillway-client/testing`) in tests.
 */
import type { Context, MiddlewareHandler } from "hono";

import { complete } from "./identifiers.js";
import type { Limits, SpillwayClient } from "./index.js";

export type Identify = (c: Context) => Record<string, string | undefined> | undefined | Promise<Record<string, string | undefined> | undefined>;

export interface HonoOptions {
  /** Each request's cost (1 unless said). */
  cost?: (c: Context) => number;
  /** Each request's caller-supplied limits (`{ "<rule>": { limit: 500 } }`, a customer's plan), if any. */
  limits?: (c: Context) => Limits | undefined;
}

export function spillwayHono(client: SpillwayClient, policy: string, identify: Identify, options: HonoOptions = {}): MiddlewareHandler {
  return async (c, next) => {
    const identifiers = complete(await identify(c));
    if (!identifiers) return next();
    const decision = await client.check(policy, identifiers, options.cost ? options.cost(c) : 1, { limits: options.limits?.(c) });
    if (!decision.allowed) {
      const problem = decision.problem();
      return new Response(JSON.stringify(problem), { status: problem.status, headers: decision.responseHeaders() });
    }
    // Renewed while the handler runs; released when it is done, however it ends.
    const stop = client.holdLeases(decision);
    try {
      await next();
    } finally {
      // Not awaited: the answer does not wait for the release.
      void stop();
    }
    for (const [name, value] of decision.headers) c.res.headers.append(name, value);
    return undefined;
  };
}
