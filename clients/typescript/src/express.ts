/**
 * Express middleware: checks each request before the route sees it.
 *
 * ```ts
 * app.use(spillwayExpress(spillway, "api", (req) => ({ user: req.get("x-user") })));
 * ```
 *
 * An allowed request goes on, its response carrying `RateLimit-Policy` and `RateLimit`; the
 * leases of a concurrency rule are renewed while the route works and released once its response
 * is sent: a client that disconnects does not free the slot while the route still runs.
 * A refused one is answered with an RFC 9457 problem (429 with `Retry-After`, 422, or 503
 * for a check failing closed). A request `identify` names no identifiers for goes on unchecked.
 *
 * `client` is a `Spillway`, or a `FakeSpillway` (`spillway-client/testing`) in tests.
 */
import type { NextFunction, Request, RequestHandler, Response } from "express";

import { complete } from "./identifiers.js";
import type { Limits, SpillwayClient } from "./index.js";

export type Identify = (req: Request) => Record<string, string | undefined> | undefined | Promise<Record<string, string | undefined> | undefined>;

export interface ExpressOptions {
  /** Each request's cost (1 unless said). */
  cost?: (req: Request) => number;
  /** Each request's caller-supplied limits (`{ "<rule>": { limit: 500 } }`, a customer's plan), if any. */
  limits?: (req: Request) => Limits | undefined;
}

export function spillwayExpress(client: SpillwayClient, policy: string, identify: Identify, options: ExpressOptions = {}): RequestHandler {
  return (req: Request, res: Response, next: NextFunction) => {
    void (async () => {
      const named = await identify(req);
      const identifiers = complete(named);
      if (!identifiers) return next();
      const decision = await client.check(policy, identifiers, options.cost ? options.cost(req) : 1, { limits: options.limits?.(req) });
      if (!decision.allowed) {
        const problem = decision.problem();
        for (const [name, value] of decision.responseHeaders()) res.append(name, value);
        res.status(problem.status).send(JSON.stringify(problem));
        return;
      }
      for (const [name, value] of decision.headers) res.append(name, value);
      // Renewed while the response is made; released once it is sent. A client that goes
      // away does not end the work: the handler still runs and holds its slot until it ends
      // the response (after a disconnect "finish" may never come, so its end() releases).
      const stop = client.holdLeases(decision);
      res.once("finish", () => void stop());
      const end = res.end.bind(res) as (...args: unknown[]) => Response;
      res.end = ((...args: unknown[]) => {
        const out = end(...args);
        if (res.destroyed || req.socket.destroyed) void stop();
        return out;
      }) as Response["end"];
      next();
    })().catch(next);
  };
}
