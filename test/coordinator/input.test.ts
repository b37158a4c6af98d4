/**
 * Bad input over real HTTP: ids that are not one segment of
 * `[A-Za-z0-9_-]{1,128}` (in paths and in body id fields), oversized bodies
 * (declared and chunked), unknown fields, wrong types and malformed JSON.
 * Each is refused with a 4xx and a `{"error":{"code","message"}}` body, never a
 * 5xx, and a dump of every table is unchanged afterwards.
 */
import { test, describe, before as beforeAll, after as afterAll } from "node:test";
import assert from "node:assert/strict";
import { request } from "node:http";
import { startTestCoordinator, type TestCoordinator } from "../helpers/env.js";
import { dumpAll } from "../helpers/serve.js";
import { DEFAULT_BODY_LIMIT as MAX_BODY_BYTES } from "../../src/http/server.js";

interface Answer {
  status: number;
  body: unknown;
}

/** One request with the path sent byte for byte as given (no client-side normalisation). */
function send(base: string, method: string, path: string, token: string, body?: string | Buffer, opts: { chunked?: boolean } = {}): Promise<Answer> {
  const url = new URL(base);
  return new Promise((resolve, reject) => {
    const headers: Record<string, string> = { authorization: `Bearer ${token}`, connection: "close" };
    if (body !== undefined) {
      headers["content-type"] = "application/json";
      if (!opts.chunked) headers["content-length"] = String(Buffer.byteLength(body));
    }
    const req = request({ host: url.hostname, port: url.port, method, path, headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => {
        const text = Buffer.concat(chunks).toString("utf8");
        let parsed: unknown = text;
        try {
          parsed = JSON.parse(text);
        } catch {
          // left as text; the shape assertion reports it
        }
        resolve({ status: res.statusCode ?? 0, body: parsed });
      });
    });
    req.on("error", reject);
    if (body === undefined) req.end();
    else if (opts.chunked) {
      // Several writes without a content-length: the server only learns the size as it reads.
      const buf = Buffer.from(body);
      const step = 16 * 1024;
      let i = 0;
      const pump = (): void => {
        while (i < buf.length) {
          const more = req.write(buf.subarray(i, (i += step)));
          if (!more) {
            req.once("drain", pump);
            return;
          }
        }
        req.end();
      };
      pump();
    } else req.end(body);
  });
}

function assertError(a: Answer, status: number, code: string, mentions?: string): void {
  assert.equal(a.status, status, JSON.stringify(a.body));
  const body = a.body as { error?: { code?: unknown; message?: unknown } };
  assert.deepEqual(Object.keys(body), ["error"]);
  assert.deepEqual(Object.keys(body.error!).sort(), ["code", "message"]);
  assert.equal(body.error!.code, code);
  assert.equal(typeof body.error!.message, "string");
  if (mentions) assert.ok(String(body.error!.message).includes(mentions), `message ${JSON.stringify(body.error!.message)} names ${mentions}`);
}

const BAD_IDS: Array<[string, string]> = [
  ["a/b", "a/b"],
  ["a?b", "a%3Fb"],
  ["/ (encoded)", "%2F"],
  ["a b", "a%20b"],
  ["é", "%C3%A9"],
  ["empty", ""],
  ["129 characters", "x".repeat(129)],
  ["broken percent-encoding", "%ZZ"],
];

const ENSURE = { minReady: 1, maxReady: 2, compatibilityKey: "linux-x64" };
const ENROLL = {
  name: "host-1",
  url: "http://127.0.0.1:7421",
  runtime: "process",
  capacity: { vcpu: 2, memoryMb: 2048, slots: 4 },
  ssh: { host: "127.0.0.1", port: 2222, hostKey: "ssh-ed25519 AAAA", fingerprint: "SHA256:x" },
};

describe("bad input is refused whole, with nothing written", () => {
  let t: TestCoordinator;
  let admin: string;
  let before: Record<string, string[]>;

  async function unchanged(): Promise<void> {
    assert.deepEqual(await dumpAll(t.store), before);
  }

  // A pool with a ready machine and a live borrow, so every table has rows to compare.
  beforeAll(async () => {
    t = await startTestCoordinator({ reconcile: false });
    admin = (await t.token("admin")).token;
    const api = await t.api("admin");
    const e = await api.call<{ claims: Array<{ token: string }> }>("POST", "/v1/pools/ci/ensure", ENSURE);
    await api.call("POST", "/v1/pools/ci/machines", { claimToken: e.claims[0]!.token, resourceId: "vm-1", ssh: { host: "10.0.0.1", port: 22 } });
    await api.call("POST", "/v1/pools/ci/borrow", {});
    before = await dumpAll(t.store);
  });

  for (const [label, raw] of BAD_IDS) {
    test(`id ${label} in a path is 400 invalid_id on every route`, async () => {
      const routes: Array<[string, string, unknown]> = [
        ["GET", `/v1/pools/${raw}`, undefined],
        ["POST", `/v1/pools/${raw}/ensure`, ENSURE],
        ["POST", `/v1/pools/${raw}/borrow`, {}],
        ["POST", `/v1/pools/${raw}/drain`, {}],
        ["GET", `/v1/borrows/${raw}`, undefined],
        ["POST", `/v1/borrows/${raw}/heartbeat`, { token: "bbt_x" }],
        ["POST", `/v1/borrows/${raw}/return`, { token: "bbt_x" }],
        ["POST", `/v1/machines/${raw}/destroyed`, {}],
      ];
      for (const [method, path, body] of routes) {
        const a = await send(t.coord.url, method, path, admin, body === undefined ? undefined : JSON.stringify(body));
        assertError(a, 400, "invalid_id");
      }
      await unchanged();
    });

    test(`id ${label} in a body id field is 400 invalid_id naming the field`, async () => {
      const value = decodeURIComponent(raw.replace("%ZZ", "%25ZZ"));
      const a = await send(t.coord.url, "POST", "/v1/hosts/enroll", admin, JSON.stringify({ ...ENROLL, name: value }));
      assertError(a, 400, "invalid_id", "name");
      await unchanged();
    });
  }

  test("a body over the limit is 413 body_too_large, whether its length is declared or chunked", async () => {
    const big = JSON.stringify({ ...ENSURE, compatibilityKey: "k".repeat(MAX_BODY_BYTES + 1) });
    assertError(await send(t.coord.url, "POST", "/v1/pools/ci/ensure", admin, big), 413, "body_too_large");
    assertError(await send(t.coord.url, "POST", "/v1/pools/ci/ensure", admin, big, { chunked: true }), 413, "body_too_large");
    // Just under the limit is read (and then refused for what it says, not for its size).
    const fits = JSON.stringify({ ...ENSURE, compatibilityKey: "k".repeat(MAX_BODY_BYTES - 100) });
    assertError(await send(t.coord.url, "POST", "/v1/pools/ci/ensure", admin, fits, { chunked: true }), 400, "invalid_request", "compatibilityKey");
    await unchanged();
    // The coordinator still answers normally afterwards.
    assert.equal((await send(t.coord.url, "GET", "/v1/pools/ci", admin)).status, 200);
  });

  test("unknown fields and wrong types are 400 invalid_request naming the field", async () => {
    const cases: Array<[string, string, unknown, string]> = [
      ["POST", "/v1/pools/ci/ensure", { ...ENSURE, colour: "blue" }, "colour"],
      ["POST", "/v1/pools/ci/ensure", { ...ENSURE, minReady: "1" }, "minReady"],
      ["POST", "/v1/pools/ci/ensure", { ...ENSURE, maxReady: 1.5 }, "maxReady"],
      ["POST", "/v1/pools/ci/ensure", { ...ENSURE, maxReady: 1001 }, "maxReady"],
      ["POST", "/v1/pools/ci/ensure", { minReady: 1, maxReady: 2 }, "compatibilityKey"],
      ["POST", "/v1/pools/ci/ensure", { ...ENSURE, identity: { imageId: "img", tag: "x" } }, "tag"],
      ["POST", "/v1/pools/ci/machines", { claimToken: "bct_x", resourceId: "vm-9", ssh: { host: "h", port: "22" } }, "ssh.port"],
      ["POST", "/v1/pools/ci/borrow", { access: "shared" }, "access"],
      ["POST", "/v1/borrows/b_1/return", { token: "bbt_x", disposition: "keep" }, "disposition"],
      ["POST", "/v1/borrows/b_1/heartbeat", { token: 42 }, "token"],
      ["POST", "/v1/hosts/enroll", { ...ENROLL, capacity: { ...ENROLL.capacity, slots: -1 } }, "capacity.slots"],
      ["POST", "/v1/pools/ci/ensure", [ENSURE], "body"],
    ];
    for (const [method, path, body, field] of cases) {
      assertError(await send(t.coord.url, method, path, admin, JSON.stringify(body)), 400, "invalid_request", field);
    }
    await unchanged();
  });

  test("malformed JSON is 400 invalid_request", async () => {
    for (const body of ["{", "{\"minReady\": 1,}", "nul", "\u0000", "{\"a\":1}{\"b\":2}"]) {
      assertError(await send(t.coord.url, "POST", "/v1/pools/ci/ensure", admin, body), 400, "invalid_request");
    }
    await unchanged();
  });

  afterAll(async () => {
    await t.close();
  });
});
