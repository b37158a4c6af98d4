/**
 * Real processes for end-to-end tests: `berth serve` and `berth agent`
 * started from the built binary, tokens created on the coordinator's database
 * as `berth token create` creates them,
 * and an API client. Everything is torn down (SIGTERM, then SIGKILL) by close().
 */
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { randomBytes } from "node:crypto";
import { Api } from "../../src/cli/api.js";
import { generateSshKeyPair, type SshKeyPair } from "../../src/core/ssh-keys.js";
import { tempDir } from "./env.js";

export const BIN = resolve("bin/berth");

export interface Proc {
  child: ChildProcess;
  output: () => string;
}

export function startProcess(args: string[], env: Record<string, string> = {}, readyPattern: RegExp): Promise<Proc & { match: RegExpMatchArray }> {
  const child = spawn(process.execPath, [BIN, ...args], { env: { ...process.env, BERTH_LOG_LEVEL: "warn", BERTH_PG_URL: "", ...env }, stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  child.stdout!.on("data", (d: Buffer) => (out += d.toString()));
  child.stderr!.on("data", (d: Buffer) => (out += d.toString()));
  return new Promise((resolveReady, reject) => {
    const timer = setTimeout(() => reject(new Error(`timed out waiting for ${readyPattern} from berth ${args[0]}:\n${out}`)), 30_000);
    const check = () => {
      const m = out.match(readyPattern);
      if (m) {
        clearTimeout(timer);
        child.stdout!.off("data", check);
        resolveReady({ child, output: () => out, match: m });
      }
    };
    child.stdout!.on("data", check);
    child.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`berth ${args[0]} exited ${code} before ready:\n${out}`));
    });
  });
}

export async function stopProcess(p: Proc | null, signal: NodeJS.Signals = "SIGTERM"): Promise<void> {
  if (!p || p.child.exitCode !== null || p.child.signalCode !== null) return;
  const exited = new Promise((r) => p.child.once("exit", r));
  p.child.kill(signal);
  const t = setTimeout(() => p.child.kill("SIGKILL"), 10_000);
  await exited;
  clearTimeout(t);
}

export interface Result {
  status: number | null;
  stdout: string;
  stderr: string;
}

export function berthSync(args: string[], env: Record<string, string> = {}): Result {
  const r = spawnSync(process.execPath, [BIN, ...args], { env: { ...process.env, BERTH_PG_URL: "", ...env }, encoding: "utf8", timeout: 60_000 });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** Runs the CLI to completion asynchronously, so the test can watch it meanwhile. */
export function berth(args: string[], opts: { cwd?: string; env?: Record<string, string>; onSpawn?: (c: ChildProcess) => void } = {}): Promise<Result> {
  const child = spawn(process.execPath, [BIN, ...args], { cwd: opts.cwd, env: { ...process.env, BERTH_LOG_LEVEL: "warn", BERTH_PG_URL: "", ...opts.env }, stdio: ["ignore", "pipe", "pipe"] });
  opts.onSpawn?.(child);
  let stdout = "";
  let stderr = "";
  child.stdout!.on("data", (d: Buffer) => (stdout += d.toString()));
  child.stderr!.on("data", (d: Buffer) => (stderr += d.toString()));
  return new Promise((r) => child.once("close", (status) => r({ status, stdout, stderr })));
}

export interface ClusterOptions {
  runtime: "process" | "gvisor";
  minReady?: number;
  maxReady?: number;
  slots?: number;
  portable?: boolean;
  /** More `berth agent` flags (e.g. --registry-auth). */
  agentArgs?: string[];
}

export class Cluster {
  readonly dir = tempDir("berth-e2e-");
  coordinator: (Proc & { url: string }) | null = null;
  agent: Proc | null = null;
  api!: Api;
  adminTokenFile = "";
  keeper!: SshKeyPair;
  clientConfig = "";

  constructor(readonly o: ClusterOptions) {}

  get coordDir(): string {
    return join(this.dir.path, "coord");
  }
  get agentDir(): string {
    return join(this.dir.path, "agent");
  }

  async startCoordinator(): Promise<void> {
    const p = await startProcess(["serve", "--state-dir", this.coordDir, "--listen", this.coordinator ? `127.0.0.1:${new URL(this.coordinator.url).port}` : "127.0.0.1:0", ...(this.o.portable ? ["--portable"] : [])], {}, /listening on (http:\/\/\S+)/);
    this.coordinator = { ...p, url: p.match[1]! };
  }

  async startAgent(): Promise<void> {
    this.agent = await startProcess(
      ["agent", "--state-dir", this.agentDir, "--coordinator", this.coordinator!.url, "--enroll-token-file", join(this.dir.path, "agent.token"), "--runtime", this.o.runtime, "--slots", String(this.o.slots ?? 4), "--name", "e2e", "--log-level", "warn", ...(this.o.agentArgs ?? [])],
      {},
      /berth agent ready/,
    );
  }

  async start(): Promise<this> {
    mkdirSync(this.coordDir, { recursive: true });
    await this.startCoordinator();
    this.adminTokenFile = join(this.dir.path, "admin.token");
    // Created as `berth token create` does, on the coordinator's own database, without a process per token.
    const [{ SqliteStore }, { createToken }] = await Promise.all([import("../../src/store/sqlite/sqlite-store.js"), import("../../src/store/api-tokens.js")]);
    const store = new SqliteStore({ path: join(this.coordDir, "berth.db") });
    try {
      for (const [role, file] of [["admin", this.adminTokenFile], ["agent", join(this.dir.path, "agent.token")]] as const) {
        const t = await createToken(store, { org: "e2e", role, expiresAt: null, label: null }, Date.now(), (n) => randomBytes(n));
        writeFileSync(file, t.token + "\n", { mode: 0o600 });
      }
    } finally {
      await store.close();
    }
    this.keeper = generateSshKeyPair("e2e-keeper");
    writeFileSync(join(this.dir.path, "keeper_ed25519"), this.keeper.privateKey, { mode: 0o600 });
    writeFileSync(join(this.dir.path, "keeper_ed25519.pub"), this.keeper.publicKey + "\n");
    this.clientConfig = join(this.dir.path, "client.json");
    writeFileSync(this.clientConfig, JSON.stringify({ url: this.coordinator!.url, tokenFile: "admin.token", keeperKeyFile: "keeper_ed25519" }), { mode: 0o600 });
    this.api = new Api(this.coordinator!.url, readFileSync(this.adminTokenFile, "utf8").trim());
    await this.startAgent();
    return this;
  }

  async ensurePool(name = "ci", access: "keeper" | "portable" = "keeper"): Promise<void> {
    await this.api.call("POST", `/v1/pools/${name}/ensure`, {
      minReady: this.o.minReady ?? 1,
      maxReady: this.o.maxReady ?? 2,
      compatibilityKey: "e2e",
      access,
      provider: "hosts",
      keeperKey: access === "keeper" ? this.keeper.publicKey : null,
    });
  }

  async waitFor<T>(what: string, fn: () => Promise<T | null | undefined | false>, timeoutMs = 30_000): Promise<T> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const v = await fn();
      if (v) return v;
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  async readyCount(pool = "ci"): Promise<number> {
    const p = await this.api.call<{ counts: { ready: number } }>("GET", `/v1/pools/${pool}`);
    return p.counts.ready;
  }

  async machines(): Promise<{ id: string; state: string; generation: number; incarnation: string | null }[]> {
    // Read through `berth`'s own store file: the test inspects durable state, never a private API.
    const { SqliteStore } = await import("../../src/store/sqlite/sqlite-store.js");
    const s = new SqliteStore({ path: join(this.coordDir, "berth.db") });
    try {
      return await s.transaction((tx) => tx.all("SELECT id, state, generation, incarnation FROM machines ORDER BY created_at"));
    } finally {
      await s.close();
    }
  }

  async close(): Promise<void> {
    try {
      // Drain so the agent destroys every machine; then stop both processes.
      if (this.coordinator && this.coordinator.child.exitCode === null && this.agent && this.agent.child.exitCode === null) {
        const pools = await this.api.call<{ pools: { name: string }[] }>("GET", "/v1/pools");
        for (const p of pools.pools) await this.api.call("POST", `/v1/pools/${p.name}/drain`, { force: true });
        await this.waitFor("machines destroyed", async () => (await this.machines()).every((m) => m.state === "destroyed"), 30_000).catch(() => undefined);
      }
    } finally {
      await this.api?.close();
      await stopProcess(this.agent);
      await stopProcess(this.coordinator);
      this.dir.cleanup();
    }
  }
}
