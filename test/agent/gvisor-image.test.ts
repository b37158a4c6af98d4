/**
 * A gvisor machine booted from an image (real runsc): commands and a PTY
 * login shell run as the image's User, in its WorkingDir, with its Env (the
 * request may add variables, never replace PATH); /workspace belongs to that
 * user; /run/berth/incarnation is there; a fence restarts from the same
 * image and throws away what was written outside /workspace; while a machine
 * uses the image the cache keeps it.
 */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { GvisorRuntime } from "../../src/agent/runtime/gvisor.js";
import { gvisorAvailability } from "../../src/agent/runtime/index.js";
import { ImageCache } from "../../src/agent/images/cache.js";
import { silentLog } from "../../src/agent/log.js";
import type { ExecHandle } from "../../src/agent/runtime/types.js";
import { buildImage, busyboxLayer, writeLayout } from "../helpers/oci-images.js";

const gv = gvisorAvailability();
const base = mkdtempSync(join(tmpdir(), "berth-gvimg-"));
after(() => rmSync(base, { recursive: true, force: true }));

async function output(h: ExecHandle): Promise<{ out: string; code: number | null }> {
  let out = "";
  h.stdout.on("data", (d: Buffer) => (out += d.toString()));
  h.stderr.on("data", (d: Buffer) => (out += d.toString()));
  h.stdin.end();
  const { code } = await h.exited;
  return { out, code };
}

test("a machine of an image runs as its User, in its WorkingDir, with its Env; a fence restarts it from the same image", { skip: gv.ok ? false : (gv as { why: string }).why, timeout: 120_000 }, async () => {
  const img = buildImage({ layers: [await busyboxLayer()], env: ["PATH=/bin:/usr/bin", "GREETING=hello from the image"], workingDir: "/srv/app", user: "app" });
  writeLayout(join(base, "layout"), img);
  const rt = new GvisorRuntime({ stateDir: join(base, "agent") });
  const cache = new ImageCache({ stateDir: join(base, "agent"), maxBytes: 1 << 30, inUse: () => rt.imagesInUse(), log: silentLog });
  const boot = await cache.ensure(`oci:${join(base, "layout")}`);
  try {
    const m = await rt.create("m_img", { image: boot });
    assert.equal(m.identity.imageId, boot.id);
    const r = await output(await rt.exec("m_img", { argv: ["sh", "-c", 'id -u; id -g; id -G; pwd; echo "$GREETING|$PATH|$EXTRA|$USER"; touch /workspace/mine && echo ws-ok; test -s /run/berth/incarnation && echo inc-ok; echo x > /tmp/scratch; echo y > /home/app/left'], env: { EXTRA: "from the request", PATH: "/evil" } }));
    assert.equal(r.code, 0, r.out);
    assert.deepEqual(r.out.trim().split("\n"), ["1000", "1000", "1000 50", "/srv/app", "hello from the image|/bin:/usr/bin|from the request|app", "ws-ok", "inc-ok"]);
    // A PTY login shell is the image's shell, as the image's user.
    const p = await rt.exec("m_img", { argv: null, env: {}, pty: { cols: 80, rows: 24, term: "xterm" } });
    let seen = "";
    p.stdout.on("data", (d: Buffer) => (seen += d.toString()));
    p.stdin.write("echo user=$(id -un) shell=$SHELL; exit\n");
    await p.exited;
    assert.match(seen, /user=app shell=\/bin\/sh/);
    assert.equal(cache.list()[0]!.machines, 1);
    assert.throws(() => cache.remove(boot.id!), /conflict/);

    const proof = await rt.fence("m_img");
    assert.notEqual(proof.incarnation, m.incarnation);
    const again = await output(await rt.exec("m_img", { argv: ["sh", "-c", "cat /etc/os-release | head -1; test -e /home/app/left && echo kept || echo gone; test -e /workspace/mine && echo ws-kept"], env: {} }));
    assert.deepEqual(again.out.trim().split("\n"), ['PRETTY_NAME="berth test image (busybox)"', "gone", "ws-kept"]);
  } finally {
    await rt.destroy("m_img");
  }
  assert.equal(cache.list()[0]!.machines, 0);
});
