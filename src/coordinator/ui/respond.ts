/** How the dashboard answers: HTML with strict security headers, redirects, and refusals as pages. */
import type { ServerResponse } from "node:http";
import { gzip } from "node:zlib";
import { acceptedEncoding } from "./assets.js";
import { isBerthError } from "../../core/errors.js";
import { TAKEN } from "../../http/server.js";
import type { Html } from "./html.js";
import { renderError } from "./pages/plain.js";
import { errorPage, type View } from "./layout.js";

/** Scripts, styles and connections from this origin only; no framing; forms post here only. */
export const SECURITY_HEADERS: Record<string, string> = {
  "content-security-policy":
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
  "x-frame-options": "DENY",
  // same-origin, not no-referrer: with no-referrer the browser sends `Origin: null` on our own form posts.
  "referrer-policy": "same-origin",
  "x-content-type-options": "nosniff",
  "cache-control": "no-store",
};

/** `body` as markup, or already encoded (a page that measured its own time, encoding included). */
/**
 * Pages of 1 KiB and more are sent gzip-compressed to a browser that
 * accepts it (compressed off the event loop's path: zlib's thread pool).
 */
export function sendHtml(res: ServerResponse, status: number, body: Html | Buffer, headers: Record<string, string> = {}): typeof TAKEN {
  const bytes = Buffer.isBuffer(body) ? body : Buffer.from(body.text, "utf8");
  const send = (b: Buffer, enc: string | null) => {
    res.writeHead(status, { ...SECURITY_HEADERS, ...headers, "content-type": "text/html; charset=utf-8", vary: "accept-encoding", "content-length": b.length, ...(enc ? { "content-encoding": enc } : {}) });
    res.end(b);
  };
  if (bytes.length < 1024 || acceptedEncoding(res.req, ["gzip"]) === null) {
    send(bytes, null);
    return TAKEN;
  }
  gzip(bytes, { level: 6 }, (err, z) => (err ? send(bytes, null) : send(z, "gzip")));
  return TAKEN;
}

export function redirect(res: ServerResponse, location: string, headers: Record<string, string> = {}): typeof TAKEN {
  res.writeHead(303, { ...SECURITY_HEADERS, ...headers, location, "content-length": 0 });
  res.end();
  return TAKEN;
}

/** A refusal as a page (its code's status and message); anything else is the HTTP layer's `internal`. */
export function sendRefusal(res: ServerResponse, e: unknown, v: View | null): typeof TAKEN {
  if (!isBerthError(e)) throw e;
  return sendHtml(res, e.status, v ? errorPage(v, e.status, e.message) : renderError(e.status, e.message, false));
}

/** A path inside the dashboard to go back to after an action, or the fallback. */
export function backTo(raw: unknown, fallback: string): string {
  return typeof raw === "string" && /^\/ui(\/[A-Za-z0-9_\-/]*)?$/.test(raw) && !raw.includes("//") ? raw : fallback;
}
