/**
 * The pool switch `--forwarding off` end to end: real `berth serve` and
 * `berth agent` (process runtime) driven by the real CLI. `berth pool ensure
 * --forwarding off` reaches the agent with the provision (the machine's runtime
 * record carries it; the gateway refuses its forwards, test/agent/files-gateway),
 * `pool show` says so, and turning it on again rotates the ready machine (never
 * changed live) for one made with forwards allowed.
 */
import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { Cluster, berth } from "../helpers/cluster.js";

interface PoolShow {
  forwarding: string;
  files: string;
  counts: { ready: number };
  networks: Array<{ id: string; state: string }>;
}

describe("pool --forwarding", { timeout: 180_000 }, () => {
  const c = new Cluster({ runtime: "process", minReady: 1, maxReady: 2, slots: 3 });
  before(() => c.start());
  after(() => c.close());

  /** The agent's runtime record of a machine. */
  const record = (id: string): { forwarding?: string; files?: string } => JSON.parse(readFileSync(join(c.agentDir, "machines", id, "machine.json"), "utf8")) as { forwarding?: string; files?: string };
  const ready = async (): Promise<string | null> => {
    const p = await c.api.call<PoolShow>("GET", "/v1/pools/fwd");
    return p.networks.find((m) => m.state === "ready")?.id ?? null;
  };

  test("off reaches the machine's record; on again rotates the ready machine", async () => {
    const cfg = ["--config", c.clientConfig];
    const ensure = (mode: string, ...more: string[]) => berth(["pool", "ensure", "fwd", "--min-ready", "1", "--max-ready", "2", "--compatibility-key", "e2e", "--forwarding", mode, ...more, ...cfg]);
    let r = await berth(["pool", "ensure", "fwd", "--min-ready", "1", "--max-ready", "2", "--compatibility-key", "e2e", "--forwarding", "sideways", ...cfg]);
    assert.notEqual(r.status, 0, "an unknown mode is refused");
    assert.match(r.stderr, /sideways/);
    r = await ensure("off", "--files", "nowhere");
    assert.notEqual(r.status, 0, "an unknown files scope is refused");
    assert.match(r.stderr, /nowhere/);
    r = await ensure("off", "--files", "workspace");
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /forwarding off, files workspace/);
    const first = await c.waitFor("a ready machine", ready, 60_000);
    assert.ok(existsSync(join(c.agentDir, "machines", first, "machine.json")), "the process runtime keeps its record under the agent's state dir");
    assert.equal(record(first).forwarding, "off");
    assert.equal(record(first).files, "workspace", "the files scope reaches the machine's record (the gateway confines its SFTP: test/agent/files-confine)");
    r = await berth(["pool", "show", "fwd", ...cfg]);
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /forwarding\s+off/);
    assert.match(r.stdout, /files\s+workspace/);

    r = await ensure("on");
    assert.equal(r.status, 0, r.stderr);
    const second = await c.waitFor("a ready machine made with forwards allowed", async () => {
      const id = await ready();
      return id !== null && id !== first ? id : null;
    }, 60_000);
    assert.equal(record(second).forwarding, undefined);
    assert.equal(record(second).files, undefined);
    const p = await c.api.call<PoolShow>("GET", "/v1/pools/fwd");
    assert.equal(p.forwarding, "on");
    assert.equal(p.files, "machine");
    assert.equal((p as unknown as { files: string }).files, "machine");
    assert.equal(p.networks.find((m) => m.id === first && m.state === "ready"), undefined, "the machine made with forwarding off is no longer lent out");
  });
});
