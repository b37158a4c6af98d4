/**
 * A fleet for the host identity tests (docs/host-identity.md): a real
 * `berth serve` (SQLite, or PostgreSQL in a schema of its own) and real
 * `berth agent` processes, each with its own state directory and its own
 * copy of the shared enroll token. Agents can be started the way agents
 * built before host identity enrolled (`legacy`), with the switch's test
 * fault and crash points, and killed with SIGKILL. close() tears down all.
 */
import { randomBytes, sign, createPrivateKey } from "node:crypto";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Api } from "../../src/cli/api.js";
import { proofMessage } from "../../src/core/host-identity.js";
import type { Store } from "../../src/store/store.js";
import { berth, berthSync, startProcess, stopProcess, type Proc } from "./cluster.js";
import { PG_URL, tempDir } from "./env.js";
import { until } from "./portable-e2e.js";

export interface FleetAgent extends Proc {
  name: string;
  stateDir: string;
  tokenFile: string;
}

export interface AgentStart {
  legacy?: boolean;
  /** BERTH_TEST_IDENTITY_CRASH: where the agent SIGKILLs itself. */
  crash?: string;
  /** BERTH_TEST_IDENTITY_FAULT: record writes failing (write, rename, dirsync). */
  fault?: string;
  slots?: number;
  /** Resolve when the process started (ready line) — default; false: do not wait (it may die first). */
  waitReady?: boolean;
}

export class Fleet {
  readonly dir = tempDir("berth-identity-");
  readonly pgSchema = "t_" + randomBytes(6).toString("hex");
  coord: (Proc & { url: string }) | null = null;
  api!: Api;
  agentToken = "";
  readonly agents = new Map<string, FleetAgent>();

  constructor(readonly engine: "sqlite" | "postgres" = "sqlite") {}

  get coordDir(): string {
    return join(this.dir.path, "coord");
  }

  #env(): Record<string, string> {
    return this.engine === "postgres" ? { BERTH_PG_URL: PG_URL!, BERTH_PG_SCHEMA: this.pgSchema } : {};
  }

  async start(): Promise<this> {
    await this.startCoordinator();
    const admin = join(this.dir.path, "admin.token");
    for (const [role, file] of [["admin", admin], ["agent", join(this.dir.path, "agent.token")]] as const) {
      const r = berthSync(["token", "create", "--state-dir", this.coordDir, "--org", "idt", "--role", role, "--out", file], this.#env());
      if (r.status !== 0) throw new Error(`token create failed: ${r.stderr}`);
    }
    this.agentToken = readFileSync(join(this.dir.path, "agent.token"), "utf8").trim();
    this.api = new Api(this.coord!.url, readFileSync(admin, "utf8").trim());
    return this;
  }

  async startCoordinator(): Promise<void> {
    const listen = this.coord ? `127.0.0.1:${new URL(this.coord.url).port}` : "127.0.0.1:0";
    const p = await startProcess(["serve", "--state-dir", this.coordDir, "--listen", listen], this.#env(), /listening on (http:\/\/\S+)/);
    this.coord = { ...p, url: p.match[1]! };
  }

  async killCoordinator(): Promise<void> {
    await stopProcess(this.coord, "SIGKILL");
  }

  /** The admin CLI, against this coordinator (asynchronous: the test's own clients keep running meanwhile). */
  cli(args: string[]): ReturnType<typeof berth> {
    return berth(args, { env: { BERTH_URL: this.coord!.url, BERTH_TOKEN_FILE: join(this.dir.path, "admin.token") } });
  }

  async startAgent(name: string, o: AgentStart = {}): Promise<FleetAgent> {
    const stateDir = join(this.dir.path, `agent-${name}`);
    const tokenFile = join(this.dir.path, `${name}.token`);
    if (!this.agents.has(name)) writeFileSync(tokenFile, this.agentToken + "\n", { mode: 0o600 });
    const env: Record<string, string> = { BERTH_TEST_HOOKS: "1", BERTH_TEST_IDENTITY_TICK_MS: "200" };
    if (o.legacy) env.BERTH_TEST_LEGACY_ENROLL = "1";
    if (o.crash) env.BERTH_TEST_IDENTITY_CRASH = o.crash;
    if (o.fault) env.BERTH_TEST_IDENTITY_FAULT = o.fault;
    const args = ["agent", "--state-dir", stateDir, "--coordinator", this.coord!.url, "--enroll-token-file", tokenFile, "--runtime", "process", "--slots", String(o.slots ?? 2), "--name", name, "--log-level", "info"];
    let a: FleetAgent;
    if (o.waitReady === false) {
      const { spawn } = await import("node:child_process");
      const child = spawn(process.execPath, [join(process.cwd(), "bin/berth"), ...args], { env: { ...process.env, BERTH_PG_URL: "", ...env }, stdio: ["ignore", "pipe", "pipe"] });
      let out = "";
      child.stdout!.on("data", (d: Buffer) => (out += d.toString()));
      child.stderr!.on("data", (d: Buffer) => (out += d.toString()));
      a = { child, output: () => out, name, stateDir, tokenFile };
    } else {
      const p = await startProcess(args, env, /berth agent ready/);
      a = { ...p, name, stateDir, tokenFile };
    }
    this.agents.set(name, a);
    return a;
  }

  async stopAgent(name: string, signal: NodeJS.Signals = "SIGTERM"): Promise<void> {
    await stopProcess(this.agents.get(name) ?? null, signal);
  }

  /** Resolves once the agent process exited (e.g. at its crash point). */
  exited(name: string): Promise<void> {
    const a = this.agents.get(name)!;
    if (a.child.exitCode !== null || a.child.signalCode !== null) return Promise.resolve();
    return new Promise((r) => a.child.once("exit", () => r()));
  }

  async host(name: string): Promise<{ id: string; usedSlots: number; identity: { state: string; agentStep: string | null; owedReports: number } }> {
    const r = await this.api.call<{ hosts: Array<{ name: string; id: string; usedSlots: number; identity: { state: string; agentStep: string | null; owedReports: number } }> }>("GET", "/v1/hosts");
    const h = r.hosts.find((x) => x.name === name);
    if (!h) throw new Error(`no host ${name}`);
    return h;
  }

  record(name: string): { step: string; stopped: Array<{ machineId: string; generation: number }> } | null {
    const p = join(this.dir.path, `agent-${name}`, "identity-switch.json");
    return existsSync(p) ? (JSON.parse(readFileSync(p, "utf8")) as { step: string; stopped: Array<{ machineId: string; generation: number }> }) : null;
  }

  /** Signs a proof with an agent's identity key file, as only that agent could. */
  prove(name: string, purpose: "enroll" | "session" | "prepare", host: string, challenge: string): string {
    const key = createPrivateKey(readFileSync(join(this.dir.path, `agent-${name}`, "identity_ed25519"), "utf8"));
    return sign(null, proofMessage(purpose, host, challenge), key).toString("base64");
  }

  async store<T>(fn: (s: Store) => Promise<T>): Promise<T> {
    let s: Store;
    if (this.engine === "postgres") {
      const { PostgresStore } = await import("../../src/store/postgres/postgres-store.js");
      s = await PostgresStore.open({ connectionString: PG_URL!, schema: this.pgSchema });
    } else {
      const { SqliteStore } = await import("../../src/store/sqlite/sqlite-store.js");
      s = new SqliteStore({ path: join(this.coordDir, "berth.db") });
    }
    try {
      return await fn(s);
    } finally {
      await s.close();
    }
  }

  /** Every row of every table, as text: what "changes nothing" is checked against. */
  async dump(): Promise<Record<string, string>> {
    return this.store(async (s) =>
      s.transaction(async (tx) => {
        const tables =
          this.engine === "postgres"
            ? (await tx.all<{ name: string }>("SELECT table_name AS name FROM information_schema.tables WHERE table_schema = current_schema() ORDER BY 1"))
            : await tx.all<{ name: string }>("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY 1");
        const out: Record<string, string> = {};
        for (const { name } of tables) {
          const rows = await tx.all(`SELECT * FROM "${name}"`);
          out[name] = rows.map((r) => JSON.stringify(r)).sort().join("\n");
        }
        return out;
      }),
    );
  }

  async machines(): Promise<Array<{ id: string; resource_id: string; host_id: string; state: string; generation: number }>> {
    return this.store((s) => s.transaction((tx) => tx.all("SELECT id, resource_id, host_id, state, generation FROM machines ORDER BY created_at")));
  }

  async audit(event: string): Promise<Array<{ machine_id: string; generation: number }>> {
    return this.store((s) => s.transaction((tx) => tx.all("SELECT machine_id, generation FROM audit WHERE event = ? ORDER BY seq", [event])));
  }

  waitFor<T>(what: string, fn: () => Promise<T | null | undefined | false>, timeoutMs = 30_000): Promise<T> {
    return until(what, fn, timeoutMs);
  }

  async close(): Promise<void> {
    try {
      await this.api?.close();
      for (const a of this.agents.values()) await stopProcess(a, "SIGKILL");
      await stopProcess(this.coord);
      if (this.engine === "postgres") {
        const { PostgresStore } = await import("../../src/store/postgres/postgres-store.js");
        const s = await PostgresStore.open({ connectionString: PG_URL!, schema: this.pgSchema });
        await s.pool.query(`DROP SCHEMA "${this.pgSchema}" CASCADE`);
        await s.close();
      }
    } finally {
      this.dir.cleanup();
    }
  }
}
