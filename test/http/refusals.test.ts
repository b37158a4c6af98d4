/**
 * One suite, run against both servers (a real coordinator on SQLite and a
 * real agent, each on a loopback socket): every HTTP refusal has the same
 * shape (`{"error":{"code","message"}}`, nothing else), the same status rules
 * and the same headers (JSON content-type, `cache-control: no-store`, `Allow`
 * on 405), and no presented token is ever echoed. Requests are sent byte for
 * byte with node:http so nothing is normalised on the way.
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
import { DEFAULT_BODY_LIMIT } from "../../src/http/server.js";
import { startTestCoordinator, type TestCoordinator } from "../helpers/env.js";

interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  text: string;
  json: unknown;
}

function send(base: string, method: string, path: string, o: { token?: string | null; body?: string; chunked?: boolean; contentType?: string | null } = {}): Promise<Answer> {
  const url = new URL(base);
  return new Promise((resolve, reject) => {
    const headers: Record<string, string> = { connection: "close" };
    if (o.token) headers.authorization = `Bearer ${o.token}`;
    if (o.body !== undefined) {
      if (o.contentType !== null) headers["content-type"] = o.contentType ?? "application/json";
      if (!o.chunked) headers["content-length"] = String(Buffer.byteLength(o.body));
    }
    const req = request({ host: url.hostname, port: url.port, method, path, headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => {
        const text = Buffer.concat(chunks).toString("utf8");
        let json: unknown = undefined;
        try {
          json = JSON.parse(text);
        } catch {
          /* asserted by the caller */
        }
        resolve({ status: res.statusCode ?? 0, headers: res.headers, text, json });
      });
    });
    req.on("error", reject);
    if (o.body === undefined) req.end();
    else if (o.chunked) {
      const buf = Buffer.from(o.body);
      let i = 0;
      const pump = (): void => {
        while (i < buf.length) {
          if (!req.write(buf.subarray(i, (i += 16 * 1024)))) {
            req.once("drain", pump);
            return;
          }
        }
        req.end();
      };
      pump();
    } else req.end(o.body);
  });
}

/** The one refusal shape and its headers. */
function refused(a: Answer, status: number, code: string, mentions?: string): void {
  assert.equal(a.status, status, a.text);
  assert.deepEqual(Object.keys(a.json as object), ["error"], a.text);
  const e = (a.json as { error: Record<string, unknown> }).error;
  assert.deepEqual(Object.keys(e).sort(), ["code", "message"]);
  assert.equal(e.code, code);
  assert.equal(typeof e.message, "string");
  assert.ok((e.message as string).startsWith(`${code}: `), `message ${JSON.stringify(e.message)} starts with its code`);
  if (mentions !== undefined) assert.ok((e.message as string).includes(mentions), `message ${JSON.stringify(e.message)} names ${mentions}`);
  jsonHeaders(a);
}

function jsonHeaders(a: Answer): void {
  assert.equal(a.headers["content-type"], "application/json; charset=utf-8");
  assert.equal(a.headers["cache-control"], "no-store");
  assert.equal(a.headers["content-length"], String(Buffer.byteLength(a.text)));
}

/** What the suite needs to know of a server: a URL, a valid token, and one route of each kind. */
interface Target {
  url: string;
  token: string;
  /** A GET-only route that needs auth and answers 200 with a valid token. */
  get: string;
  /** A POST route with a JSON body schema, a body it accepts, and a field it does not know. */
  post: string;
  body: Record<string, unknown>;
  /** A GET route with one id param; `{id}` is replaced. */
  withId: string;
}

const dirs: string[] = [];
let coordinator: TestCoordinator;
let agent: RunningAgent;
const targets: Record<string, () => Target> = {};

before(async () => {
  coordinator = await startTestCoordinator({ reconcile: false });
  const admin = (await coordinator.token("admin")).token;
  targets.coordinator = () => ({
    url: coordinator.coord.url,
    token: admin,
    get: "/v1/pools",
    post: "/v1/pools/p1/ensure",
    body: { minReady: 0, maxReady: 1, compatibilityKey: "k" },
    withId: "/v1/pools/{id}",
  });
  const dir = mkdtempSync(join(tmpdir(), "berth-refusals-"));
  dirs.push(dir);
  const hostCall = newToken("host-call", randomBytes);
  agent = await startAgent({ stateDir: dir, runtime: "process", hostCallToken: hostCall, name: "refusals", slots: 1 });
  targets.agent = () => ({
    url: agent.url,
    token: hostCall,
    get: "/v1/agent/health",
    post: "/v1/agent/ops",
    body: { opId: "op_r1", kind: "provision", machineId: "m_r1", generation: 0 },
    withId: "/v1/agent/machines/{id}",
  });
});

after(async () => {
  await agent?.stop();
  await coordinator?.close();
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

for (const server of ["coordinator", "agent"]) {
  describe(`HTTP refusals of the ${server}`, () => {
    const t = (): Target => targets[server]!();

    it("answers an accepted request with the same headers as a refusal", async () => {
      const a = await send(t().url, "GET", t().get, { token: t().token });
      assert.equal(a.status, 200, a.text);
      jsonHeaders(a);
    });

    it("refuses an unknown route with 404 not_found, with or without a token", async () => {
      for (const token of [t().token, null]) {
        refused(await send(t().url, "GET", "/v1/nothing/here", { token }), 404, "not_found", "/v1/nothing/here");
        refused(await send(t().url, "POST", "/nothing", { token, body: "{}" }), 404, "not_found");
      }
    });

    it("refuses a wrong method with 405 method_not_allowed and an Allow header naming the right one", async () => {
      for (const method of ["DELETE", "PUT", "HEAD", "OPTIONS"]) {
        const a = await send(t().url, method, t().get, { token: t().token });
        assert.equal(a.status, 405, `${method}: ${a.text}`);
        assert.equal(a.headers.allow, "GET", method);
        if (method !== "HEAD") refused(a, 405, "method_not_allowed", "GET");
      }
      const a = await send(t().url, "GET", t().post, { token: t().token });
      refused(a, 405, "method_not_allowed", "POST");
      assert.equal(a.headers.allow, "POST");
    });

    it("refuses a missing, malformed or wrong token with 401 unauthorized and never echoes it", async () => {
      const wrong = [newToken("host-call", randomBytes), newToken("api", randomBytes), "garbage", "x".repeat(600)];
      for (const token of [null, ...wrong]) {
        for (const [method, path, body] of [["GET", t().get, undefined], ["POST", t().post, JSON.stringify(t().body)]] as const) {
          const a = await send(t().url, method, path, { token, body });
          refused(a, 401, "unauthorized");
          if (token) assert.equal(a.text.includes(token), false, "the presented token is not in the answer");
          assert.equal(JSON.stringify(a.headers).includes(token ?? "\u0000"), false, "nor in its headers");
        }
      }
    });

    it("checks the token before reading the body: an oversized body without one is 401", async () => {
      const big = JSON.stringify({ pad: "x".repeat(DEFAULT_BODY_LIMIT + 1) });
      refused(await send(t().url, "POST", t().post, { token: null, body: big }), 401, "unauthorized");
    });

    it("refuses a bad id in a path with 400 invalid_id, however it is spelt", async () => {
      for (const raw of ["bad.id", "a%2Fb", "a/b", "a%20b", "%C3%A9", "%ZZ", "x".repeat(129), ""]) {
        const path = t().withId.replace("{id}", raw);
        refused(await send(t().url, "GET", path, { token: t().token }), 400, "invalid_id", "is not a valid id");
      }
    });

    it("refuses a body that is not JSON with 400 invalid_request, whatever its content-type says", async () => {
      for (const body of ["{", "{\"a\":1,}", "nul", "\u0000", "{\"a\":1}{\"b\":2}"]) {
        for (const contentType of ["application/json", "text/plain", null]) {
          refused(await send(t().url, "POST", t().post, { token: t().token, body, contentType }), 400, "invalid_request", "not valid JSON");
        }
      }
    });

    it("refuses an unknown or mistyped field with 400 invalid_request naming it", async () => {
      refused(await send(t().url, "POST", t().post, { token: t().token, body: JSON.stringify({ ...t().body, colour: "blue" }) }), 400, "invalid_request", "unknown field colour");
      const [field] = Object.keys(t().body);
      refused(await send(t().url, "POST", t().post, { token: t().token, body: JSON.stringify({ ...t().body, [field!]: [] }) }), 400, "invalid_request", `field ${field}`);
      refused(await send(t().url, "POST", t().post, { token: t().token, body: "[]" }), 400, "invalid_request", "body");
    });

    it("answers bytes that are not HTTP with 400 invalid_request in the same shape", async () => {
      const port = Number(new URL(t().url).port);
      const raw = await new Promise<string>((resolve) => {
        const s = connect(port, "127.0.0.1");
        const chunks: Buffer[] = [];
        s.on("data", (d: Buffer) => chunks.push(d));
        s.on("error", () => undefined);
        s.on("close", () => resolve(Buffer.concat(chunks).toString("utf8")));
        // A header line without a colon: refused by Node's parser before any route sees it.
        s.end(`POST ${t().post} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${t().token}\r\nnot a header\r\n\r\n`);
      });
      const [head, body] = raw.split("\r\n\r\n") as [string, string];
      assert.match(head, /^HTTP\/1\.1 400 /);
      assert.match(head, /content-type: application\/json; charset=utf-8/i);
      assert.match(head, /cache-control: no-store/i);
      assert.deepEqual(JSON.parse(body), { error: { code: "invalid_request", message: "invalid_request: the request is not valid HTTP/1.1" } });
      assert.equal(raw.includes(t().token), false);
    });

    it("refuses a body over the limit with 413 body_too_large, declared or chunked, and closes the connection", async () => {
      const big = JSON.stringify({ ...t().body, pad: "x".repeat(DEFAULT_BODY_LIMIT + 1) });
      for (const chunked of [false, true]) {
        const a = await send(t().url, "POST", t().post, { token: t().token, body: big, chunked });
        refused(a, 413, "body_too_large", String(DEFAULT_BODY_LIMIT));
        assert.equal(a.headers.connection, "close");
      }
      // The server answers normally afterwards.
      assert.equal((await send(t().url, "GET", t().get, { token: t().token })).status, 200);
    });
  });
}
