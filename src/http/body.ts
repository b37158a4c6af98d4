/**
 * Reading a request body (server.ts step 3): up to a limit (413
 * `body_too_large`, declared or counted), as JSON or as form fields; and,
 * after a refusal sent while the body is still arriving, discarding the rest
 * up to a bound in bytes and in time.
 */
import type { IncomingMessage } from "node:http";
import { BerthError } from "../core/errors.js";

/** How much of an unread body is discarded after a refusal, and for how long, before the connection is cut. */
export const LINGER_BYTES = 64 * 1024 * 1024;
export const LINGER_MS = 5_000;

export function discardBounded(req: IncomingMessage, bound: number, ms: number): void {
  let seen = 0;
  const cut = setTimeout(() => req.socket.destroy(), ms);
  cut.unref();
  req.removeAllListeners("data");
  req.on("data", (c: Buffer) => {
    seen += c.length;
    if (seen > bound) req.socket.destroy();
  });
  req.once("end", () => clearTimeout(cut));
  req.once("close", () => clearTimeout(cut));
  req.resume();
}

export function readBody(req: IncomingMessage, limit: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const tooLarge = () => new BerthError("body_too_large", `body_too_large: request bodies are limited to ${limit} bytes`);
    if (Number(req.headers["content-length"] ?? "0") > limit) {
      reject(tooLarge());
      return;
    }
    const chunks: Buffer[] = [];
    let size = 0;
    let done = false;
    req.on("data", (c: Buffer) => {
      if (done) return;
      size += c.length;
      if (size > limit) {
        done = true;
        chunks.length = 0;
        reject(tooLarge());
        return;
      }
      chunks.push(c);
    });
    req.on("end", () => {
      if (done) return;
      done = true;
      resolve(chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks));
    });
    req.on("error", () => {
      if (done) return;
      done = true;
      // The connection ended before the body did (the client went, or the request deadline closed it).
      reject(new BerthError("invalid_request", "invalid_request: the connection ended before the request body was whole"));
    });
  });
}

export function parseForm(buf: Buffer): Record<string, string> {
  return Object.fromEntries(new URLSearchParams(buf.toString("utf8")));
}

export function parseJson(buf: Buffer): unknown {
  if (buf.length === 0) return undefined;
  try {
    return JSON.parse(buf.toString("utf8"));
  } catch {
    throw new BerthError("invalid_request", "invalid_request: the body is not valid JSON");
  }
}
