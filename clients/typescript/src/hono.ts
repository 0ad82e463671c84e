/**
 * Hono middleware: checks each request before the handler sees it.
 *
 * ```ts
 * app.use("/api/*", spillwayHono(spillway, "api", (c) => ({ user: c.req.header("x-user") })));
 * ```
 *
 * An allowed request goes on, its response carrying `RateLimit-Policy` and `RateLimit`; the
 * leases of a concurrency rule are renewed while the handler works and its body is sent, and
 * released once the body's last chunk is read (a streamed answer holds its slot as long as it
 * streams), or the handler throws, or the body is cancelled. A
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
    // Renewed while the handler runs and its body is sent; released once the body's last
    // chunk is read (or the body is cancelled, or the handler throws).
    const stop = client.holdLeases(decision);
    let handedOver = false;
    try {
      await next();
      const body = c.res.body;
      if (body) {
        c.res = new Response(holdUntilSent(body, stop), c.res);
        handedOver = true;
      }
    } finally {
      // Not awaited: the answer does not wait for the release.
      if (!handedOver) void stop();
    }
    for (const [name, value] of decision.headers) c.res.headers.append(name, value);
    return undefined;
  };
}

/**
 * The same bytes as `body`, calling `stop` once (not awaited) when the last chunk has been read,
 * the body fails, or its reader cancels it (after the body's own source has been cancelled): a
 * streamed answer holds its leases as long as it streams.
 */
function holdUntilSent(body: ReadableStream<Uint8Array>, stop: () => Promise<void>): ReadableStream<Uint8Array> {
  const reader = body.getReader();
  let held = true;
  const release = () => {
    if (held) {
      held = false;
      void stop();
    }
  };
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      try {
        const { done, value } = await reader.read();
        if (done) {
          release();
          controller.close();
        } else {
          controller.enqueue(value);
        }
      } catch (error) {
        release();
        controller.error(error);
      }
    },
    async cancel(reason) {
      try {
        await reader.cancel(reason);
      } finally {
        release();
      }
    },
  });
}
