/**
 * A real deployment for the end-to-end benchmarks: `berth serve` (SQLite or
 * PostgreSQL) and one `berth agent` (process or gvisor runtime), both child
 * processes of the built binary; tokens; a hosts-provider pool; the keeper
 * key; a borrow → SSH → command → return cycle with its timings.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { execFileSync } from "node:child_process";
import { Api } from "../src/cli/api.js";
import { generateSshKeyPair, type SshKeyPair } from "../src/core/ssh-keys.js";
import { connect, execStreaming } from "../src/cli/ssh-client.js";
import type { SshConnection } from "../src/client/ssh.js";
import { arg, BIN, startBenchCoordinator, stopChild, type BenchCoordinator, type Engine } from "./lib.js";
import { networkAvailability } from "../src/agent/network/host.js";
import { Writable } from "node:stream";

export type Runtime = "process" | "gvisor";

/**
 * The runtimes a network bench runs (`--runtimes`, gvisor dropped with the reason when it cannot run);
 * exits 0 with the reason when network policies are unavailable here.
 */
export function networkBenchRuntimes(): { runtimes: Runtime[]; skipped: string[] } {
  const na = networkAvailability();
  if (!na.ok) {
    process.stdout.write(`network policies unavailable here: ${na.why}\n`);
    process.exit(0);
  }
  let runtimes = arg("runtimes", "process,gvisor").split(",") as Runtime[];
  const skipped: string[] = [];
  const gv = gvisorSkipReason();
  if (gv && runtimes.includes("gvisor")) {
    skipped.push(gv);
    runtimes = runtimes.filter((r) => r !== "gvisor");
  }
  return { runtimes, skipped };
}

/** Why gvisor cannot run here, or null. */
export function gvisorSkipReason(): string | null {
  if (process.getuid?.() !== 0) return "gvisor skipped: the gvisor runtime needs root";
  try {
    execFileSync("runsc", ["--version"], { stdio: "ignore" });
    return null;
  } catch {
    return "gvisor skipped: runsc is not installed";
  }
}

export interface BenchCluster {
  coord: BenchCoordinator;
  agent: ChildProcess;
  admin: Api;
  keeper: SshKeyPair;
  close(): Promise<void>;
}

export async function startCluster(o: { engine: Engine; runtime: Runtime; slots: number; portable?: boolean; agentArgs?: string[] }): Promise<BenchCluster> {
  const coord = await startBenchCoordinator({ engine: o.engine, mode: "serve", portable: o.portable });
  let agent: ChildProcess | null = null;
  try {
    const tokenFile = join(coord.dir, "agent.token");
    writeFileSync(tokenFile, (await coord.token("agent")) + "\n", { mode: 0o600 });
    // BENCH_AGENT_NODE_ARGS (e.g. "--cpu-prof --cpu-prof-dir=/tmp/prof") reaches only the agent process.
    const nodeArgs = (process.env.BENCH_AGENT_NODE_ARGS ?? "").split(" ").filter(Boolean);
    agent = spawn(
      process.execPath,
      [...nodeArgs, BIN, "agent", "--state-dir", join(coord.dir, "agent"), "--coordinator", coord.url, "--enroll-token-file", tokenFile, "--runtime", o.runtime, "--slots", String(o.slots), "--name", "bench", "--log-level", "warn", ...(o.agentArgs ?? [])],
      { env: { ...process.env, BERTH_LOG_LEVEL: "warn" }, stdio: ["ignore", "pipe", "inherit"] },
    );
    await new Promise<void>((resolve, reject) => {
      let buf = "";
      agent!.stdout!.on("data", (d: Buffer) => {
        buf += d.toString();
        if (buf.includes("berth agent ready")) resolve();
      });
      agent!.once("exit", (code) => reject(new Error(`berth agent exited with status ${code} before it was ready`)));
    });
    const admin = new Api(coord.url, await coord.token("admin"));
    const a = agent;
    return {
      coord,
      agent: a,
      admin,
      keeper: generateSshKeyPair("bench-keeper"),
      async close() {
        // Drain so that the agent destroys its sandboxes before it stops.
        const pools = await admin.call<{ pools: { name: string }[] }>("GET", "/v1/pools").catch(() => ({ pools: [] }));
        for (const p of pools.pools) await admin.call("POST", `/v1/pools/${p.name}/drain`, {}).catch(() => undefined);
        const deadline = Date.now() + 60_000;
        while (Date.now() < deadline) {
          const live = await coord.store.transaction((tx) => tx.get<{ n: number }>("SELECT COUNT(*) AS n FROM machines WHERE state <> 'destroyed'"));
          if (Number(live?.n ?? 0) === 0) break;
          await sleep(100);
        }
        await admin.close();
        await stopChild(a);
        await coord.close();
      },
    };
  } catch (e) {
    if (agent) await stopChild(agent);
    await coord.close();
    throw e;
  }
}

export async function ensureHostsPool(c: BenchCluster, pool: string, access: "keeper" | "portable", machines: number, extra: Record<string, unknown> = {}): Promise<void> {
  await c.admin.call("POST", `/v1/pools/${pool}/ensure`, {
    ...extra,
    minReady: machines,
    maxReady: machines,
    compatibilityKey: "bench",
    access,
    provider: "hosts",
    keeperKey: access === "keeper" ? c.keeper.publicKey : null,
  });
  await waitReadyCount(c, pool, machines, 180_000);
}

export async function readyCount(c: BenchCluster, pool: string): Promise<number> {
  const r = await c.coord.store.readCommitted<{ n: number }>("SELECT COUNT(*) AS n FROM machines WHERE pool = ? AND state = 'ready'", [pool]);
  return Number(r?.n ?? 0);
}

export async function waitReadyCount(c: BenchCluster, pool: string, n: number, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while ((await readyCount(c, pool)) < n) {
    if (Date.now() > deadline) throw new Error(`pool ${pool}: fewer than ${n} ready machines after ${timeoutMs} ms`);
    await sleep(20);
  }
}

/** Polls the store (committed state) until the machine is `ready` at a generation above `after`; resolves with the state it ended in. */
export async function waitMachineReady(c: BenchCluster, machineId: string, timeoutMs: number): Promise<string> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const m = await c.coord.store.readCommitted<{ state: string }>("SELECT state FROM machines WHERE id = ?", [machineId]);
    const state = m?.state ?? "gone";
    if (state === "ready" || state === "quarantined" || state === "destroyed" || state === "gone") return state;
    if (Date.now() > deadline) return `timeout (${state})`;
    await sleep(2);
  }
}

export interface Borrowed {
  borrowId: string;
  borrowToken: string;
  grantToken?: string;
  machine: { id: string; ssh: { host: string | null; port: number | null; user: string | null; hostKey: string | null } };
}

export function sshTo(b: Borrowed, privateKey: string): Promise<SshConnection> {
  return connect({ host: b.machine.ssh.host ?? "127.0.0.1", port: b.machine.ssh.port ?? 22, user: b.machine.ssh.user ?? b.machine.id, hostKey: b.machine.ssh.hostKey ?? "", privateKey });
}

/** Runs `command`; resolves with the time of the first output byte (ms, performance.now()) once it exits 0. */
export async function firstByte(client: SshConnection, command: string): Promise<number> {
  let at = NaN;
  const sink = new Writable({ write: (_c, _e, cb) => cb() });
  const r = await execStreaming(client, command, { stdout: sink, stderr: sink, onFirstByte: () => (at = performance.now()) });
  if (r.code !== 0) throw new Error(`command exited ${r.code ?? r.signal}`);
  return at;
}

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
