/**
 * A host's memory on the wire is `capacity.memoryMib` (the value is MiB).
 * `memoryMb`, its older name, is accepted from agents of the previous
 * release until the next one (docs/agent.md); naming both is refused whole.
 * The hosts view answers both names meanwhile. A running coordinator, real
 * HTTP, the enroll token as an agent presents it.
 */
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { request } from "undici";
import { startTestCoordinator, type TestCoordinator } from "../helpers/env.js";
import { dumpAll } from "../helpers/serve.js";

const body = (name: string, capacity: Record<string, number>) => ({
  name,
  url: "http://127.0.0.1:7421",
  runtime: "process",
  capacity,
  ssh: { host: "127.0.0.1", port: 2222, hostKey: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHostKeyHostKeyHostKeyHostKeyHostKey", fingerprint: "SHA256:x" },
});

describe("capacity.memoryMib and its older name memoryMb (a running coordinator)", () => {
  let t: TestCoordinator;
  let enroll: string;
  before(async () => {
    t = await startTestCoordinator({ reconcile: false });
    enroll = (await t.token("agent")).token;
  });
  after(() => t.close());

  const post = async (b: unknown) => {
    const r = await request(`${t.coord.url}/v1/hosts/enroll`, { method: "POST", headers: { "content-type": "application/json", authorization: `Bearer ${enroll}` }, body: JSON.stringify(b) });
    return { status: r.statusCode, body: (await r.body.json()) as { error?: { code: string; message: string } } };
  };
  const capacityOf = async (name: string) => {
    const hosts = await (await t.api("admin")).send("GET /v1/hosts", {});
    return hosts.hosts.find((h) => h.name === name)?.capacity;
  };

  it("an agent of this release names memoryMib; one of the previous release memoryMb: both are recorded in MiB, and shown under both names (an agent that offers no disk: diskMib null)", async () => {
    assert.equal((await post(body("new-agent", { vcpu: 2, memoryMib: 3072, slots: 2 }))).status, 200);
    assert.equal((await post(body("old-agent", { vcpu: 2, memoryMb: 5120, slots: 2 }))).status, 200);
    assert.deepEqual(await capacityOf("new-agent"), { vcpu: 2, memoryMib: 3072, memoryMb: 3072, diskMib: null, slots: 2 });
    assert.deepEqual(await capacityOf("old-agent"), { vcpu: 2, memoryMib: 5120, memoryMb: 5120, diskMib: null, slots: 2 });
    const accounts = await (await t.api("admin")).send("GET /v1/host-accounts", {});
    assert.deepEqual(accounts.hosts.map((h) => [h.name, h.capacity.memoryMib]).sort(), [["new-agent", 3072], ["old-agent", 5120]]);
  });

  it("both names, or neither, is invalid_request naming memoryMib; nothing is written", async () => {
    const before = await dumpAll(t.store);
    const twice: Array<Record<string, number>> = [{ vcpu: 2, memoryMib: 3072, memoryMb: 3072, slots: 2 }, { vcpu: 2, slots: 2 }];
    for (const capacity of twice) {
      const r = await post(body("twice", capacity));
      assert.equal(r.status, 400, JSON.stringify(r.body));
      assert.equal(r.body.error?.code, "invalid_request");
      assert.match(r.body.error?.message ?? "", /memoryMib/);
    }
    assert.deepEqual(await dumpAll(t.store), before);
  });
});
