/**
 * berth's one HTTP client (src/http/client.ts) against a real node:http
 * server on a loopback port: JSON out and back, the path sent as given,
 * keep-alive reuse of one connection, the whole-exchange deadline, abort,
 * and a refused connection surfacing as Node's own error with its code.
 */
import { strict as assert } from "node:assert";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, it } from "node:test";
import { HttpCallError, HttpClient } from "../../src/http/client.js";

interface Seen {
  method: string;
  url: string;
  port: number;
  headers: IncomingMessage["headers"];
  body: string;
}

describe("HttpClient", () => {
  let server: Server;
  let origin: URL;
  const seen: Seen[] = [];
  /** Requests held open (never answered) until the test ends. */
  const held: ServerResponse[] = [];

  before(async () => {
    server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        seen.push({ method: req.method!, url: req.url!, port: req.socket.remotePort!, headers: req.headers, body: Buffer.concat(chunks).toString("utf8") });
        if (req.url === "/stall") return void held.push(res);
        if (req.url === "/text") {
          res.writeHead(200, { "content-type": "text/plain" });
          return void res.end("{\"not\":\"json by type\"}");
        }
        res.writeHead(req.url === "/refuse" ? 409 : 200, { "content-type": "application/json" });
        res.end(JSON.stringify({ echo: chunks.length > 0 ? JSON.parse(Buffer.concat(chunks).toString("utf8")) : null }));
      });
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    origin = new URL(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
  });

  after(async () => {
    for (const r of held) r.destroy();
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  });

  it("sends a JSON body and parses a JSON reply; a non-2xx status is a reply, not an error", async () => {
    const c = new HttpClient();
    try {
      const r = await c.request("POST", origin, "/echo", { body: { a: 1, b: ["x"] }, headers: { authorization: "Bearer t" } });
      assert.equal(r.status, 200);
      assert.deepEqual(r.body, { echo: { a: 1, b: ["x"] } });
      const last = seen.at(-1)!;
      assert.equal(last.headers["content-type"], "application/json");
      assert.equal(last.headers.authorization, "Bearer t");
      const refused = await c.request("POST", origin, "/refuse", { body: {} });
      assert.equal(refused.status, 409);
      const text = await c.request("GET", origin, "/text");
      assert.equal(text.body, undefined, "a reply that does not say it is JSON is not parsed");
      assert.equal(text.text, '{"not":"json by type"}');
    } finally {
      c.close();
    }
  });

  it("sends the path as given, without normalising it", async () => {
    const c = new HttpClient();
    try {
      await c.request("GET", origin, "/a/../b%2f?q=1");
      assert.equal(seen.at(-1)!.url, "/a/../b%2f?q=1");
    } finally {
      c.close();
    }
  });

  it("reuses one keep-alive connection for sequential calls", async () => {
    const c = new HttpClient();
    try {
      const before = seen.length;
      for (let i = 0; i < 5; i++) await c.request("POST", origin, "/echo", { body: { i } });
      const ports = new Set(seen.slice(before).map((s) => s.port));
      assert.equal(ports.size, 1, `five calls used ${ports.size} connections`);
    } finally {
      c.close();
    }
  });

  it("gives up after the whole-exchange deadline with ETIMEDOUT, and the connection is not reused", async () => {
    const c = new HttpClient();
    try {
      await assert.rejects(c.request("POST", origin, "/stall", { body: {}, timeoutMs: 200 }), (e: unknown) => {
        assert.ok(e instanceof HttpCallError);
        assert.equal(e.code, "ETIMEDOUT");
        assert.match(e.message, /did not answer POST \/stall within 200 ms/);
        return true;
      });
      const r = await c.request("POST", origin, "/echo", { body: { after: true } });
      assert.deepEqual(r.body, { echo: { after: true } });
    } finally {
      c.close();
    }
  });

  it("stops at an abort, and refuses a signal already aborted", async () => {
    const c = new HttpClient();
    try {
      const ac = new AbortController();
      const p = c.request("POST", origin, "/stall", { body: {}, signal: ac.signal });
      setTimeout(() => ac.abort(new Error("shutting down")), 50);
      await assert.rejects(p, (e: unknown) => e instanceof HttpCallError && e.code === "ABORT_ERR" && /aborted: shutting down/.test(e.message));
      const before = seen.length;
      await assert.rejects(c.request("POST", origin, "/echo", { body: {}, signal: AbortSignal.abort() }), (e: unknown) => e instanceof HttpCallError && e.code === "ABORT_ERR");
      assert.equal(seen.length, before, "nothing was sent");
    } finally {
      c.close();
    }
  });

  it("passes a refused connection on as Node's error, with its code and without the request's headers", async () => {
    const probe = createServer();
    await new Promise<void>((r) => probe.listen(0, "127.0.0.1", r));
    const port = (probe.address() as AddressInfo).port;
    await new Promise((r) => probe.close(r));
    const c = new HttpClient({ connectTimeoutMs: 5_000 });
    try {
      await assert.rejects(c.request("POST", new URL(`http://127.0.0.1:${port}`), "/x", { body: {}, headers: { authorization: "Bearer secret-token-value" } }), (e: unknown) => {
        assert.equal((e as NodeJS.ErrnoException).code, "ECONNREFUSED");
        assert.ok(!String((e as Error).message).includes("secret-token-value"));
        return true;
      });
    } finally {
      c.close();
    }
  });

  it("calls onSent once the request is written, before the reply is read", async () => {
    const c = new HttpClient();
    try {
      let sent = 0;
      const r = await c.request("POST", origin, "/echo", { body: { s: 1 }, onSent: () => sent++ });
      assert.equal(sent, 1);
      assert.deepEqual(r.body, { echo: { s: 1 } });
    } finally {
      c.close();
    }
  });
});
