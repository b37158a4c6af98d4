/**
 * The HTTP client for the coordinator API, used by the client library, the
 * CLI, benchmarks and tests: JSON in and out over keep-alive connections
 * (node:http; node:https only when the URL asks for it). A refusal becomes
 * an ApiError with the server's stable code and message.
 *
 * Built on node:http rather than undici: loading undici costs a client
 * command 100-200 ms on this class of machine, more than the whole borrow.
 */
import { Agent, request as httpRequest, type IncomingMessage, type RequestOptions } from "node:http";
import { API, replyMismatch, routePath, type Route, type RouteBody, type RouteParams, type RouteReply } from "../protocol/api.js";

export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
    this.name = "ApiError";
  }
}

type Requester = (o: RequestOptions, cb: (res: IncomingMessage) => void) => ReturnType<typeof httpRequest>;

export class Api {
  readonly #auth: string | null;
  readonly #url: URL;
  #agent: Agent | null = null;
  #request: Requester | null = null;
  readonly #connections: number;

  constructor(
    readonly baseUrl: string,
    token: string | null,
    opts: { connections?: number } = {},
  ) {
    let url: URL;
    try {
      url = new URL(baseUrl);
    } catch {
      throw new ApiError(0, "invalid_request", `invalid_request: coordinator URL ${JSON.stringify(baseUrl)} is not a URL; expected e.g. http://127.0.0.1:7420`);
    }
    this.#url = url;
    if (this.#url.protocol !== "http:" && this.#url.protocol !== "https:") throw new ApiError(0, "invalid_request", `invalid_request: coordinator URL ${baseUrl} is not http(s)`);
    this.#auth = token ? `Bearer ${token}` : null;
    this.#connections = opts.connections ?? 8;
  }

  async #transport(): Promise<{ agent: Agent; request: Requester }> {
    if (this.#agent && this.#request) return { agent: this.#agent, request: this.#request };
    if (this.#url.protocol === "https:") {
      const https = await import("node:https");
      this.#agent = new https.Agent({ keepAlive: true, maxSockets: this.#connections });
      this.#request = https.request as Requester;
    } else {
      this.#agent = new Agent({ keepAlive: true, maxSockets: this.#connections });
      this.#request = httpRequest as Requester;
    }
    return { agent: this.#agent, request: this.#request };
  }

  /** `onSent`: called once the request is handed to the OS, while its answer is awaited (work to overlap with the wait). */
  async raw(method: string, path: string, body?: unknown, headers: Record<string, string> = {}, onSent?: () => void): Promise<{ status: number; body: unknown; text: string }> {
    const h: Record<string, string> = { ...headers };
    if (this.#auth && !("authorization" in h)) h.authorization = this.#auth;
    let payload: Buffer | undefined;
    if (body !== undefined) {
      payload = Buffer.from(typeof body === "string" ? body : JSON.stringify(body), "utf8");
      h["content-type"] = "application/json";
      h["content-length"] = String(payload.length);
    }
    const { agent, request } = await this.#transport();
    const res = await new Promise<{ status: number; type: string; text: string }>((resolve, reject) => {
      const req = request(
        { method, host: this.#url.hostname, port: this.#url.port || undefined, path, headers: h, agent },
        (r) => {
          const chunks: Buffer[] = [];
          r.on("data", (c: Buffer) => chunks.push(c));
          r.on("error", reject);
          r.on("end", () => resolve({ status: r.statusCode ?? 0, type: String(r.headers["content-type"] ?? ""), text: Buffer.concat(chunks).toString("utf8") }));
        },
      );
      // Requests are small and latency-bound: no Nagle.
      req.on("socket", (s) => s.setNoDelay(true));
      req.on("error", reject);
      if (onSent) req.once("finish", onSent);
      req.end(payload);
    });
    let parsed: unknown = undefined;
    if (res.text.length > 0 && res.type.includes("json")) {
      try {
        parsed = JSON.parse(res.text);
      } catch {
        parsed = undefined;
      }
    }
    return { status: res.status, body: parsed, text: res.text };
  }

  /**
   * One call of a coordinator route (src/protocol/api.ts): the path built from
   * `params`, the reply parsed by the route's schema. A refusal is an ApiError
   * with the server's code; a reply that does not match the contract is an
   * ApiError `invalid_reply` naming the first offending field.
   */
  async send<R extends Route>(route: R, params: RouteParams<R>, body?: RouteBody<R>, o: { query?: string; onSent?: () => void } = {}): Promise<RouteReply<R>> {
    const space = route.indexOf(" ");
    const path = routePath(route, params as Record<string, string>) + (o.query ? `?${o.query}` : "");
    const r = await this.raw(route.slice(0, space), path, body, {}, o.onSent);
    refusal(r);
    const schema = API[route].reply;
    if (schema === null) return r.text as RouteReply<R>;
    const parsed = schema.safeParse(r.body);
    if (!parsed.success) throw new ApiError(r.status, "invalid_reply", replyMismatch(route, parsed.error.issues));
    return parsed.data as RouteReply<R>;
  }

  /**
   * A request by method and path, its JSON reply unchecked: for tests and
   * benchmarks that send what no route accepts on purpose. berth's own code
   * calls routes with `send`.
   */
  async call<T = Record<string, unknown>>(method: string, path: string, body?: unknown, onSent?: () => void): Promise<T> {
    const r = await this.raw(method, path, body, {}, onSent);
    refusal(r);
    return r.body as T;
  }

  close(): Promise<void> {
    this.#agent?.destroy();
    return Promise.resolve();
  }
}

/** A status of 400 or more as the ApiError the server's error body names. */
function refusal(r: { status: number; body: unknown }): void {
  if (r.status < 400) return;
  const err = (r.body as { error?: { code?: string; message?: string } } | undefined)?.error;
  throw new ApiError(r.status, err?.code ?? "http_error", err?.message ?? `the coordinator answered ${r.status}`);
}
