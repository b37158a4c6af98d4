/**
 * berth's one HTTP client, for every call it makes to its own servers: the
 * client library and CLI to the coordinator (src/client/http.ts), the
 * coordinator to an agent (src/providers/hosts/agent-call.ts), and the agent
 * to the coordinator (src/agent/enroll.ts, src/agent/identity/coordinator.ts).
 *
 * node:http (node:https loaded only when a URL asks for it), one keep-alive
 * pool per HttpClient, TCP_NODELAY (the requests are small and latency-bound).
 * Chosen by measurement (bench/http-client, docs/performance.md): a
 * keep-alive call costs the same as with undici, and loading it costs a
 * client command nothing where undici costs 100-200 ms.
 *
 * A request has a connect deadline (until its socket is connected; a pooled
 * socket already is), a deadline for the whole exchange (until the reply's
 * body is read) and an optional AbortSignal. The reply is its status, content
 * type, text and JSON body (undefined when it is not JSON). Errors:
 *   - a socket's own error as Node raised it, with its `code` (ECONNREFUSED,
 *     ECONNRESET, ...): callers decide what "unreachable" means;
 *   - an HttpCallError with code ETIMEDOUT (either deadline) or ABORT_ERR.
 * No error carries a header: a bearer token never reaches a message.
 */
import { Agent, request as httpRequest, type ClientRequest, type IncomingMessage, type RequestOptions } from "node:http";

/** A deadline passed (`ETIMEDOUT`) or the caller aborted (`ABORT_ERR`). */
export class HttpCallError extends Error {
  constructor(
    readonly code: "ETIMEDOUT" | "ABORT_ERR",
    message: string,
  ) {
    super(message);
    this.name = code === "ABORT_ERR" ? "AbortError" : "TimeoutError";
  }
}

export interface HttpReply {
  status: number;
  /** The content-type header ("" when absent). */
  type: string;
  text: string;
  /** The text parsed as JSON when the reply says it is JSON and parses; else undefined. */
  body: unknown;
}

export interface HttpCall {
  /** A JSON body: a string is sent as it is, anything else JSON-encoded. */
  body?: unknown;
  headers?: Record<string, string>;
  /** Until the socket is connected (default: the client's). */
  connectTimeoutMs?: number;
  /** The whole exchange, from the call to the reply's last byte (default: the client's; none when unset). */
  timeoutMs?: number;
  signal?: AbortSignal;
  /** Called once the request is handed to the OS, while its answer is awaited (work to overlap with the wait). */
  onSent?: () => void;
}

export interface HttpClientOptions {
  /** Sockets per origin (default: unbounded, idle ones reused). */
  connections?: number;
  connectTimeoutMs?: number;
  timeoutMs?: number;
  /**
   * How long an idle pooled socket is kept (default 4 s): below the idle
   * timeout of Node's servers (5 s by default, berth's 30 s), so a request is
   * not written to a socket the server is closing.
   */
  idleMs?: number;
}

type Requester = (o: RequestOptions, cb: (res: IncomingMessage) => void) => ClientRequest;
interface Transport {
  agent: Agent;
  request: Requester;
}

export class HttpClient {
  readonly #o: HttpClientOptions;
  #http: Transport | null = null;
  #https: Transport | null = null;

  constructor(o: HttpClientOptions = {}) {
    this.#o = o;
  }

  async #transport(protocol: string): Promise<Transport> {
    const agentOptions = { keepAlive: true, timeout: this.#o.idleMs ?? 4_000, ...(this.#o.connections !== undefined ? { maxSockets: this.#o.connections } : {}) };
    if (protocol === "https:") {
      if (this.#https === null) {
        // Loaded on first use: a plain-http client never pays for TLS.
        const https = await import("node:https");
        this.#https = { agent: new https.Agent(agentOptions), request: https.request as Requester };
      }
      return this.#https;
    }
    if (protocol !== "http:") throw new TypeError(`${protocol} is not http: or https:`);
    this.#http ??= { agent: new Agent(agentOptions), request: httpRequest };
    return this.#http;
  }

  /**
   * One request to `path` (sent as it is: no normalisation) on the server at
   * `origin` (http: or https:; its own path is not used).
   */
  async request(method: string, origin: URL, path: string, call: HttpCall = {}): Promise<HttpReply> {
    const u = origin;
    const headers: Record<string, string> = { ...call.headers };
    let payload: Buffer | undefined;
    if (call.body !== undefined) {
      payload = Buffer.from(typeof call.body === "string" ? call.body : JSON.stringify(call.body), "utf8");
      headers["content-type"] ??= "application/json";
      headers["content-length"] = String(payload.length);
    }
    const t = await this.#transport(u.protocol);
    const raw = await this.#exchange(t, method, u, path, headers, payload, call);
    return { ...raw, body: jsonOf(raw.type, raw.text) };
  }

  #exchange(t: Transport, method: string, u: URL, path: string, headers: Record<string, string>, payload: Buffer | undefined, call: HttpCall): Promise<Omit<HttpReply, "body">> {
    const connectMs = call.connectTimeoutMs ?? this.#o.connectTimeoutMs;
    const wholeMs = call.timeoutMs ?? this.#o.timeoutMs;
    const signal = call.signal;
    return new Promise((resolve, reject) => {
      if (signal?.aborted) return reject(aborted(u, signal));
      const timers: NodeJS.Timeout[] = [];
      let done = false;
      const finish = (err: Error | null, reply?: Omit<HttpReply, "body">): void => {
        if (done) return;
        done = true;
        for (const timer of timers) clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        if (err) {
          req.destroy();
          reject(err);
        } else resolve(reply!);
      };
      const onAbort = (): void => finish(aborted(u, signal!));
      const req = t.request({ method, protocol: u.protocol, host: u.hostname, port: u.port || undefined, path, headers, agent: t.agent }, (r) => {
        const chunks: Buffer[] = [];
        r.on("data", (c: Buffer) => chunks.push(c));
        r.on("error", (e) => finish(e));
        r.on("aborted", () => finish(Object.assign(new Error(`${u.origin} closed the connection before its reply was complete`), { code: "ECONNRESET" })));
        r.on("end", () => finish(null, { status: r.statusCode ?? 0, type: String(r.headers["content-type"] ?? ""), text: Buffer.concat(chunks).toString("utf8") }));
      });
      req.on("error", (e) => finish(e));
      req.on("socket", (s) => {
        s.setNoDelay(true);
        if (connectMs === undefined || !s.connecting) return;
        const timer = setTimeout(() => finish(new HttpCallError("ETIMEDOUT", `could not connect to ${u.origin} within ${connectMs} ms`)), connectMs);
        timers.push(timer);
        s.once("connect", () => clearTimeout(timer));
      });
      if (wholeMs !== undefined) timers.push(setTimeout(() => finish(new HttpCallError("ETIMEDOUT", `${u.origin} did not answer ${method} ${path.split("?")[0]} within ${wholeMs} ms`)), wholeMs));
      signal?.addEventListener("abort", onAbort, { once: true });
      if (call.onSent) req.once("finish", call.onSent);
      req.end(payload);
    });
  }

  /** Closes the pooled sockets; a later request opens new ones. */
  close(): void {
    this.#http?.agent.destroy();
    this.#https?.agent.destroy();
    this.#http = null;
    this.#https = null;
  }
}

function aborted(u: URL, signal: AbortSignal): Error {
  const why = signal.reason instanceof Error ? `: ${signal.reason.message}` : "";
  return new HttpCallError("ABORT_ERR", `the request to ${u.origin} was aborted${why}`);
}

function jsonOf(type: string, text: string): unknown {
  if (text.length === 0 || !type.includes("json")) return undefined;
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}
