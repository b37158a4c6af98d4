/**
 * Pools from images, end to end: `berth serve` + a real `berth agent` on
 * gvisor, a real registry (docker-registry on loopback) and an OCI layout
 * the test writes. A pool from each is ensured with `berth pool ensure
 * --image`, borrowed with `berth run` (SSH), and shows the image's own
 * /etc/os-release, tools (busybox, perl from the image), Env and
 * WorkingDir; what a borrower changed is gone after the return (scrubbed
 * back to the image). `berth image ls|rm` through the coordinator; an image
 * in use is not removed; changing a pool's image replaces its machines:
 * a lent one only after its return, one still being provisioned (its pull
 * held at a proxy while the image changes) is never lent.
 * Bad images: an unreachable registry and a layer climbing out of its root
 * are clear errors on `pool ensure --wait` / in `pool show`, and no machine
 * of them is ever ready. The process runtime refuses images at ensure.
 */
import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { createServer, type AddressInfo } from "node:net";
import { join } from "node:path";
import { berth, Cluster } from "../helpers/cluster.js";
import { gvisorAvailability } from "../../src/agent/runtime/index.js";
import { buildImage, busyboxLayer, perlLayer, tarOf, writeLayout } from "../helpers/oci-images.js";
import { registryAvailable, startBlobProxy, startRegistry, type TestRegistry } from "../helpers/registry.js";
import { connect, execStreaming } from "../../src/cli/ssh-client.js";
import type { SshConnection } from "../../src/client/ssh.js";
import { Writable } from "node:stream";

const gv = gvisorAvailability();
const skip = !gv.ok ? `gvisor runtime unavailable: ${(gv as { why: string }).why}` : (registryAvailable() ?? false);

let base: string;
let layers: Buffer[];
before(async () => {
  base = mkdtempSync(join(tmpdir(), "berth-e2e-images-"));
  layers = [await busyboxLayer(), await perlLayer()];
});
after(() => rmSync(base, { recursive: true, force: true }));

interface PoolShow {
  image: string | null;
  counts: { ready: number };
  states: Record<string, number>;
  provisionError: { state: string; error: string } | null;
  /** The pool's machines not yet destroyed. */
  networks: Array<{ id: string; state: string }>;
}

describe("pools from images on gvisor", { skip, timeout: 600_000 }, () => {
  let c: Cluster;
  let reg: TestRegistry;
  let layoutDir: string;
  /** The CLI with the cluster's client config (before `--`, where a command begins). */
  const cli = (args: string[]) => {
    const i = args.indexOf("--");
    return berth(i < 0 ? [...args, "--config", c.clientConfig] : [...args.slice(0, i), "--config", c.clientConfig, ...args.slice(i)]);
  };
  const show = async (pool: string) => c.api.call<PoolShow>("GET", `/v1/pools/${pool}`);

  before(async () => {
    reg = await startRegistry(join(base, "registry"));
    const fromRegistry = buildImage({ layers, env: ["PATH=/usr/bin:/bin", "GREETING=from the registry image"], workingDir: "/srv/app" });
    const regLayout = join(base, "reg-layout");
    writeLayout(regLayout, fromRegistry, "v1");
    await reg.push(regLayout, "v1", "team/base:1");
    const fromLayout = buildImage({ layers: [...layers, await tarOf([{ name: "etc/berth-source", content: "oci layout\n" }])], env: ["PATH=/usr/bin:/bin", "GREETING=from the layout image"] });
    layoutDir = join(base, "layout");
    writeLayout(layoutDir, fromLayout, "v1");
    c = await new Cluster({ runtime: "gvisor", slots: 8 }).start();
  });
  after(async () => {
    await c?.close();
    await reg?.close();
  });

  test("a pool from a registry image and one from an OCI layout: borrowed, used over SSH, returned and scrubbed back to the image", async () => {
    for (const [pool, image] of [["reg", `${reg.host}/team/base:1`], ["oci", `oci:${layoutDir}:v1`]] as const) {
      const r = await cli(["pool", "ensure", pool, "--min-ready", "1", "--max-ready", "1", "--compatibility-key", pool, "--image", image, "--wait", "--timeout", "3m"]);
      assert.equal(r.status, 0, r.stderr);
      assert.match(r.stdout, new RegExp(`image ${image.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&")}`));
    }
    const use = [
      "cat /etc/os-release | head -1",
      "cat /etc/berth-source 2>/dev/null || echo registry",
      "perl -e 'print 6*7, qq(\\n)'",
      "awk 'BEGIN { print 2+3 }'",
      'echo "$GREETING"',
      "pwd",
      "ls -l /bin/busybox >/dev/null && echo ls-ok",
      "echo dirty > /etc/dirty && echo scratch > /workspace/scratch && echo wrote",
    ].join("; ");
    const reg1 = await cli(["run", "--pool", "reg", "-q", "--", "sh", "-c", use]);
    assert.equal(reg1.status, 0, reg1.stderr);
    assert.deepEqual(reg1.stdout.trim().split("\n"), ['PRETTY_NAME="berth test image (busybox)"', "registry", "42", "5", "from the registry image", "/srv/app", "ls-ok", "wrote"]);
    const oci1 = await cli(["run", "--pool", "oci", "-q", "--", "sh", "-c", use]);
    assert.equal(oci1.status, 0, oci1.stderr);
    assert.deepEqual(oci1.stdout.trim().split("\n"), ['PRETTY_NAME="berth test image (busybox)"', "oci layout", "42", "5", "from the layout image", "/workspace", "ls-ok", "wrote"]);

    // Returned, fenced and scrubbed: the next borrower finds the image as it was.
    const check = "test ! -e /etc/dirty && test ! -e /workspace/scratch && echo clean";
    for (const pool of ["reg", "oci"]) {
      await c.waitFor(`pool ${pool} ready again`, async () => (await c.readyCount(pool)) >= 1, 60_000);
      const again = await cli(["run", "--pool", pool, "-q", "--", "sh", "-c", check]);
      assert.equal(again.status, 0, again.stderr);
      assert.equal(again.stdout, "clean\n");
    }
  });

  test("berth image ls|rm through the coordinator; an image in use stays; changing the pool's image replaces its machines", async () => {
    const ls = await cli(["image", "ls", "--json"]);
    assert.equal(ls.status, 0, ls.stderr);
    const hosts = JSON.parse(ls.stdout) as Array<{ host: string; images: Array<{ id: string; refs: string[]; machines: number }> }>;
    const images = hosts[0]!.images;
    const regImage = images.find((i) => i.refs.includes(`${reg.host}/team/base:1`))!;
    assert.ok(regImage, ls.stdout);
    assert.ok(images.some((i) => i.refs.includes(`oci:${layoutDir}:v1`)));
    assert.equal(regImage.machines, 1);
    const table = await cli(["image", "ls"]);
    assert.match(table.stdout, /HOST +IMAGE +REFERENCE +SIZE/);

    const inUse = await cli(["image", "rm", regImage.id.slice(0, 12)]);
    assert.equal(inUse.status, 1);
    assert.match(inUse.stderr, /conflict: image [a-f0-9]{12} is used by 1 machine\(s\) on this host/);

    // The pool's image changes: its ready machine is replaced by one of the new image.
    const r = await cli(["pool", "ensure", "reg", "--min-ready", "1", "--max-ready", "1", "--compatibility-key", "reg", "--image", `oci:${layoutDir}:v1`, "--wait", "--timeout", "3m"]);
    assert.equal(r.status, 0, r.stderr);
    await c.waitFor("the old image's machine destroyed", async () => {
      const p = await show("reg");
      return p.counts.ready === 1 && Object.entries(p.states).every(([s, n]) => s === "ready" || s === "destroyed" || n === 0);
    }, 120_000);
    const now = await cli(["run", "--pool", "reg", "-q", "--", "cat", "/etc/berth-source"]);
    assert.equal(now.stdout, "oci layout\n", now.stderr);
    const rm = await cli(["image", "rm", regImage.id]);
    assert.equal(rm.status, 0, rm.stderr);
    assert.match(rm.stdout, /e2e: removed image [a-f0-9]{12}/);
    const after = JSON.parse((await cli(["image", "ls", "--json"])).stdout) as typeof hosts;
    assert.equal(after[0]!.images.some((i) => i.id === regImage.id), false);
  });

  test("the image changed while a machine is lent and while one is still being made: the lent one keeps working until its return, then both are replaced; no borrower gets the old image", async () => {
    const source = "cat /etc/berth-source 2>/dev/null || echo registry";
    // Lent: the borrower keeps the machine of the old image for as long as the borrow lasts.
    const lent = await cli(["pool", "ensure", "lent", "--min-ready", "1", "--max-ready", "1", "--compatibility-key", "lent", "--image", `${reg.host}/team/base:1`, "--wait", "--timeout", "3m"]);
    assert.equal(lent.status, 0, lent.stderr);
    const b = await c.api.call<Borrowed>("POST", "/v1/pools/lent/borrow", {});
    const ssh = await connect({ host: b.machine.ssh.host ?? "127.0.0.1", port: b.machine.ssh.port ?? 22, user: b.machine.ssh.user ?? b.machine.id, hostKey: b.machine.ssh.hostKey ?? "", privateKey: c.keeper.privateKey });
    try {
      const changed = await cli(["pool", "ensure", "lent", "--min-ready", "1", "--max-ready", "1", "--compatibility-key", "lent", "--image", `oci:${layoutDir}:v1`]);
      assert.equal(changed.status, 0, changed.stderr);
      assert.equal((await execCollect(ssh, source)).trim(), "registry", "the lent machine is not changed under its borrower");
    } finally {
      ssh.end();
    }
    await c.api.call("POST", `/v1/borrows/${b.borrowId}/return`, { token: b.borrowToken });
    await c.waitFor("the returned machine of the old image destroyed and a new one ready", async () => {
      const p = await show("lent");
      return !p.networks.some((m) => m.id === b.machine.id) && p.counts.ready === 1;
    }, 180_000);
    const afterReturn = await cli(["run", "--pool", "lent", "-q", "--", "sh", "-c", source]);
    assert.equal(afterReturn.stdout, "oci layout\n", afterReturn.stderr);

    // Still being made: its pull is held at the registry while the pool's image changes.
    let release!: () => void;
    const released = new Promise<void>((r) => (release = r));
    let held = 0;
    const proxy = await startBlobProxy(reg.host, () => "none", async () => {
      held++;
      await released;
    });
    try {
      const first = await cli(["pool", "ensure", "race", "--min-ready", "1", "--max-ready", "1", "--compatibility-key", "race", "--image", `${proxy.host}/team/base:1`]);
      assert.equal(first.status, 0, first.stderr);
      await c.waitFor("the provision's pull held at the registry", async () => held > 0, 120_000);
      const second = await cli(["pool", "ensure", "race", "--min-ready", "1", "--max-ready", "1", "--compatibility-key", "race", "--image", `oci:${layoutDir}:v1`]);
      assert.equal(second.status, 0, second.stderr);
      release();
      await c.waitFor("a ready machine in pool race", async () => (await show("race")).counts.ready === 1, 180_000);
      const r = await cli(["run", "--pool", "race", "-q", "--", "sh", "-c", source]);
      assert.equal(r.stdout, "oci layout\n", `a machine made for the old image was lent: ${r.stdout}${r.stderr}`);
    } finally {
      release();
      await proxy.close();
    }
  });

  test("bad images: an unreachable registry and a layer climbing out of its root are clear errors; no machine of them is ever ready", async () => {
    const escape = buildImage({ layers: [layers[0]!, await tarOf([{ name: "../../etc/cron.d/berth-escape", content: "x" }])] });
    const escapeDir = join(base, "escape-layout");
    writeLayout(escapeDir, escape, "v1");
    const bad = await cli(["pool", "ensure", "escape", "--min-ready", "1", "--max-ready", "1", "--compatibility-key", "escape", "--image", `oci:${escapeDir}:v1`, "--wait", "--timeout", "2m"]);
    assert.notEqual(bad.status, 0);
    assert.match(bad.stderr, /provisioning failed: image_invalid: layer sha256:[a-f0-9]{64} of oci:.*: entry "\.\.\/\.\.\/etc\/cron\.d\/berth-escape" climbs out of the image root/);
    assert.equal(existsSync("/etc/cron.d/berth-escape"), false);

    // A registry nobody listens on: retried, and said in the pool's status.
    const port = await closedPort();
    const unreachable = await cli(["pool", "ensure", "gone", "--min-ready", "1", "--max-ready", "1", "--compatibility-key", "gone", "--image", `127.0.0.1:${port}/team/none:1`]);
    assert.equal(unreachable.status, 0, unreachable.stderr);
    const p = await c.waitFor("the pull failure in the pool's status", async () => {
      const s = await show("gone");
      return s.provisionError ? s : null;
    }, 60_000);
    assert.match(p.provisionError!.error, new RegExp(`^image_unavailable: registry 127\\.0\\.0\\.1:${port} could not be reached \\(ECONNREFUSED\\)`));
    const shown = await cli(["pool", "show", "gone"]);
    assert.match(shown.stdout, /provisioning +(retrying|FAILED) .*could not be reached/);
    for (const pool of ["escape", "gone"]) assert.equal((await show(pool)).counts.ready, 0);
    // Nothing half-unpacked is left in the agent's cache.
    assert.deepEqual(readdirSync(join(c.agentDir, "images")).filter((n) => n.startsWith(".")), []);
  });
});

describe("the process runtime and images", { timeout: 120_000 }, () => {
  test("a pool with an image is refused where every host runs the process runtime", async () => {
    const c = await new Cluster({ runtime: "process" }).start();
    try {
      const r = await berth(["pool", "ensure", "img", "--min-ready", "1", "--max-ready", "1", "--compatibility-key", "img", "--image", "dir:/srv/none", "--config", c.clientConfig]);
      assert.equal(r.status, 1);
      assert.match(r.stderr, /names an image, which only the gvisor runtime boots; every enrolled host of this organisation runs the process runtime/);
    } finally {
      await c.close();
    }
  });
});

interface Borrowed {
  borrowId: string;
  borrowToken: string;
  machine: { id: string; ssh: { host: string | null; port: number | null; user: string | null; hostKey: string | null } };
}

/** Runs `command` over an SSH connection; its stdout. */
async function execCollect(ssh: SshConnection, command: string): Promise<string> {
  let out = "";
  const stdout = new Writable({ write: (chunk: Buffer, _e, cb) => ((out += chunk.toString()), cb()) });
  const sink = new Writable({ write: (_c, _e, cb) => cb() });
  const r = await execStreaming(ssh, command, { stdout, stderr: sink });
  assert.equal(r.code, 0, `${command} exited ${r.code ?? r.signal}`);
  return out;
}

/** A loopback port nobody listens on (bound, then closed). */
async function closedPort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, "127.0.0.1", r));
  const port = (s.address() as AddressInfo).port;
  await new Promise((r) => s.close(r));
  return port;
}
