/**
 * Route matching for the one HTTP layer: exact segments and `:param`
 * segments; every param goes through `parseId` before a handler sees it.
 *
 * - a known path with another method is 405 `method_not_allowed`, with the
 *   methods that path takes (for the `Allow` header);
 * - a param that is not a valid id (several segments "a/b", "%2F", a broken
 *   percent-encoding, an empty segment, 129 characters) is 400 `invalid_id`
 *   from `parseId`, not an unknown route;
 * - anything else is 404 `not_found`.
 *
 * Exact segment counts are tried first; only then may a param absorb several
 * segments, so "a/b" is refused as an invalid id, not as an unknown route.
 */
import { BerthError } from "../core/errors.js";
import { parseId, type Id } from "../core/ids.js";

export type Matched<R> = { route: R; params: Record<string, Id> } | { error: BerthError; allow?: string[] };

export class Router<R> {
  readonly #routes: Array<{ method: string; segments: string[]; route: R }> = [];

  add(method: string, path: string, route: R): void {
    this.#routes.push({ method, segments: path.split("/").filter(Boolean), route });
  }

  /** Every route added, as added (`/v1/pools/:pool`). */
  list(): Array<{ method: string; path: string }> {
    return this.#routes.map((r) => ({ method: r.method, path: "/" + r.segments.join("/") }));
  }

  /** `path` is the request path without its query. */
  match(method: string, path: string): Matched<R> {
    const parts = path.split("/").slice(1);
    for (const absorb of [false, true]) {
      const allow: string[] = [];
      for (const r of this.#routes) {
        const raw = bindParams(r.segments, parts, absorb);
        if (!raw) continue;
        const params: Record<string, Id> = {};
        try {
          for (const k in raw) params[k] = parseId(raw[k], k);
        } catch (e) {
          return { error: e as BerthError };
        }
        if (r.method === method) return { route: r.route, params };
        if (!allow.includes(r.method)) allow.push(r.method);
      }
      if (allow.length > 0) {
        return {
          allow,
          error: new BerthError("method_not_allowed", `method_not_allowed: ${shorten(method)} is not supported on ${shorten(path)}; use ${allow.join(", ")}`),
        };
      }
    }
    return { error: new BerthError("not_found", `not_found: no route ${shorten(method)} ${shorten(path)}`) };
  }
}

function shorten(s: string): string {
  return s.length > 100 ? s.slice(0, 100) + "…" : s;
}

/** Binds a path to a route's segments; one param may absorb several raw segments ("a/b"). */
function bindParams(segments: string[], parts: string[], absorb: boolean): Record<string, string> | null {
  const extra = parts.length - segments.length;
  if (extra < 0 || (extra > 0 && !absorb)) return null;
  const paramIdx = segments.findIndex((s) => s.startsWith(":"));
  if (extra > 0 && paramIdx < 0) return null;
  const params: Record<string, string> = {};
  let j = 0;
  for (let i = 0; i < segments.length; i++) {
    const seg = segments[i]!;
    if (seg.startsWith(":")) {
      const take = i === paramIdx ? 1 + extra : 1;
      params[seg.slice(1)] = parts.slice(j, j + take).map(decodeSegment).join("/");
      j += take;
    } else {
      if (seg !== parts[j]) return null;
      j++;
    }
  }
  return params;
}

function decodeSegment(s: string): string {
  // A percent-encoded segment is checked as decoded: "%2F" is "/", which no id may hold.
  try {
    return decodeURIComponent(s);
  } catch {
    return s;
  }
}
