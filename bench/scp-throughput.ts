/**
 * scp throughput to a machine through the gateway, against plain scp to an
 * OpenSSH server on this host, in one run, alternating, medians.
 *
 *   node dist/bench/scp-throughput.js [process|gvisor] [MB=1024] [runs=3]
 *
 * - gateway: a real runtime + machine + the agent's SSH gateway (in this
 *   process), the system `scp` (OpenSSH 9: SFTP) with a borrow key;
 * - sshd: this host's /usr/sbin/sshd started here on a loopback port with a
 *   temporary config, host key and authorized_keys (the system's sshd and its
 *   config are never touched), the same `scp` and file;
 * - library: `MachineFiles.upload` (ssh2 SFTP, fastPut) to the same machine.
 * Both sides write the file to disk on this same host. Prints MB/s medians and
 * the ratio, writes bench/results/scp-throughput-<runtime>.json.
 */
import { spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, openSync, rmSync, writeFileSync, writeSync, closeSync } from "node:fs";
import { createServer, type AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { randomBytes } from "node:crypto";
import { AgentHarness } from "../test/helpers/agent.js";
import { generateSshKeyPair } from "../src/core/ssh-keys.js";
import { connect } from "../src/client/ssh.js";
import { MachineFiles, openSftp } from "../src/client/files.js";

const kind = (process.argv[2] ?? "process") as "process" | "gvisor";
const mb = Number(process.argv[3] ?? 1024);
const runs = Number(process.argv[4] ?? 3);
const dir = mkdtempSync(join(tmpdir(), "berth-scp-bench-"));
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

function freePort(): Promise<number> {
  return new Promise((res) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => {
      const p = (s.address() as AddressInfo).port;
      s.close(() => res(p));
    });
  });
}

function timed(cmd: string, args: string[]): Promise<number> {
  return new Promise((resolve, reject) => {
    const t = process.hrtime.bigint();
    const c = spawn(cmd, args, { stdio: ["ignore", "ignore", "pipe"] });
    let err = "";
    c.stderr.on("data", (d: Buffer) => (err += d.toString()));
    c.once("close", (code) => (code === 0 ? resolve(Number(process.hrtime.bigint() - t) / 1e9) : reject(new Error(`${cmd} exited ${code}: ${err}`))));
  });
}

const src = join(dir, "payload.bin");
{
  const fd = openSync(src, "w");
  for (let i = 0; i < mb; i++) writeSync(fd, randomBytes(1024 * 1024));
  closeSync(fd);
}

// Our own sshd on loopback: temporary host key, authorized_keys and config.
const sshdDir = join(dir, "sshd");
mkdirSync(sshdDir, { mode: 0o700 });
const hostKey = generateSshKeyPair("bench-sshd");
writeFileSync(join(sshdDir, "host_key"), hostKey.privateKey, { mode: 0o600 });
const user = generateSshKeyPair("bench-user");
writeFileSync(join(sshdDir, "authorized_keys"), user.publicKey + "\n", { mode: 0o600 });
writeFileSync(join(dir, "user_key"), user.privateKey, { mode: 0o600 });
const sshdPort = await freePort();
const recv = join(dir, "recv");
mkdirSync(recv);
writeFileSync(
  join(sshdDir, "sshd_config"),
  [
    `Port ${sshdPort}`,
    "ListenAddress 127.0.0.1",
    `HostKey ${join(sshdDir, "host_key")}`,
    `AuthorizedKeysFile ${join(sshdDir, "authorized_keys")}`,
    `PidFile ${join(sshdDir, "pid")}`,
    "PermitRootLogin prohibit-password",
    "PasswordAuthentication no",
    "KbdInteractiveAuthentication no",
    "UsePAM no",
    "StrictModes no",
    "Subsystem sftp /usr/lib/openssh/sftp-server",
  ].join("\n") + "\n",
);
mkdirSync("/run/sshd", { recursive: true });
const sshd = spawn("/usr/sbin/sshd", ["-D", "-e", "-f", join(sshdDir, "sshd_config")], { stdio: ["ignore", "ignore", "pipe"] });
await new Promise((r) => setTimeout(r, 500));
writeFileSync(join(dir, "known_hosts_sshd"), `[127.0.0.1]:${sshdPort} ${hostKey.publicKey}\n`);

const harness = new AgentHarness("berth-scp-bench-rt-");
const rig = await harness.gateway(kind, "m_scp_bench");
writeFileSync(join(dir, "gw_key"), rig.pair.privateKey, { mode: 0o600 });
writeFileSync(join(dir, "known_hosts_gw"), `[127.0.0.1]:${rig.gw.port} ${rig.gw.hostKey}\n`);
const common = ["-o", "StrictHostKeyChecking=yes", "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR"];
const toSshd = ["-i", join(dir, "user_key"), "-o", `UserKnownHostsFile=${join(dir, "known_hosts_sshd")}`, ...common, "-P", String(sshdPort), src, `${process.env.USER ?? "root"}@127.0.0.1:${join(recv, "payload.bin")}`];
const toGw = ["-i", join(dir, "gw_key"), "-o", `UserKnownHostsFile=${join(dir, "known_hosts_gw")}`, ...common, "-P", String(rig.gw.port), src, `${rig.machine}@127.0.0.1:payload.bin`];

const conn = await connect({ host: "127.0.0.1", port: rig.gw.port, user: rig.machine, hostKey: rig.gw.hostKey, privateKey: rig.pair.privateKey });
const files = new MachineFiles(await openSftp(conn));

const secs = { sshd: [] as number[], gateway: [] as number[], library: [] as number[] };
for (let i = 0; i < runs; i++) {
  // Alternate the order so drift on the shared host falls on both sides.
  const order = i % 2 === 0 ? (["sshd", "gateway", "library"] as const) : (["library", "gateway", "sshd"] as const);
  for (const which of order) {
    let s: number;
    if (which === "sshd") s = await timed("scp", toSshd);
    else if (which === "gateway") s = await timed("scp", toGw);
    else {
      const t = process.hrtime.bigint();
      await files.upload(src, "payload-lib.bin");
      s = Number(process.hrtime.bigint() - t) / 1e9;
    }
    secs[which].push(s);
    console.log(`run ${i + 1} ${which}: ${(mb / s).toFixed(1)} MB/s`);
  }
}
files.close();
conn.end();
const mbps = (xs: number[]) => mb / median(xs);
const result = {
  runtime: kind,
  mib: mb,
  runs,
  medianMBps: { sshd: mbps(secs.sshd), gateway: mbps(secs.gateway), library: mbps(secs.library) },
  ratio: { gatewayVsSshd: mbps(secs.gateway) / mbps(secs.sshd), libraryVsSshd: mbps(secs.library) / mbps(secs.sshd) },
  seconds: secs,
};
console.log(JSON.stringify(result.medianMBps), JSON.stringify(result.ratio));
mkdirSync("bench/results", { recursive: true });
writeFileSync(`bench/results/scp-throughput-${kind}.json`, JSON.stringify(result, null, 2) + "\n");
sshd.kill("SIGTERM");
await harness.close();
rmSync(dir, { recursive: true, force: true });
