/**
 * Real processes for portable end-to-end tests: `berth serve --portable` and
 * `berth agent` from the built binary, tokens from `berth token create`,
 * independently configured clients (own directory, own token, own client
 * config), SSH through ssh2, and /proc scans. close() drains the pool,
 * waits for every machine to be destroyed, and stops both processes.
 */
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import ssh2 from "ssh2";
import { Api } from "../../src/cli/api.js";
import { startProcess, stopProcess as stop, berthSync, type Proc } from "./cluster.js";
import { tempDir } from "./env.js";

export { BIN, berth, berthSync, stopProcess as stop, type Proc, type Result } from "./cluster.js";

/** Starts `berth <args>` and resolves once its output matches `ready` (see cluster.ts startProcess). */
export const start = (args: string[], ready: RegExp, env: Record<string, string> = {}) => startProcess(args, env, ready);

/** Every process's argv (NULs as spaces), read from /proc. */
export function allCmdlines(): string[] {
  const out: string[] = [];
  for (const pid of readdirSync("/proc")) {
    if (!/^\d+$/.test(pid)) continue;
    try {
      out.push(readFileSync(`/proc/${pid}/cmdline`, "utf8").replace(/\0/g, " "));
    } catch {
      /* gone */
    }
  }
  return out;
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export async function until<T>(what: string, fn: () => Promise<T | null | undefined | false> | T | null | undefined | false, timeoutMs = 30_000, everyMs = 100): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(everyMs);
  }
}

export interface Client {
  dir: string;
  config: string;
  tokenId: string;
  args: string[];
}

export interface Machine {
  id: string;
  generation: number;
  ssh: { host: string; port: number; user: string; hostKey: string };
}

export class PortableCluster {
  readonly tmp = tempDir("berth-portable-e2e-");
  coordinator: (Proc & { url: string }) | null = null;
  agent: Proc | null = null;
  admin!: Api;
  port = 0;

  constructor(readonly o: { runtime: "process" | "gvisor"; minReady: number; maxReady: number; heartbeatMs?: number; slots?: number }) {}

  get coordDir(): string {
    return join(this.tmp.path, "coord");
  }

  async startCoordinator(): Promise<void> {
    const p = await start(["serve", "--portable", "--state-dir", this.coordDir, "--listen", `127.0.0.1:${this.port}`], /listening on (http:\/\/\S+)/);
    this.coordinator = { ...p, url: p.match[1]! };
    this.port = Number(new URL(this.coordinator.url).port);
  }

  token(role: string, file: string): string {
    const r = berthSync(["token", "create", "--state-dir", this.coordDir, "--org", "e2e", "--role", role, "--out", file, "--json"]);
    if (r.status !== 0) throw new Error(`token create failed: ${r.stderr}`);
    return (JSON.parse(r.stdout) as { id: string }).id;
  }

  async start(): Promise<this> {
    mkdirSync(this.coordDir, { recursive: true });
    await this.startCoordinator();
    const adminFile = join(this.tmp.path, "admin.token");
    this.token("admin", adminFile);
    this.token("agent", join(this.tmp.path, "agent.token"));
    this.admin = new Api(this.coordinator!.url, readFileSync(adminFile, "utf8").trim());
    this.agent = await start(
      ["agent", "--state-dir", join(this.tmp.path, "agent"), "--coordinator", this.coordinator!.url, "--enroll-token-file", join(this.tmp.path, "agent.token"), "--runtime", this.o.runtime, "--slots", String(this.o.slots ?? 6), "--name", "e2e", "--log-level", "warn"],
      /berth agent ready/,
    );
    await this.admin.call("POST", "/v1/pools/agents/ensure", {
      minReady: this.o.minReady,
      maxReady: this.o.maxReady,
      compatibilityKey: "e2e",
      access: "portable",
      provider: "hosts",
      heartbeatMs: this.o.heartbeatMs ?? 3_000,
    });
    await this.waitReady(this.o.minReady);
    return this;
  }

  async waitReady(n: number, timeoutMs = 60_000): Promise<void> {
    await until(`${n} ready machines`, async () => (await this.admin.call<{ counts: { ready: number } }>("GET", "/v1/pools/agents")).counts.ready >= n, timeoutMs);
  }

  /** A client of its own: directory, member token, client config. */
  client(name: string): Client {
    const dir = join(this.tmp.path, `client-${name}`);
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    const tokenId = this.token("member", join(dir, "token"));
    const config = join(dir, "client.json");
    writeFileSync(config, JSON.stringify({ url: this.coordinator!.url, tokenFile: "token" }), { mode: 0o600 });
    return { dir, config, tokenId, args: ["--config", config] };
  }

  /**
   * Heartbeats a borrow every second with its borrower's token, as `berth run` does, until the
   * returned function is called: a test that holds a borrow across several CLI calls must not
   * depend on finishing them within one heartbeat period on a busy machine.
   */
  heartbeating(client: Client, receipt: { borrowId: string; borrowToken: string; grantToken: string }): () => Promise<void> {
    const api = new Api(this.coordinator!.url, readFileSync(join(client.dir, "token"), "utf8").trim());
    const beat = () => api.call("POST", `/v1/borrows/${receipt.borrowId}/heartbeat`, { token: receipt.borrowToken, grantToken: receipt.grantToken }).catch(() => undefined);
    void beat();
    const timer = setInterval(() => void beat(), 1_000);
    const stop = async () => {
      clearInterval(timer);
      this.#heartbeats.delete(stop);
      await api.close();
    };
    this.#heartbeats.add(stop);
    return stop;
  }

  /** Heartbeat loops still running (a failed test never reached its stop): close() ends them. */
  readonly #heartbeats = new Set<() => Promise<void>>();

  async grant(id: string): Promise<{ state: string; reason: string | null; expiresAt: number; machine: { id: string; state: string } }> {
    return this.admin.call("GET", `/v1/borrows/${id}`);
  }

  async machineStates(): Promise<Record<string, number>> {
    return (await this.admin.call<{ states: Record<string, number> }>("GET", "/v1/pools/agents")).states;
  }

  #closed = false;

  /** Drain, wait until every machine is destroyed, stop both processes. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await Promise.all([...this.#heartbeats].map((stop) => stop()));
    try {
      if (this.coordinator && this.coordinator.child.exitCode === null && this.agent && this.agent.child.exitCode === null) {
        await this.admin.call("POST", "/v1/pools/agents/drain", {}).catch(() => undefined);
        await until(
          "every machine destroyed",
          async () => Object.entries(await this.machineStates()).every(([s, n]) => s === "destroyed" || n === 0),
          60_000,
        ).catch(() => undefined);
      }
    } finally {
      await this.admin?.close();
      await stop(this.agent);
      await stop(this.coordinator);
      this.tmp.cleanup();
    }
  }
}

export function receiptOf(path: string): { borrowId: string; borrowToken: string; grantToken: string; keyFile: string; publicKey: string; expiresAt: number; state: string; machine: Machine } {
  return JSON.parse(readFileSync(path, "utf8")) as ReturnType<typeof receiptOf>;
}

/** An SSH connection with `privateKey`; resolves with the client or rejects with the refusal. */
export function sshConnect(m: Machine, privateKey: string): Promise<ssh2.Client> {
  const pinned = Buffer.from(m.ssh.hostKey.split(/\s+/)[1]!, "base64");
  return new Promise((resolveConn, reject) => {
    const c = new ssh2.Client();
    c.once("ready", () => resolveConn(c));
    c.once("error", reject);
    c.connect({ host: m.ssh.host, port: m.ssh.port, username: m.ssh.user, privateKey, hostVerifier: (k: Buffer) => k.equals(pinned), readyTimeout: 10_000 });
  });
}

/** Runs a command to completion over an open connection. */
export function sshExec(c: ssh2.Client, command: string): Promise<{ code: number | null; out: string }> {
  return new Promise((resolveExec, reject) => {
    c.exec(command, (err, ch) => {
      if (err) return reject(err);
      let out = "";
      let code: number | null = null;
      ch.on("data", (d: Buffer) => (out += d.toString()));
      ch.stderr.on("data", (d: Buffer) => (out += d.toString()));
      ch.on("exit", (c2: number | null) => (code = c2));
      ch.on("close", () => resolveExec({ code, out }));
    });
  });
}

/** Starts a long command and resolves once it printed `ready`; `closed` resolves when the session ends (cut or finished). */
export function sshHold(c: ssh2.Client, command: string): Promise<{ closed: Promise<{ code: number | null }> }> {
  return new Promise((resolveHold, reject) => {
    c.exec(command, (err, ch) => {
      if (err) return reject(err);
      let code: number | null = null;
      const closed = new Promise<{ code: number | null }>((r) => {
        ch.on("exit", (c2: number | null) => (code = c2));
        ch.on("close", () => r({ code }));
        c.on("close", () => r({ code }));
      });
      ch.once("data", () => resolveHold({ closed }));
    });
  });
}

export function runscAvailable(): string | false {
  if (process.getuid?.() !== 0) return "the gvisor runtime needs root";
  for (const dir of (process.env.PATH ?? "").split(":")) if (dir && existsSync(join(dir, "runsc"))) return false;
  return "runsc is not installed";
}
