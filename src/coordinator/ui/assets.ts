/**
 * Static files of the dashboard, served from the package itself (never a
 * CDN): htmx, uPlot, and the
 * dashboard's own script and stylesheet. Each is read once, kept in memory
 * with a content hash as its ETag, and answered 304 to a matching
 * `If-None-Match`.
 */
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import type { IncomingMessage, ServerResponse } from "node:http";
import { UI_CSS } from "./client/style.js";
import { UI_JS } from "./client/script.js";

interface Asset {
  type: string;
  body: Buffer;
  etag: string;
}

const JS = "text/javascript; charset=utf-8";
const CSS = "text/css; charset=utf-8";

/**
 * URL path → where its bytes come from. The live stream is the dashboard's
 * own script's (client/script.ts: it tells a coordinator that is down from
 * a session that ended), not htmx's SSE extension.
 */
const SOURCES: Record<string, { type: string; modules?: string[]; text?: string }> = {
  "/ui/assets/htmx.js": { type: JS, modules: ["htmx.org/dist/htmx.min.js"] },
  "/ui/assets/uplot.js": { type: JS, modules: ["uplot/dist/uPlot.iife.min.js"] },
  "/ui/assets/uplot.css": { type: CSS, modules: ["uplot/dist/uPlot.min.css"] },
  "/ui/assets/ui.js": { type: JS, text: UI_JS },
  "/ui/assets/ui.css": { type: CSS, text: UI_CSS },
};

export const ASSET_PATHS = Object.keys(SOURCES);

const cache = new Map<string, Asset>();
const require = createRequire(import.meta.url);

function load(path: string): Asset {
  let a = cache.get(path);
  if (a) return a;
  const src = SOURCES[path]!;
  const body = src.modules ? Buffer.concat(src.modules.flatMap((m) => [readFileSync(require.resolve(m)), Buffer.from(";\n")])) : Buffer.from(src.text!, "utf8");
  a = { type: src.type, body, etag: `"${createHash("sha256").update(body).digest("base64url").slice(0, 22)}"` };
  cache.set(path, a);
  return a;
}

export function serveAsset(path: string, req: IncomingMessage, res: ServerResponse): void {
  const a = load(path);
  const headers = { etag: a.etag, "cache-control": "no-cache", "x-content-type-options": "nosniff" };
  if (req.headers["if-none-match"] === a.etag) {
    res.writeHead(304, headers);
    res.end();
    return;
  }
  res.writeHead(200, { ...headers, "content-type": a.type, "content-length": a.body.length });
  res.end(a.body);
}
