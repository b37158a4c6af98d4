/**
 * Static files of the dashboard, served from the package itself (never a
 * CDN): htmx, uPlot, and the dashboard's own script and stylesheet.
 *
 * Each is read once and kept in memory with its gzip and brotli forms. Pages
 * name them by content hash (`/ui/assets/ui.3f9a….js`), answered with
 * `Cache-Control: public, max-age=31536000, immutable`: a browser fetches
 * each once per release and never revalidates it on a page view. The plain
 * names (`/ui/assets/ui.js`) still answer, `no-cache` with an ETag.
 */
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { brotliCompressSync, constants, gzipSync } from "node:zlib";
import type { IncomingMessage, ServerResponse } from "node:http";
import { UI_CSS } from "./client/style.js";
import { UI_JS } from "./client/script.js";

interface Asset {
  type: string;
  body: Buffer;
  gzip: Buffer;
  br: Buffer;
  etag: string;
  /** The name pages use: the plain name with the content hash before its extension. */
  hashed: string;
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
  const hash = createHash("sha256").update(body).digest("base64url").slice(0, 16);
  const dot = path.lastIndexOf(".");
  a = {
    type: src.type,
    body,
    gzip: gzipSync(body, { level: 9 }),
    br: brotliCompressSync(body, { params: { [constants.BROTLI_PARAM_QUALITY]: 11 } }),
    etag: `"${hash}"`,
    hashed: `${path.slice(0, dot)}.${hash}${path.slice(dot)}`,
  };
  cache.set(path, a);
  return a;
}

/** The content-hashed URL of an asset (what pages link to). */
export function assetUrl(path: string): string {
  return load(path).hashed;
}

/** Every URL an asset answers at: its plain name and its hashed one. */
export function assetRoutes(): Array<{ url: string; path: string; immutable: boolean }> {
  return ASSET_PATHS.flatMap((path) => [
    { url: path, path, immutable: false },
    { url: assetUrl(path), path, immutable: true },
  ]);
}

/** The best encoding the client accepts of those given (brotli, then gzip), or null. */
export function acceptedEncoding(req: IncomingMessage, offered: ReadonlyArray<"br" | "gzip">): "br" | "gzip" | null {
  const accept = String(req.headers["accept-encoding"] ?? "");
  for (const e of offered) {
    const m = new RegExp(`(?:^|,)\\s*${e}\\s*(?:;\\s*q=([0-9.]+))?`, "i").exec(accept);
    if (m && (m[1] === undefined || Number(m[1]) > 0)) return e;
  }
  return null;
}

export function serveAsset(path: string, immutable: boolean, req: IncomingMessage, res: ServerResponse): void {
  const a = load(path);
  const headers = { etag: a.etag, "cache-control": immutable ? "public, max-age=31536000, immutable" : "no-cache", "x-content-type-options": "nosniff", vary: "accept-encoding" };
  if (req.headers["if-none-match"] === a.etag) {
    res.writeHead(304, headers);
    res.end();
    return;
  }
  const enc = acceptedEncoding(req, ["br", "gzip"]);
  const body = enc === "br" ? a.br : enc === "gzip" ? a.gzip : a.body;
  res.writeHead(200, { ...headers, "content-type": a.type, "content-length": body.length, ...(enc ? { "content-encoding": enc } : {}) });
  res.end(body);
}
