/**
 * One call to Spillway and what can go wrong with it: the answer read in full within a
 * timeout, or an `Unavailable` naming the URL and the cause (`connect ECONNREFUSED
 * 127.0.0.1:3000 calling http://…/api/v1/check`, `timed out after 100 ms calling …`) where
 * fetch alone says "fetch failed" or an empty TimeoutError. Shared by the client and the
 * admin helpers.
 */

/** A call that is not a check (report, release, renew, the admin helpers) failed. The message
 * names the call and the cause; `status` and `problem` are Spillway's answer when it gave one
 * (undefined for a network error, a timeout or an open circuit breaker). */
export class SpillwayError extends Error {
  constructor(message: string, readonly status?: number, readonly problem?: Record<string, unknown>) {
    super(message);
    this.name = "SpillwayError";
  }
}

/** A call that found Spillway unavailable; `reason` says what failed and why. */
export class Unavailable extends Error {
  constructor(readonly reason: string, readonly fromBreaker = false) {
    super(reason);
    this.name = "Unavailable";
  }
}

/** An answer, read in full: its body parsed when it is JSON (undefined otherwise). */
export interface Reply {
  status: number;
  headers: Headers;
  text: string;
  body: unknown;
  url: string;
}

export interface Call {
  method: "GET" | "POST" | "DELETE";
  url: string;
  key: string;
  body?: unknown;
}

/**
 * Makes `call` and reads its answer, all within `timeoutMs` (held even by a `fetch` that
 * ignores its signal). Throws `Unavailable` naming the URL and the cause.
 */
export async function send(fetcher: typeof fetch, call: Call, timeoutMs: number): Promise<Reply> {
  const controller = new AbortController();
  const headers: Record<string, string> = { authorization: `Bearer ${call.key}` };
  if (call.body !== undefined) headers["content-type"] = "application/json";
  const whole = (async (): Promise<Reply> => {
    const response = await fetcher(call.url, {
      method: call.method,
      headers,
      body: call.body === undefined ? undefined : JSON.stringify(call.body),
      signal: controller.signal,
    });
    const text = await response.text();
    return { status: response.status, headers: response.headers, text, body: parsed(text), url: call.url };
  })();
  let timedOut = false;
  let timer: ReturnType<typeof setTimeout> | undefined;
  const expired = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      timedOut = true;
      reject(new Unavailable(`timed out after ${timeoutMs} ms calling ${call.url}`));
      controller.abort();
    }, timeoutMs);
  });
  try {
    return await Promise.race([whole, expired]);
  } catch (e) {
    if (timedOut) throw new Unavailable(`timed out after ${timeoutMs} ms calling ${call.url}`);
    throw new Unavailable(`${causeOf(e)} calling ${call.url}`);
  } finally {
    clearTimeout(timer);
    // The call given up on rejects (aborted) once nobody waits for it: not an unhandled rejection.
    whole.catch(() => {});
  }
}

function parsed(text: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}

/**
 * What failed and why, from the error fetch throws (`TypeError: fetch failed`) and its
 * causes: each system error's own words (`connect ECONNREFUSED 127.0.0.1:3000`,
 * `getaddrinfo ENOTFOUND spillway`, `UND_ERR_SOCKET: other side closed`), or the error's
 * name and each cause's message when none has a code.
 */
export function causeOf(error: unknown): string {
  const said: string[] = [];
  const seen = new Set<unknown>();
  const queue: unknown[] = [error];
  while (queue.length > 0) {
    const e = queue.shift();
    if (e === null || typeof e !== "object" || seen.has(e)) continue;
    seen.add(e);
    const { code, message, errors, cause } = e as { code?: unknown; message?: unknown; errors?: unknown; cause?: unknown };
    const words = typeof message === "string" ? message : "";
    // An AggregateError (one connection attempt per address) says its code and no more:
    // each attempt's error says which address.
    const inner = Array.isArray(errors) ? errors : [];
    if (typeof code === "string" && (words !== "" || inner.length === 0)) {
      const text = words.includes(code) ? words : words ? `${code}: ${words}` : code;
      if (!said.includes(text)) said.push(text);
    }
    queue.push(...inner, cause);
  }
  if (said.length > 0) return said.join("; ");
  // No system error: each cause's words (`TypeError: fetch failed: bad port`).
  const words: string[] = [];
  for (let e: unknown = error; e instanceof Error && words.length < 8; e = e.cause) {
    if (e.message && !words.includes(e.message)) words.push(e.message);
  }
  return error instanceof Error ? `${error.name}: ${words.join(": ")}` : String(error);
}

/** The `detail` of a problem answer, else its text. */
export function detailOf(reply: Reply): string {
  const detail = (reply.body as { detail?: unknown } | undefined)?.detail;
  return typeof detail === "string" ? detail : reply.text;
}

/** The error for an answer that refused a call: the call, the status and Spillway's reason. */
export function refused(method: string, reply: Reply): SpillwayError {
  const problem = reply.body !== null && typeof reply.body === "object" && !Array.isArray(reply.body) ? (reply.body as Record<string, unknown>) : undefined;
  return new SpillwayError(`Spillway refused ${method} ${reply.url} (${reply.status}): ${detailOf(reply)}`, reply.status, problem);
}
