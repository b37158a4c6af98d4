/**
 * The gvisor runtime's OCI spec and in-sandbox scripts, without runsc: the
 * sandbox spec's isolation (mounts, masked state directory, namespaces, init),
 * the exec process spec, and the scripts themselves run by the host's /bin/sh
 * against real host processes (the identity wrapper's line, the signal
 * script's refusal of a mismatched leader).
 */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { COUNT_SCRIPT, EXEC_WRAPPER, INIT, PATH_IN, SIGNAL_SCRIPT, execProcessSpec, sandboxSpec } from "../../src/agent/runtime/gvisor-oci.js";
import { identityOf, parseStat, waitUntil } from "../../src/agent/runtime/procfs.js";
import { IDENTITY_PREFIX } from "../../src/agent/runtime/streams.js";

const dir = mkdtempSync(join(tmpdir(), "berth-oci-"));
after(() => rmSync(dir, { recursive: true, force: true }));

interface Mount {
  destination: string;
  type: string;
  source: string;
  options?: string[];
}

const input = {
  machineId: "m_" + "x".repeat(70),
  incarnation: "0123456789abcdef0123456789abcdef",
  workspace: "/var/lib/berth/machines/m_x/workspace",
  runDir: "/var/lib/berth/machines/m_x/bundle-0123/run",
  stateDir: "/var/lib/berth",
};

test("sandbox spec: workspace read-write, boot id read-only, agent state masked, private namespaces including the network", () => {
  const spec = sandboxSpec(input) as {
    ociVersion: string;
    process: { args: string[]; env: string[]; cwd: string; terminal: boolean; user: { uid: number } };
    root: { path: string; readonly: boolean };
    hostname: string;
    mounts: Mount[];
    linux: { namespaces: { type: string }[] };
  };
  const at = (d: string): Mount => {
    const m = spec.mounts.filter((x) => x.destination === d);
    assert.equal(m.length, 1, `exactly one mount at ${d}`);
    return m[0]!;
  };
  assert.deepEqual(at("/workspace"), { destination: "/workspace", type: "bind", source: input.workspace, options: ["rbind", "rw"] });
  assert.deepEqual(at("/run/berth"), { destination: "/run/berth", type: "bind", source: input.runDir, options: ["rbind", "ro"] });
  const mask = at(input.stateDir);
  assert.equal(mask.type, "tmpfs");
  assert.ok(mask.options?.includes("ro"), "the mask is read-only");
  assert.equal(at("/tmp").type, "tmpfs");
  assert.ok(at("/sys").options?.includes("ro"));
  // No host path other than the workspace and the boot id is bound in.
  assert.deepEqual(spec.mounts.filter((m) => m.type === "bind").map((m) => m.source).sort(), [input.runDir, input.workspace].sort());
  assert.deepEqual(spec.linux.namespaces.map((n) => n.type).sort(), ["ipc", "mount", "network", "pid", "uts"]);
  assert.deepEqual(spec.root, { path: "/", readonly: false });
  assert.equal(spec.hostname.length, 63, "hostname cut to the 63-byte limit");
  assert.ok(input.machineId.startsWith(spec.hostname));
  assert.deepEqual(spec.process.args, INIT);
  assert.equal(spec.process.terminal, false);
  assert.equal(spec.process.cwd, "/workspace");
  assert.deepEqual(spec.process.env, [`PATH=${PATH_IN}`, "HOME=/workspace", `BERTH_MACHINE=${input.machineId}`, `BERTH_INCARNATION=${input.incarnation}`]);
  assert.doesNotThrow(() => JSON.parse(JSON.stringify(spec)));
});

test("sandbox spec of an image: berth's SFTP server bound read-only beneath /run/berth, after it; none without a kit", () => {
  const kit = "/var/lib/berth/sftp-kit/0123456789abcdef";
  const mounts = (sandboxSpec({ ...input, root: "/var/lib/berth/images/abc/rootfs", sftpKit: kit }) as { mounts: Mount[] }).mounts;
  const i = mounts.findIndex((m) => m.destination === "/run/berth/sftp");
  assert.deepEqual(mounts[i], { destination: "/run/berth/sftp", type: "bind", source: kit, options: ["rbind", "ro"] });
  assert.ok(i > mounts.findIndex((m) => m.destination === "/run/berth"), "mounted after /run/berth, over its mount point");
  assert.equal((sandboxSpec(input) as { mounts: Mount[] }).mounts.some((m) => m.destination === "/run/berth/sftp"), false);
});

test("exec process spec: the identity wrapper runs first, argv and environment pass exactly, terminal as asked", () => {
  const env = { PATH: PATH_IN, LANG: "C.UTF-8", ODD: "a b=c 'q'" };
  const pipe = execProcessSpec(["printf", "%s", "x y"], env, false) as { args: string[]; env: string[]; terminal: boolean; cwd: string };
  assert.deepEqual(pipe.args, ["/bin/sh", "-c", EXEC_WRAPPER, "berth-exec", "printf", "%s", "x y"]);
  assert.deepEqual(pipe.env, [`PATH=${PATH_IN}`, "LANG=C.UTF-8", "ODD=a b=c 'q'"]);
  assert.equal(pipe.terminal, false);
  assert.equal(pipe.cwd, "/workspace");
  assert.equal((execProcessSpec(["sh"], {}, true) as { terminal: boolean }).terminal, true);
});

test("identity wrapper (host /bin/sh): one identity line on stderr naming the command's own pid, then the command with its argv intact", () => {
  const spec = execProcessSpec(["/bin/sh", "-c", 'echo "pid=$$ args=$#:$1"', "inner", "one two"], {}, false) as { args: string[] };
  const r = spawnSync(spec.args[0]!, spec.args.slice(1), { encoding: "utf8" });
  assert.equal(r.status, 0, r.stderr);
  const lines = r.stderr.split("\n").filter(Boolean);
  assert.equal(lines.length, 1, `exactly one stderr line: ${JSON.stringify(r.stderr)}`);
  assert.ok(lines[0]!.startsWith(IDENTITY_PREFIX), "the line carries the identity prefix");
  const st = parseStat(lines[0]!.slice(IDENTITY_PREFIX.length));
  assert.ok(st, "the line is a /proc stat line");
  const m = /^pid=(\d+) args=1:one two$/.exec(r.stdout.trim());
  assert.ok(m, `the command ran with its argv: ${r.stdout}`);
  assert.equal(st.pid, Number(m[1]), "exec kept the pid: the identity is the command's");
});

test("signal script (host /bin/sh): refuses a gone or different leader, signals the exact recorded group", async () => {
  const sleeper = spawn("sleep", ["1000"], { detached: true, stdio: "ignore" });
  try {
    await waitUntil(() => identityOf(sleeper.pid!) !== null, 5_000);
    const id = identityOf(sleeper.pid!)!;
    const sig = (pid: number, start: number, pgid: number, name: string) =>
      spawnSync("/bin/sh", ["-c", SIGNAL_SCRIPT, "berth-signal", String(pid), String(start), String(pgid), name]).status;
    assert.equal(sig(id.pid, id.startTime + 1, id.pgid, "0"), 4, "a different start time is a different process");
    assert.equal(sig(id.pid, id.startTime, id.pgid + 1, "0"), 4, "a different group");
    assert.equal(sig(2 ** 22 + 7, id.startTime, id.pgid, "0"), 3, "no such process");
    assert.ok(identityOf(sleeper.pid!), "nothing was signalled on a refusal");
    assert.equal(sig(id.pid, id.startTime, id.pgid, "KILL"), 0);
    assert.ok(await waitUntil(() => sleeper.exitCode !== null || sleeper.signalCode !== null, 5_000), "the exact group was killed");
  } finally {
    sleeper.kill("SIGKILL");
  }
});

test("count script (host /bin/sh): prints one integer", () => {
  const r = spawnSync("/bin/sh", ["-c", COUNT_SCRIPT], { encoding: "utf8" });
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /^\d+\n$/);
});
