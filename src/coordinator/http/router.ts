/**
 * A small router on node:http: exact segments and `{param}` segments; every
 * param goes through `parseId` before a handler sees it. JSON bodies are
 * size-limited and validated by a zod schema that names the offending field;
 * unknown fields are refused. Errors are `{"error":{"code","message"}}` with
 * the code's status; unexpected failures are logged and answered as
 * `internal` without detail.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { z } from "zod";
import { BerthError, isBerthError } from "../../core/errors.js";
import { parseId, type Id } from "../../core/ids.js";
import type { Logger } from "pino";

export const MAX_BODY_BYTES = 64 * 1024;

export interface Request {
  method: string;
  params: Record<string, Id>;
  headers: IncomingMessage["headers"];
  body: unknown;
  raw: IncomingMessage;
}

export type Reply = { status: number; body: unknown } | { status: number; text: string; contentType: string };

export type Handler = (req: Request) => Promise<Reply>;

interface Route {
  method: string;
  segments: string[];
  handler: Handler;
}

export class Router {
  readonly #routes: Route[] = [];

  add(method: string, path: string, handler: Handler): this {
    this.#routes.push({ method, segments: path.split("/").filter(Boolean), handler });
    return this;
  }

  match(method: string, path: string): { handler: Handler; params: Record<string, Id> } | { error: BerthError } {
    const parts = path.split("/").slice(1);
    // Exact segment counts first; only then may a param absorb several
    // segments, so "a/b" is refused as an invalid id, not an unknown route.
    for (const absorb of [false, true]) {
      let pathMatched = false;
      for (const r of this.#routes) {
        const params = bindParams(r.segments, parts, absorb);
        if (!params) continue;
        pathMatched = true;
        const checked: Record<string, Id> = {};
        try {
          for (const [k, v] of Object.entries(params)) checked[k] = parseId(v, k);
        } catch (e) {
          return { error: e as BerthError };
        }
        if (r.method !== method) continue;
        return { handler: r.handler, params: checked };
      }
      if (pathMatched) return { error: new BerthError("method_not_allowed", `method_not_allowed: ${method} is not supported on ${path}`) };
    }
    return { error: new BerthError("not_found", `not_found: no route ${method} ${path}`) };
  }
}

/**
 * Binds a path to a route's segments. A param may absorb several raw
 * segments ("a/b"), so that such a path reaches `parseId` and is refused as
 * an invalid id rather than as an unknown route.
 */
function bindParams(segments: string[], parts: string[], absorb: boolean): Record<string, string> | null {
  const extra = parts.length - segments.length;
  if (extra < 0 || (extra > 0 && !absorb)) return null;
  const paramIdx = segments.findIndex((s) => s.startsWith("{"));
  if (extra > 0 && paramIdx < 0) return null;
  const params: Record<string, string> = {};
  let j = 0;
  for (let i = 0; i < segments.length; i++) {
    const seg = segments[i]!;
    if (seg.startsWith("{")) {
      const take = i === paramIdx ? 1 + extra : 1;
      params[seg.slice(1, -1)] = parts.slice(j, j + take).map(decodeSegment).join("/");
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

export function readBody(req: IncomingMessage, limit = MAX_BODY_BYTES): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const declared = Number(req.headers["content-length"] ?? "0");
    if (declared > limit) {
      reject(new BerthError("body_too_large", `body_too_large: request bodies are limited to ${limit} bytes`));
      req.resume();
      return;
    }
    const chunks: Buffer[] = [];
    let size = 0;
    req.on("data", (c: Buffer) => {
      size += c.length;
      if (size > limit) {
        // Answer 413 at once but keep discarding what the client is still
        // sending (up to a bound), so it reads the answer instead of a reset.
        reject(new BerthError("body_too_large", `body_too_large: request bodies are limited to ${limit} bytes`));
        chunks.length = 0;
        if (size > limit * 16) req.destroy();
        return;
      }
      chunks.push(c);
    });
    req.on("end", () => resolve(chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks)));
    req.on("error", reject);
  });
}

export function parseJson(buf: Buffer): unknown {
  if (buf.length === 0) return undefined;
  try {
    return JSON.parse(buf.toString("utf8"));
  } catch {
    throw new BerthError("invalid_request", "invalid_request: the body is not valid JSON");
  }
}

/** Validates with a schema; the error names the first offending field. */
export function validate<T>(schema: z.ZodType<T>, value: unknown): T {
  const r = schema.safeParse(value ?? {});
  if (r.success) return r.data;
  const issue = r.error.issues[0]!;
  const at = issue.path.map(String);
  if (issue.code === "unrecognized_keys") {
    // Named with their full path ("identity.tag"), so a nested unknown field is found at once.
    const keys = (issue as { keys?: string[] }).keys ?? [];
    throw new BerthError("invalid_request", `invalid_request: unknown field ${keys.map((k) => [...at, k].join(".")).join(", ")}`);
  }
  const field = at.length ? at.join(".") : "body";
  // A body field that must be an id fails the way a path id does.
  if (issue.code === "custom" && (issue as { params?: { berth?: string } }).params?.berth === "invalid_id") {
    throw new BerthError("invalid_id", `invalid_id: field ${field} ${issue.message}`);
  }
  throw new BerthError("invalid_request", `invalid_request: field ${field}: ${issue.message}`);
}

export function send(res: ServerResponse, reply: Reply): void {
  if ("text" in reply) {
    res.writeHead(reply.status, { "content-type": reply.contentType, "content-length": Buffer.byteLength(reply.text) });
    res.end(reply.text);
    return;
  }
  const body = JSON.stringify(reply.body);
  res.writeHead(reply.status, { "content-type": "application/json", "content-length": Buffer.byteLength(body) });
  res.end(body);
}

export function sendError(res: ServerResponse, e: unknown, log: Logger): void {
  if (isBerthError(e)) {
    // The rest of an oversized body is not worth reading on this connection.
    if (e.code === "body_too_large") res.setHeader("connection", "close");
    // Refusals are routine; at debug level an operator can follow them (messages never hold secrets).
    log.debug({ code: e.code, status: e.status, message: e.message }, "request refused");
    send(res, { status: e.status, body: { error: { code: e.code, message: e.message } } });
    return;
  }
  log.error({ err: e instanceof Error ? e.message : String(e) }, "request failed");
  send(res, { status: 500, body: { error: { code: "internal", message: "internal: the coordinator failed to handle this request; see its log" } } });
}

export function ok(body: unknown, status = 200): Reply {
  return { status, body };
}
