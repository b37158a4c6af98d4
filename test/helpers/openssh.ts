/**
 * Real OpenSSH clients (ssh, sftp, scp, rsync) against a test's in-process
 * gateway: the options that pin its host key and use the rig's key, and an
 * asynchronous run (the gateway lives in the test's own process: a
 * synchronous spawn would starve it).
 */
import { spawn, type ChildProcess } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { closeSync, createReadStream, existsSync, openSync, writeFileSync, writeSync } from "node:fs";
import { createServer, connect as netConnect, type AddressInfo, type Socket } from "node:net";
import { join } from "node:path";
import { until, type GatewayRig } from "./agent.js";

/** `-i KEY -o …` for a client of `rig`'s gateway; the key and known_hosts are written into `dir` once. */
export function gatewaySshOpts(rig: GatewayRig, dir: string): string[] {
  const key = join(dir, "id");
  if (!existsSync(key)) {
    writeFileSync(key, rig.pair.privateKey, { mode: 0o600 });
    writeFileSync(join(dir, "known_hosts"), `[127.0.0.1]:${rig.gw.port} ${rig.gw.hostKey}\n`);
  }
  return ["-i", key, "-o", `UserKnownHostsFile=${join(dir, "known_hosts")}`, "-o", "StrictHostKeyChecking=yes", "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR"];
}

/** Run a client with `input` on its stdin; killed after `timeoutMs` (status null then). */
export function runClient(cmd: string, args: string[], input = "", timeoutMs = 300_000): Promise<{ status: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const child = spawn(cmd, args, { stdio: ["pipe", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
    child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
    const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
    child.once("close", (status) => {
      clearTimeout(timer);
      resolve({ status, stdout, stderr });
    });
    child.stdin.on("error", () => {});
    child.stdin.end(input);
  });
}

/**
 * `ssh -L` through `rig`'s gateway to `localhost:inner` inside the machine, where a server greets with
 * "INNER\n": the open forward is a counted session, the rig's key is then revoked (what a return does), and
 * the open connection must close and the session be released. The ssh client is killed at the end.
 */
export async function revokedKeyCutsOpenForward(rig: GatewayRig, sshOpts: string[], inner: number): Promise<void> {
  const local = await new Promise<number>((res) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => {
      const p = (s.address() as AddressInfo).port;
      s.close(() => res(p));
    });
  });
  const args = [...sshOpts, "-p", String(rig.gw.port), "-N", "-o", "ExitOnForwardFailure=yes", "-L", `${local}:localhost:${inner}`, `${rig.machine}@127.0.0.1`];
  const l: ChildProcess = spawn("ssh", args, { stdio: "ignore" });
  try {
    const sock = await greeted(local);
    const closed = new Promise<void>((res) => sock.once("close", () => res()));
    sock.on("error", () => {});
    await until(() => rig.gw.sessions.count(rig.machine) >= 1, "the forward is a counted session");
    rig.keys.remove(rig.machine, rig.pair.fingerprint);
    await closed;
    await until(() => rig.gw.sessions.count(rig.machine) === 0, "the forward released");
  } finally {
    l.kill("SIGKILL");
  }
}

/** A connection to 127.0.0.1:`port` whose first bytes are "INNER\n" (retried until the forward listens). */
async function greeted(port: number, ms = 30_000): Promise<Socket> {
  const deadline = Date.now() + ms;
  for (;;) {
    const s = netConnect(port, "127.0.0.1");
    const first = await new Promise<string | null>((res) => {
      s.once("data", (d) => res(d.toString()));
      s.once("error", () => res(null));
      s.once("close", () => res(null));
    });
    if (first === "INNER\n") return s;
    s.destroy();
    if (Date.now() > deadline) throw new Error("timed out waiting for the forward");
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** A file of `n` random bytes (written in 1 MiB pieces) and its sha256. */
export function randomFile(path: string, n: number): string {
  const h = createHash("sha256");
  const fd = openSync(path, "w");
  for (let left = n; left > 0; left -= 1 << 20) {
    const b = randomBytes(Math.min(1 << 20, left));
    h.update(b);
    writeSync(fd, b);
  }
  closeSync(fd);
  return h.digest("hex");
}

/** The sha256 of a file, read as a stream. */
export function sha256Of(path: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const h = createHash("sha256");
    createReadStream(path).on("data", (d) => h.update(d)).on("end", () => resolve(h.digest("hex"))).on("error", reject);
  });
}
