/**
 * SFTP into a gvisor machine booted from an image that has no sftp-server
 * (busybox only, pulled from a real registry): berth's own server (the host's
 * sftp-server with its loader and libraries, bound at /run/berth/sftp) serves
 * the real OpenSSH `sftp` and `scp` (SFTP mode) and the client library's
 * upload/download: files byte-exact (sha256) each way, trees with their modes,
 * written as the image's user, relative paths in the workspace. A revoked key
 * (what a return does) cuts an open transfer and the fence proves the server
 * gone. `--files workspace` on such an image never serves it unconfined.
 * `scp -O` and `rsync -e ssh` need scp / rsync inside the machine: the image
 * has neither, and the client says so.
 */
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { AgentHarness, until, type GatewayRig } from "../helpers/agent.js";
import { gatewaySshOpts, runClient, randomFile, sha256Of } from "../helpers/openssh.js";
import { buildImage, busyboxLayer, writeLayout } from "../helpers/oci-images.js";
import { registryAvailable, startRegistry, type TestRegistry } from "../helpers/registry.js";
import { gvisorAvailability } from "../../src/agent/runtime/index.js";
import { ImageCache } from "../../src/agent/images/cache.js";
import { silentLog } from "../../src/agent/log.js";
import type { BootImage } from "../../src/agent/runtime/types.js";
import { MachineFiles, openSftp } from "../../src/client/files.js";
import { SshConnection } from "../../src/client/ssh.js";
import { SFTP_SERVER_PATHS } from "../../src/agent/ssh/channels.js";
import { kitPartsFromLdd } from "../../src/agent/runtime/sftp-kit.js";

const MB = 1024 * 1024;
const gv = gvisorAvailability();
const skip = !gv.ok ? `gvisor runtime unavailable: ${(gv as { why: string }).why}` : registryAvailable();
const harness = new AgentHarness("berth-files-img-");
const base = mkdtempSync(join(tmpdir(), "berth-files-img-"));
let reg: TestRegistry | null = null;
let boot: BootImage;

before(async () => {
  if (skip) return;
  // busybox only: no sftp-server, no scp, no ldd, no unshare/mount/chroot.
  const img = buildImage({ layers: [await busyboxLayer()], env: ["PATH=/bin"], user: "app" });
  writeLayout(join(base, "layout"), img, "v1");
  reg = await startRegistry(join(base, "reg"));
  await reg.push(join(base, "layout"), "v1", "team/busybox:1");
  const cache = new ImageCache({ stateDir: join(base, "cache"), maxBytes: 1 << 30, inUse: () => new Map(), log: silentLog });
  boot = await cache.ensure(`${reg.host}/team/busybox:1`);
});
after(async () => {
  await harness.close();
  await reg?.close();
  rmSync(base, { recursive: true, force: true });
});


const workspace = (rig: GatewayRig) => join(rig.dir, "rt", "machines", rig.machine, "workspace");

function tree(root: string): string[] {
  mkdirSync(join(root, "sub", "deeper"), { recursive: true });
  writeFileSync(join(root, "run.sh"), "#!/bin/sh\necho hi\n");
  chmodSync(join(root, "run.sh"), 0o750);
  writeFileSync(join(root, "sub", "secret"), "s");
  chmodSync(join(root, "sub", "secret"), 0o600);
  writeFileSync(join(root, "sub", "deeper", "plain"), randomBytes(70_000));
  chmodSync(join(root, "sub", "deeper", "plain"), 0o644);
  chmodSync(join(root, "sub"), 0o711);
  return modes(root);
}

function modes(root: string): string[] {
  return ["run.sh", "sub", "sub/secret", "sub/deeper/plain"].map((p) => `${p} ${(statSync(join(root, p)).mode & 0o777).toString(8)}`);
}

test("an image without sftp-server: berth's own serves sftp, scp and the client library, byte-exact, trees with modes, as the image's user in the workspace", { skip: skip ?? false, timeout: 300_000 }, async (t) => {
  const rig = await harness.gateway("gvisor", "m_kit", { create: { image: boot } });
  const dir = harness.dir();
  const o = gatewaySshOpts(rig, dir);
  const port = String(rig.gw.port);
  const target = `${rig.machine}@127.0.0.1`;
  const ws = workspace(rig);

  // The image really has none of its own (and no scp): only berth's, read-only.
  let r = await runClient("ssh", [...o, "-p", port, target, `for p in ${SFTP_SERVER_PATHS.join(" ")} /bin/scp /usr/bin/scp; do test -e $p && echo has $p; done; ls /run/berth/sftp; touch /run/berth/sftp/x 2>/dev/null || echo read-only`]);
  assert.equal(r.status, 0, r.stderr);
  assert.doesNotMatch(r.stdout, /^has /m);
  assert.match(r.stdout, /^ld\.so$/m);
  assert.match(r.stdout, /^sftp-server$/m);
  assert.match(r.stdout, /^read-only$/m);

  const src = join(dir, "up.bin");
  const sum = randomFile(src, 8 * MB);
  // sftp: put, get back, pwd is the workspace.
  r = await runClient("sftp", [...o, "-P", port, "-b", "-", target], `pwd\nput ${src} up-sftp.bin\nget up-sftp.bin ${join(dir, "down-sftp.bin")}\n`);
  assert.equal(r.status, 0, `sftp: ${r.stderr}`);
  assert.match(r.stdout, /Remote working directory: \/workspace\b/);
  assert.equal(await sha256Of(join(ws, "up-sftp.bin")), sum);
  assert.equal(await sha256Of(join(dir, "down-sftp.bin")), sum);
  // Written by the image's user (app, uid 1000), not root.
  assert.equal(statSync(join(ws, "up-sftp.bin")).uid, 1000);

  // scp in its default (SFTP) mode, both ways.
  r = await runClient("scp", [...o, "-P", port, src, `${target}:up-scp.bin`]);
  assert.equal(r.status, 0, `scp up: ${r.stderr}`);
  assert.equal(await sha256Of(join(ws, "up-scp.bin")), sum);
  r = await runClient("scp", [...o, "-P", port, `${target}:up-scp.bin`, join(dir, "down-scp.bin")]);
  assert.equal(r.status, 0, `scp down: ${r.stderr}`);
  assert.equal(await sha256Of(join(dir, "down-scp.bin")), sum);

  // Trees with modes: scp -rp and sftp put -rp up; scp -rp back.
  const want = tree(join(dir, "tree"));
  r = await runClient("scp", [...o, "-r", "-p", "-P", port, join(dir, "tree"), `${target}:tree-scp`]);
  assert.equal(r.status, 0, `scp -rp: ${r.stderr}`);
  assert.deepEqual(modes(join(ws, "tree-scp")), want);
  r = await runClient("sftp", [...o, "-P", port, "-b", "-", target], `put -rp ${join(dir, "tree")} tree-sftp\n`);
  assert.equal(r.status, 0, `sftp put -rp: ${r.stderr}`);
  assert.deepEqual(modes(join(ws, "tree-sftp")), want);
  r = await runClient("scp", [...o, "-r", "-p", "-P", port, `${target}:tree-sftp`, join(dir, "tree-back")]);
  assert.equal(r.status, 0, `scp -rp down: ${r.stderr}`);
  assert.deepEqual(modes(join(dir, "tree-back")), want);
  assert.deepEqual(readFileSync(join(dir, "tree-back", "sub", "deeper", "plain")), readFileSync(join(dir, "tree", "sub", "deeper", "plain")));

  // The client library's upload/download (what BerthClient.uploadFile/downloadFile run on the borrow's connection).
  const files = new MachineFiles(await openSftp(new SshConnection(await rig.client())));
  try {
    await files.upload(src, "up-lib.bin");
    assert.equal(await sha256Of(join(ws, "up-lib.bin")), sum);
    await files.download("up-lib.bin", join(dir, "down-lib.bin"));
    assert.equal(await sha256Of(join(dir, "down-lib.bin")), sum);
    await files.upload(join(dir, "tree"), "tree-lib", { recursive: true });
    assert.deepEqual(modes(join(ws, "tree-lib")), want);
    await files.download("tree-lib", join(dir, "tree-lib-back"), { recursive: true });
    assert.deepEqual(modes(join(dir, "tree-lib-back")), want);
  } finally {
    files.close();
  }

  // scp -O (legacy) runs `scp -t` inside the machine: this image has no scp, and the client says so.
  r = await runClient("scp", [...o, "-O", "-P", port, src, `${target}:up-legacy.bin`]);
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /scp: not found/);
  t.diagnostic(`scp -O: ${r.stderr.trim()}`);
  // rsync -e ssh runs `rsync --server` inside the machine: the same.
  r = await runClient("rsync", ["-e", ["ssh", ...o, "-p", port].join(" "), src, `${target}:up-rsync.bin`]);
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /rsync: not found/);
  t.diagnostic(`rsync: ${r.stderr.trim()}`);
  await until(() => rig.gw.sessions.count(rig.machine) === 0, "every transfer's session ended");
  await rig.close();
});

test("an image without sftp-server: a revoked key (return) cuts an open transfer to berth's server; the fence proves it gone", { skip: skip ?? false, timeout: 180_000 }, async () => {
  const rig = await harness.gateway("gvisor", "m_kit_cut", { create: { image: boot } });
  const dir = harness.dir();
  const o = gatewaySshOpts(rig, dir);
  const src = join(dir, "big.bin");
  randomFile(src, 32 * MB);
  // -l: a slow transfer (8 Mbit/s), so it is still running when the key goes.
  const child = spawn("scp", [...o, "-l", "8192", "-P", String(rig.gw.port), src, `${rig.machine}@127.0.0.1:slow.bin`], { stdio: ["ignore", "ignore", "pipe"] });
  const exit = new Promise<number | null>((res) => child.once("exit", (c) => res(c)));
  const ws = workspace(rig);
  await until(() => existsSync(join(ws, "slow.bin")) && statSync(join(ws, "slow.bin")).size > 0, "the transfer started");
  assert.equal(rig.gw.sessions.count(rig.machine), 1, "berth's SFTP server is a counted session");
  // Inside the machine, the server is running now (through its loader).
  const probe = await rig.client();
  const ps = await new Promise<string>((res, rej) =>
    probe.exec("ps -o user,args", (err, ch) => {
      if (err) return rej(err);
      let out = "";
      ch.on("data", (d: Buffer) => (out += d.toString()));
      ch.on("close", () => res(out));
    }),
  );
  assert.match(ps, /app\s+\/run\/berth\/sftp\/ld\.so --library-path \/run\/berth\/sftp \/run\/berth\/sftp\/sftp-server/);
  probe.end();
  rig.keys.remove(rig.machine, rig.pair.fingerprint);
  assert.notEqual(await exit, 0, "scp failed when access was cut");
  assert.ok(statSync(join(ws, "slow.bin")).size < 32 * MB, "cut before the end");
  await until(() => rig.gw.sessions.count(rig.machine) === 0, "the SFTP session released");
  const proof = await rig.runtime.fence(rig.machine);
  assert.equal(proof.remaining, 0, "no process of the machine is left, the SFTP server included");
  assert.deepEqual(rig.store.unfinished(), [], "every session record clean");
  await rig.close();
});

test("an image without sftp-server under --files workspace: berth's server is never served unconfined (this image cannot build the jail)", { skip: skip ?? false, timeout: 120_000 }, async () => {
  const rig = await harness.gateway("gvisor", "m_kit_conf", { create: { image: boot, files: "workspace" } });
  const dir = harness.dir();
  const r = await runClient("sftp", [...gatewaySshOpts(rig, dir), "-P", String(rig.gw.port), "-b", "-", `${rig.machine}@127.0.0.1`], `get /etc/passwd ${join(dir, "x")}\n`);
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /berth: files_confinement_unavailable: this pool confines files to the workspace/);
  assert.ok(!existsSync(join(dir, "x")), "nothing was fetched");
  await rig.close();
});

test("the kit's parts from ldd: the loader, each library by soname; a library not found means no kit", () => {
  const out = "\tlinux-vdso.so.1 (0x00007ffd1)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f52)\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f53)\n";
  assert.deepEqual(kitPartsFromLdd("/usr/lib/openssh/sftp-server", out), {
    server: "/usr/lib/openssh/sftp-server",
    loader: "/lib64/ld-linux-x86-64.so.2",
    libraries: [{ name: "libc.so.6", path: "/lib/x86_64-linux-gnu/libc.so.6" }],
  });
  assert.equal(kitPartsFromLdd("/s", out.replace("=> /lib/x86_64-linux-gnu/libc.so.6 (0x00007f52)", "=> not found")), null);
  assert.equal(kitPartsFromLdd("/s", "\tnot a dynamic executable\n"), null);
  assert.equal(kitPartsFromLdd("/s", "\tlibc.so.6 => /lib/libc.so.6 (0x1)\n"), null, "no loader: no kit");
});
