import type { Identifiers } from "./index.js";

/**
 * The identifiers that have a value; undefined (the request goes on unchecked) when none has.
 * A missing one is left out, not a reason to skip the check: an anonymous caller is still
 * limited by the dimensions it does have.
 */
export function complete(named: Record<string, string | undefined> | undefined): Identifiers | undefined {
  if (!named) return undefined;
  const out: Identifiers = {};
  for (const [k, v] of Object.entries(named)) {
    if (v !== undefined && v !== "") out[k] = v;
  }
  return Object.keys(out).length > 0 ? out : undefined;
}
