/**
 * What a client without a token can hold (docs/operations.md, "Timeouts and
 * limits"), against real servers on loopback sockets: a coordinator, an
 * agent's API and its SSH gateway, each with short deadlines and small caps.
 *
 *   - a chunked body of 10 MB is answered 413 body_too_large (it was a
 *     connection reset: the refusal cut the connection after 1 MB);
 *   - a request that stops mid-body is answered 408 request_timeout and
 *     closed; a handler that runs longer than the request deadline still
 *     answers (the deadline is for receiving the request only);
 *   - a connection over the per-address cap is answered 503
 *     too_many_connections, another address is served;
 *   - routes without a token are limited per address (429 rate_limited with
 *     retry-after), health and routes with a token are not;
 *   - the SSH gateway destroys a connection that never authenticates (one
 *     that sends nothing at all included) and refuses one over its
 *     per-address cap of unauthenticated connections with a line saying so.
 *
 * Seen failing before the limits existed: the 10 MB chunked body got a
 * reset, the stalled body stayed open, and the silent SSH connection was
 * never closed (ssh2 starts its own timer only after the version line).
 */
import { strict as assert } from "node:assert";
import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { request } from "node:http";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { startAgent, type RunningAgent } from "../../src/agent/agent.js";
import { newToken } from "../../src/core/tokens.js";
import { createHttpServer } from "../../src/http/server.js";
import { startTestCoordinator, type TestCoordinator } from "../helpers/env.js";

interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  text: string;
}

/** One request with `connection: close`; a chunked body is streamed in 64 KiB pieces. */
function send(base: string, method: string, path: string, o: { token?: string; chunkedBytes?: number; localAddress?: string } = {}): Promise<Answer> {
  const url = new URL(base);
  return new Promise((resolve, reject) => {
    const headers: Record<string, string> = { connection: "close" };
    if (o.token) headers.authorization = `Bearer ${o.token}`;
    if (o.chunkedBytes !== undefined) headers["content-type"] = "application/json";
    const req = request({ host: url.hostname, port: url.port, method, path, headers, ...(o.localAddress ? { localAddress: o.localAddress } : {}) }, (res) => {
      let text = "";
      res.on("data", (c: Buffer) => (text += c.toString()));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, text }));
    });
    req.on("error", reject);
    if (o.chunkedBytes === undefined) {
      req.end();
      return;
    }
    const piece = Buffer.alloc(64 * 1024, "a");
    let left = o.chunkedBytes;
    const pump = () => {
      while (left > 0) {
        left -= piece.length;
        if (!req.write(piece)) {
          req.once("drain", pump);
          return;
        }
      }
      req.end();
    };
    pump();
  });
}

/** Writes `bytes` on a raw connection and collects what comes back until the server closes it. */
function raw(port: number, bytes: string, localAddress = "127.0.0.1", giveUpMs = 20_000): Promise<{ text: string; closedByServer: boolean }> {
  return new Promise((resolve) => {
    const s = connect({ port, host: "127.0.0.1", localAddress });
    let text = "";
    const t = setTimeout(() => {
      s.destroy();
      resolve({ text, closedByServer: false });
    }, giveUpMs);
    s.on("connect", () => {
      if (bytes !== "") s.write(bytes);
    });
    s.on("data", (d: Buffer) => (text += d.toString("latin1")));
    s.on("error", () => undefined);
    s.on("close", () => {
      clearTimeout(t);
      resolve({ text, closedByServer: true });
    });
  });
}

const STALLED_BODY = "POST /v1/hosts/challenge HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\n{";

describe("the coordinator: deadlines, caps and the unauthenticated rate", () => {
  let c: TestCoordinator;
  let token = "";
  let port = 0;
  before(async () => {
    c = await startTestCoordinator({
      reconcile: false,
      httpLimits: { headerTimeoutMs: 1000, requestTimeoutMs: 1000, maxConnectionsPerAddress: 4, unauthenticatedRate: 1, unauthenticatedBurst: 3 },
    });
    token = (await c.token("admin")).token;
    port = c.coord.port;
  });
  after(async () => c?.close());

  it("a chunked body of 10 MB gets 413 body_too_large, with and without a token", { timeout: 60_000 }, async () => {
    const open = await send(c.coord.url, "POST", "/v1/hosts/challenge", { chunkedBytes: 10 * 1024 * 1024, localAddress: "127.0.6.1" });
    assert.equal(open.status, 413);
    assert.match(open.text, /"code":"body_too_large"/);
    const withToken = await send(c.coord.url, "POST", "/v1/pools/ci/ensure", { token, chunkedBytes: 10 * 1024 * 1024, localAddress: "127.0.6.2" });
    assert.equal(withToken.status, 413);
  });

  it("a request stalled mid-body is answered 408 request_timeout and closed", { timeout: 30_000 }, async () => {
    const r = await raw(port, STALLED_BODY, "127.0.6.3");
    assert.ok(r.closedByServer, "the coordinator closed the connection");
    assert.match(r.text, /^HTTP\/1\.1 408 /);
    assert.match(r.text, /"code":"request_timeout"/);
    const silent = await raw(port, "", "127.0.6.4");
    assert.ok(silent.closedByServer);
    assert.match(silent.text, /^HTTP\/1\.1 408 /);
  });

  it("a fifth connection from one address is answered 503 too_many_connections; another address is served", { timeout: 30_000 }, async () => {
    const held = Array.from({ length: 4 }, () => connect({ port, host: "127.0.0.1", localAddress: "127.0.6.5" }));
    await Promise.all(held.map((s) => new Promise((r) => s.once("connect", r))));
    // The kernel completes a connection before the server accepts it: give the server a moment to count the four.
    await new Promise((r) => setTimeout(r, 200));
    const fifth = await raw(port, "", "127.0.6.5", 5_000);
    assert.match(fifth.text, /^HTTP\/1\.1 503 /);
    assert.match(fifth.text, /"code":"too_many_connections"/);
    for (const s of held) s.destroy();
    const other = await send(c.coord.url, "GET", "/v1/health", { localAddress: "127.0.6.6" });
    assert.equal(other.status, 200);
  });

  it("routes without a token are limited per address (429 rate_limited, retry-after); health and routes with a token are not", { timeout: 30_000 }, async () => {
    const answers: Answer[] = [];
    for (let i = 0; i < 12; i++) answers.push(await send(c.coord.url, "POST", "/v1/hosts/challenge", { localAddress: "127.0.6.7" }));
    const limited = answers.filter((a) => a.status === 429);
    assert.ok(limited.length > 0, `12 challenges at a rate of 1/s with a burst of 3: ${answers.map((a) => a.status).join(",")}`);
    assert.match(limited[0]!.text, /"code":"rate_limited"/);
    assert.match(String(limited[0]!.headers["retry-after"]), /^\d+$/);
    // Another address has its own allowance.
    assert.equal((await send(c.coord.url, "POST", "/v1/hosts/challenge", { localAddress: "127.0.6.8" })).status, 200);
    for (let i = 0; i < 12; i++) {
      assert.equal((await send(c.coord.url, "GET", "/v1/health", { localAddress: "127.0.6.7" })).status, 200);
      assert.equal((await send(c.coord.url, "GET", "/v1/pools", { token, localAddress: "127.0.6.7" })).status, 200);
    }
    const metrics = await send(c.coord.url, "GET", "/metrics", { localAddress: "127.0.6.9" });
    assert.match(metrics.text, /^berth_http_refusals_total\{reason="rate"\} [1-9]/m);
  });
});

describe("the request deadline is for receiving the request only", () => {
  it("a handler that runs three times the request deadline still answers", { timeout: 30_000 }, async () => {
    const app = createHttpServer({ log: { error: () => undefined }, internalMessage: "internal", limits: { headerTimeoutMs: 300, requestTimeoutMs: 300 } });
    app.post("/slow", { unlimited: true }, async () => {
      await new Promise((r) => setTimeout(r, 900));
      return { done: true };
    });
    const { url } = await app.listen("127.0.0.1", 0);
    try {
      const r = await send(url, "POST", "/slow");
      assert.equal(r.status, 200);
      assert.equal(r.text, '{"done":true}');
    } finally {
      await app.close();
    }
  });
});

describe("the agent: its API and its SSH gateway", () => {
  const dir = mkdtempSync(join(tmpdir(), "berth-admission-"));
  const hostCall = newToken("host-call", (n) => randomBytes(n));
  let agent: RunningAgent;
  before(async () => {
    agent = await startAgent({
      stateDir: dir,
      runtime: "process",
      hostCallToken: hostCall,
      name: "admission",
      slots: 1,
      httpLimits: { headerTimeoutMs: 1000, requestTimeoutMs: 1000, maxConnectionsPerAddress: 2 },
      sshAdmission: { authTimeoutMs: 1000, maxUnauthenticatedPerAddress: 2 },
    });
  });
  after(async () => {
    await agent?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it("the API answers a stalled request 408 and closes it, and refuses a third connection from one address with 503", { timeout: 30_000 }, async () => {
    const port = Number(new URL(agent.url).port);
    const stalled = await raw(port, `POST /v1/agent/ops HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${hostCall}\r\nContent-Length: 10\r\n\r\n{`, "127.0.7.1");
    assert.ok(stalled.closedByServer);
    assert.match(stalled.text, /^HTTP\/1\.1 408 /);
    const held = Array.from({ length: 2 }, () => connect({ port, host: "127.0.0.1", localAddress: "127.0.7.2" }));
    await Promise.all(held.map((s) => new Promise((r) => s.once("connect", r))));
    await new Promise((r) => setTimeout(r, 200));
    const third = await raw(port, "", "127.0.7.2", 5_000);
    assert.match(third.text, /^HTTP\/1\.1 503 .*"code":"too_many_connections"/s);
    for (const s of held) s.destroy();
  });

  it("the gateway destroys a connection that never authenticates, silent or not, and refuses a third unauthenticated one from one address", { timeout: 30_000 }, async () => {
    const port = agent.ssh.port;
    const silent = await raw(port, "", "127.0.7.3");
    assert.ok(silent.closedByServer, "a connection that sends nothing is closed");
    const talking = await raw(port, "SSH-2.0-OpenSSH_9.2\r\n", "127.0.7.4");
    assert.ok(talking.closedByServer, "a connection that stops after its version line is closed");
    assert.match(talking.text, /^SSH-2\.0-berth/);

    const held = Array.from({ length: 2 }, () => connect({ port, host: "127.0.0.1", localAddress: "127.0.7.5" }));
    await Promise.all(held.map((s) => new Promise((r) => s.once("connect", r))));
    await new Promise((r) => setTimeout(r, 200));
    const third = await raw(port, "", "127.0.7.5", 5_000);
    assert.match(third.text, /^berth: too many unauthenticated SSH connections from this address \(limit 2\)/);
    // Another address still gets the server's version line.
    const other = await raw(port, "", "127.0.7.6", 5_000);
    assert.match(other.text, /^SSH-2\.0-berth/);
    for (const s of held) s.destroy();
  });
});
