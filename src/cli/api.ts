/**
 * The HTTP client for the coordinator API, used by the CLI, benchmarks and
 * tests. Keep-alive connections (undici Pool), JSON in and out; a refusal
 * becomes an ApiError with the server's stable code and message.
 */
import { Pool } from "undici";

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
  readonly #pool: Pool;
  readonly #auth: string | null;

  constructor(
    readonly baseUrl: string,
    token: string | null,
    opts: { connections?: number } = {},
  ) {
    this.#pool = new Pool(baseUrl, { connections: opts.connections ?? 8, pipelining: 1, keepAliveTimeout: 60_000 });
    this.#auth = token ? `Bearer ${token}` : null;
  }

  async raw(method: string, path: string, body?: unknown, headers: Record<string, string> = {}): Promise<{ status: number; body: unknown; text: string }> {
    const h: Record<string, string> = { ...headers };
    if (this.#auth && !("authorization" in h)) h.authorization = this.#auth;
    let payload: string | undefined;
    if (body !== undefined) {
      payload = typeof body === "string" ? body : JSON.stringify(body);
      h["content-type"] = "application/json";
    }
    const r = await this.#pool.request({ method: method as "GET", path, headers: h, body: payload });
    const text = await r.body.text();
    let parsed: unknown = undefined;
    if (text.length > 0 && String(r.headers["content-type"] ?? "").includes("json")) {
      try {
        parsed = JSON.parse(text);
      } catch {
        parsed = undefined;
      }
    }
    return { status: r.statusCode, body: parsed, text };
  }

  async call<T = Record<string, unknown>>(method: string, path: string, body?: unknown): Promise<T> {
    const r = await this.raw(method, path, body);
    if (r.status >= 400) {
      const err = (r.body as { error?: { code?: string; message?: string } } | undefined)?.error;
      throw new ApiError(r.status, err?.code ?? "http_error", err?.message ?? `the coordinator answered ${r.status}`);
    }
    return r.body as T;
  }

  close(): Promise<void> {
    return this.#pool.close();
  }
}
