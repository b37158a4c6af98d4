/**
 * The HTTP client for the coordinator API, used by the client library, the
 * CLI, benchmarks and tests: JSON in and out over keep-alive connections
 * (berth's one HTTP client, src/http/client.ts: node:http, node:https only
 * when the URL asks for it). A refusal becomes an ApiError with the server's
 * stable code and message; a connection error is Node's own (its `code`,
 * e.g. ECONNREFUSED, is what the CLI and MCP server read).
 */
import { HttpClient } from "../http/client.js";
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

export class Api {
  readonly #auth: string | null;
  readonly #origin: URL;
  readonly #http: HttpClient;

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
    if (url.protocol !== "http:" && url.protocol !== "https:") throw new ApiError(0, "invalid_request", `invalid_request: coordinator URL ${baseUrl} is not http(s)`);
    this.#origin = url;
    this.#auth = token ? `Bearer ${token}` : null;
    this.#http = new HttpClient({ connections: opts.connections ?? 8 });
  }

  /** `onSent`: called once the request is handed to the OS, while its answer is awaited (work to overlap with the wait). */
  async raw(method: string, path: string, body?: unknown, headers: Record<string, string> = {}, onSent?: () => void): Promise<{ status: number; body: unknown; text: string }> {
    const h: Record<string, string> = { ...headers };
    if (this.#auth && !("authorization" in h)) h.authorization = this.#auth;
    const r = await this.#http.request(method, this.#origin, path, { headers: h, body, ...(onSent ? { onSent } : {}) });
    return { status: r.status, body: r.body, text: r.text };
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
    this.#http.close();
    return Promise.resolve();
  }
}

/** A status of 400 or more as the ApiError the server's error body names. */
function refusal(r: { status: number; body: unknown }): void {
  if (r.status < 400) return;
  const err = (r.body as { error?: { code?: string; message?: string } } | undefined)?.error;
  throw new ApiError(r.status, err?.code ?? "http_error", err?.message ?? `the coordinator answered ${r.status}`);
}
