import type { Identifiers } from "./index.js";

/** The identifiers, when every one has a value. */
export function complete(named: Record<string, string | undefined> | undefined): Identifiers | undefined {
  if (!named) return undefined;
  const out: Identifiers = {};
  for (const [k, v] of Object.entries(named)) {
    if (v === undefined || v === "") return undefined;
    out[k] = v;
  }
  return Object.keys(out).length > 0 ? out : undefined;
}
