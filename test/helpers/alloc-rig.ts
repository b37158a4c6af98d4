/**
 * Real processes for allocation tests: `berth serve` coordinators on one
 * store (SQLite file or PostgreSQL schema), one `berth agent` enrolled with
 * them (process runtime, room for a few `small` allocations), an admin token
 * admitted as an owner, and readers of the durable state: the coordinator's
 * store and the agent's holds (through the agent's own API, with the
 * host-call token the coordinator derives: bound to the host's identity key
 * once it has one, docs/host-identity.md).
 */
import { randomBytes } from "node:crypto";
import { spawnSync } from "node:child_process";
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { request } from "undici";
import { Api } from "../../src/cli/api.js";
import { createToken } from "../../src/coordinator/auth.js";
import { callTokenFor, type AgentAddress } from "../../src/providers/hosts/agent-call.js";
import type { PostgresStore } from "../../src/store/postgres/postgres-store.js";
import type { Store } from "../../src/store/store.js";
import { AgentHarness, type SpawnedAgent } from "./agent.js";
import { tempDir, type Engine } from "./env.js";
import { openLocation, startServe, type ServeProcess, type StoreLocation } from "./serve.js";

export interface Hold {
  allocationId: string;
  generation: number;
  state: "held" | "released";
}

export class AllocRig {
  readonly tmp = tempDir("berth-alloc-");
  readonly h = new AgentHarness("berth-alloc-agent-");
  loc!: StoreLocation;
  store!: Store;
  token = "";
  tokenId = "";
  agent: SpawnedAgent | null = null;
  agentUrl = "";
  hostId = "";
  readonly coordinators: ServeProcess[] = [];
  /** The agent's capacity flags (set before start; without --vcpu/--memory-mb it offers the host's real capacity). */
  agentArgs: string[] = ["--vcpu", "16", "--memory-mb", "32768", "--disk", "400G", "--slots", "8"];

  /** keepFirst: leave the coordinator that set things up running (else each test starts its own). */
  constructor(readonly engine: Engine = "sqlite", readonly keepFirst = false, readonly leaseArgs: string[] = ["--alloc-actor-lease", "1s"], readonly runtime: "process" | "gvisor" = "process") {}

  get agentDir(): string {
    return join(this.tmp.path, "agent");
  }

  /** The environment of a `berth` CLI run as this rig's admin against coordinator `i` (after start). */
  cliEnv(i = 0): Record<string, string> {
    return { BERTH_URL: this.coordinators[i]!.url, BERTH_TOKEN_FILE: join(this.tmp.path, "admin.token"), BERTH_KEY_DIR: join(this.tmp.path, "keys") };
  }

  /** Runs `line` (a `berth ssh --print` command line) with the system ssh, never prompting. */
  static runSshLine(line: string, timeoutMs = 60_000): { status: number | null; out: string; err: string } {
    const r = spawnSync("sh", ["-c", line.trim().replace(/^ssh /, "ssh -o BatchMode=yes ")], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], timeout: timeoutMs });
    return { status: r.status, out: r.stdout, err: r.stderr };
  }

  async start(): Promise<this> {
    const dir = join(this.tmp.path, "coord");
    mkdirSync(dir, { recursive: true });
    this.loc = this.engine === "postgres" ? { engine: "postgres", dir, schema: "t_" + randomBytes(6).toString("hex") } : { engine: "sqlite", dir };
    this.store = await openLocation(this.loc);
    const admin = await createToken(this.store, { org: "acme", role: "admin", expiresAt: null, label: null }, Date.now(), (n) => randomBytes(n));
    const agentTok = await createToken(this.store, { org: "acme", role: "agent", expiresAt: null, label: null }, Date.now(), (n) => randomBytes(n));
    this.token = admin.token;
    this.tokenId = admin.id;
    writeFileSync(join(this.tmp.path, "admin.token"), admin.token, { mode: 0o600 });
    writeFileSync(join(this.tmp.path, "agent.token"), agentTok.token, { mode: 0o600 });
    const c = await this.coordinator();
    await this.startAgent(c.url);
    await this.api(c).call("POST", `/v1/owners/${this.tokenId}/admit`, { vcpu: 16, memoryMib: 32768, count: 8 });
    if (!this.keepFirst) await c.kill("SIGTERM");
    return this;
  }

  /** Another `berth serve` on the same store (`env` e.g. a pause point). */
  async coordinator(env: Record<string, string> = {}): Promise<ServeProcess> {
    const p = await startServe(this.loc, { NODE_ENV: "test", ...env }, this.leaseArgs);
    this.coordinators.push(p);
    return p;
  }

  async startAgent(coordinatorUrl: string): Promise<void> {
    this.agent = this.h.spawnAgent({
      stateDir: this.agentDir, coordinator: coordinatorUrl, enrollTokenFile: join(this.tmp.path, "agent.token"), name: "h1", runtime: this.runtime,
      extraArgs: this.agentArgs,
    });
    const ready = await this.agent.ready;
    this.agentUrl = ready.url;
    this.hostId = /host=(\S+)/.exec(ready.line)?.[1] ?? "";
    if (!this.hostId.startsWith("h_")) {
      const r = await this.store.transaction((tx) => tx.get<{ id: string }>("SELECT id FROM hosts WHERE name = 'h1'"));
      this.hostId = r!.id;
    }
  }

  /**
   * Sends the coordinators' calls to this host through `proxy` (a fault
   * injector, test/helpers/agent-proxy.ts): the host's recorded agent address
   * becomes the proxy's. Again after every agent (re)start, which enrolls anew.
   */
  async routeAgentThrough(proxy: { url: string; target: string }): Promise<void> {
    proxy.target = this.agentUrl;
    await this.store.transaction((tx) => tx.run("UPDATE hosts SET url = ? WHERE id = ?", [proxy.url, this.hostId]));
  }

  async killAgent(): Promise<void> {
    const a = this.agent;
    if (!a || a.child.exitCode !== null || a.child.signalCode !== null) return;
    a.child.kill("SIGKILL");
    await a.exit;
  }

  api(c: ServeProcess): Api {
    return new Api(c.url, this.token);
  }

  /** The token the coordinator presents to the agent now (from the shared secret and the host's record). */
  async #callToken(): Promise<string> {
    const secret = Buffer.from(readFileSync(join(this.loc.dir, "coordinator.secret"), "utf8").trim(), "base64");
    const host = await this.store.transaction((tx) => tx.get<AgentAddress>("SELECT id, url, identity_state, identity_key FROM hosts WHERE id = ?", [this.hostId]));
    if (!host) throw new Error(`host ${this.hostId} is not enrolled`);
    return callTokenFor(secret, host);
  }

  /** The agent's holds, from its own API (the coordinator's host-call token). */
  async holds(): Promise<Hold[]> {
    const r = await request(`${this.agentUrl}/v1/agent/holds`, { headers: { authorization: `Bearer ${await this.#callToken()}` } });
    const body = (await r.body.json()) as { holds: Hold[] };
    return body.holds;
  }

  /** A GET on the agent's API as the coordinator would make it. */
  async agentGet(path: string): Promise<{ status: number; body: unknown }> {
    const r = await request(`${this.agentUrl}${path}`, { headers: { authorization: `Bearer ${await this.#callToken()}` } });
    return { status: r.statusCode, body: await r.body.json() };
  }

  /** Calls an agent operation as a (late) coordinator would. */
  async agentOp(body: unknown): Promise<{ status: number; body: { error?: { code: string } } }> {
    const r = await request(`${this.agentUrl}/v1/agent/ops`, { method: "POST", headers: { "content-type": "application/json", authorization: `Bearer ${await this.#callToken()}` }, body: JSON.stringify(body) });
    return { status: r.statusCode, body: (await r.body.json()) as { error?: { code: string } } };
  }

  async allocation(id: string): Promise<{ state: string; reason: string | null }> {
    const r = await this.store.transaction((tx) => tx.get<{ state: string; reason: string | null }>("SELECT state, reason FROM allocations WHERE id = ?", [id]));
    if (!r) throw new Error(`no allocation ${id}`);
    return r;
  }

  async actor(id: string): Promise<{ generation: number; actor: string; kind: string } | null> {
    const r = await this.store.transaction((tx) => tx.get<{ generation: number; actor: string; kind: string }>("SELECT generation, actor, kind FROM allocation_actors WHERE allocation_id = ?", [id]));
    return r ? { ...r, generation: Number(r.generation) } : null;
  }

  async ownerUse(): Promise<{ vcpu: number; memory: number; count: number }> {
    const r = await this.store.transaction((tx) => tx.get<{ used_vcpu: number; used_memory_mib: number; used_count: number }>("SELECT used_vcpu, used_memory_mib, used_count FROM alloc_owners WHERE owner = ?", [this.tokenId]));
    return { vcpu: Number(r!.used_vcpu), memory: Number(r!.used_memory_mib), count: Number(r!.used_count) };
  }

  async waitState(id: string, state: string, ms = 30_000): Promise<void> {
    const deadline = Date.now() + ms;
    for (;;) {
      const a = await this.allocation(id);
      if (a.state === state) return;
      if (Date.now() > deadline) throw new Error(`allocation ${id} is ${a.state} (${a.reason ?? ""}), not ${state}, after ${ms} ms`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  async close(): Promise<void> {
    for (const c of this.coordinators) await c.kill("SIGKILL").catch(() => undefined);
    await this.killAgent().catch(() => undefined);
    // Sandboxes outlive their agent by design; a test that failed before its release leaves
    // them running: end every runsc process under this rig's directory.
    for (const pid of readdirSync("/proc").filter((n) => /^\d+$/.test(n))) {
      try {
        if (readFileSync(`/proc/${pid}/cmdline`, "utf8").includes(`--root=${this.agentDir}/runsc`)) process.kill(Number(pid), "SIGKILL");
      } catch {
        /* gone, or not ours */
      }
    }
    // Volume disk images stay mounted after the agent ends (kept volumes, a test that failed before its release): unmount ours.
    const ours = readFileSync("/proc/self/mounts", "utf8").split("\n").map((l) => l.split(" ")[1] ?? "").filter((m) => m.startsWith(this.tmp.path + "/"));
    for (const m of ours.sort().reverse()) spawnSync("umount", [m]);
    await this.h.close();
    if (this.engine === "postgres") await (this.store as PostgresStore).pool.query(`DROP SCHEMA "${this.loc.schema}" CASCADE`).catch(() => undefined);
    await this.store.close();
    this.tmp.cleanup();
  }
}
