/**
 * `berth mcp` under test: a real `berth up` (process runtime) in a temp
 * directory, `berth mcp` started by the MCP SDK's own client over stdio, or
 * as a `--listen` process reached with the SDK's Streamable HTTP client.
 */
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { Api } from "../../src/client/http.js";
import { BIN, startProcess, stopProcess, type Proc } from "./cluster.js";
import { tempDir } from "./env.js";

export interface PoolState {
  ready: number;
  lent: number;
  cleanup: number;
  states: Record<string, number>;
  /** The pool's live machines. */
  machines: { id: string; state: string }[];
}

export class UpRig {
  readonly dir = tempDir("berth-mcp-");
  up: Proc | null = null;
  url = "";

  get stateDir(): string {
    return join(this.dir.path, ".berth");
  }
  get config(): string {
    return join(this.stateDir, "client.json");
  }
  get adminToken(): string {
    return readFileSync(join(this.stateDir, "admin.token"), "utf8").trim();
  }

  async start(): Promise<this> {
    const p = await startProcess(["up", "--state-dir", this.stateDir, "--listen", "127.0.0.1:0", "--runtime", "process"], {}, /coordinator\s+(http:\/\/\S+)/);
    this.up = p;
    this.url = p.match[1]!;
    await this.waitFor("two ready machines", async () => ((await this.pool()).ready >= 2 ? true : null));
    return this;
  }

  async pool(name = "default"): Promise<PoolState> {
    const api = new Api(this.url, this.adminToken);
    try {
      const p = await api.call<{ counts: { ready: number; lent: number; cleanup: number }; states: Record<string, number>; networks: { id: string; state: string }[] }>("GET", `/v1/pools/${name}`);
      return { ...p.counts, states: p.states, machines: p.networks.map((m) => ({ id: m.id, state: m.state })) };
    } finally {
      await api.close();
    }
  }

  /**
   * The pool back where it started: nothing lent or in cleanup, nothing quarantined, at least
   * min-ready ready — and each of `machines` ready again itself (returned, fenced, scrubbed),
   * not abandoned, quarantined and replaced by a new one.
   */
  settled(machines: string[] = []): Promise<PoolState> {
    return this.waitFor(`the pool settled (nothing lent, nothing in cleanup, 2+ ready, nothing quarantined${machines.length ? `, ${machines.join(", ")} ready again` : ""})`, async () => {
      const p = await this.pool();
      const ready = new Set(p.machines.filter((m) => m.state === "ready").map((m) => m.id));
      return p.lent === 0 && p.cleanup === 0 && p.ready >= 2 && !p.states.quarantined && machines.every((m) => ready.has(m)) ? p : null;
    });
  }

  async waitFor<T>(what: string, fn: () => Promise<T | null>, timeoutMs = 60_000): Promise<T> {
    const until = Date.now() + timeoutMs;
    for (;;) {
      const v = await fn();
      if (v !== null) return v;
      if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  berthToken(org: string, role = "member"): string {
    const r = spawnSyncBerth(["token", "create", "--org", org, "--role", role, "--state-dir", this.stateDir]);
    return r.trim();
  }

  async close(): Promise<void> {
    await stopProcess(this.up, "SIGINT");
    this.dir.cleanup();
  }
}

function spawnSyncBerth(args: string[]): string {
  const r = spawnSync(process.execPath, [BIN, ...args], { encoding: "utf8", env: { ...process.env, BERTH_PG_URL: "" } });
  if (r.status !== 0) throw new Error(`berth ${args.join(" ")}: ${r.stderr}`);
  return r.stdout;
}

export interface ToolAnswer {
  isError: boolean;
  text: string;
  /** The JSON of a successful answer (or of an error's details block). */
  json: Record<string, unknown>;
}

export async function call(c: Client, name: string, args: Record<string, unknown>): Promise<ToolAnswer> {
  const r = (await c.callTool({ name, arguments: args })) as { isError?: boolean; content: { type: string; text: string }[] };
  const text = r.content.map((x) => x.text).join("\n");
  let json: Record<string, unknown> = {};
  const start = text.indexOf("{");
  if (start >= 0) {
    try {
      json = JSON.parse(text.slice(start)) as Record<string, unknown>;
    } catch {
      json = {};
    }
  }
  return { isError: Boolean(r.isError), text, json };
}

export interface StdioMcp {
  client: Client;
  transport: StdioClientTransport;
  pid: number;
  stderr: () => string;
  /** Resolves with the exit code (or signal) of `berth mcp`. */
  exited: Promise<number | string | null>;
}

/** `berth mcp ARGS` started by the SDK's stdio client (as an MCP client application does). */
export async function stdioMcp(rig: UpRig, args: string[] = []): Promise<StdioMcp> {
  const transport = new StdioClientTransport({ command: process.execPath, args: [BIN, "mcp", "--config", rig.config, ...args], stderr: "pipe", env: { ...process.env, BERTH_PG_URL: "" } as Record<string, string> });
  let err = "";
  transport.stderr?.on("data", (d: Buffer) => (err += d.toString()));
  const client = new Client({ name: "berth-test", version: "1" });
  await client.connect(transport);
  const pid = transport.pid!;
  const exited = new Promise<number | string | null>((resolve) => {
    const poll = setInterval(() => {
      try {
        process.kill(pid, 0);
      } catch {
        clearInterval(poll);
        resolve(null);
      }
    }, 50);
  });
  return { client, transport, pid, stderr: () => err, exited };
}

/** Peak resident memory (VmHWM, KiB) of a process. */
export function peakRssKiB(pid: number): number {
  const m = /VmHWM:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return Number(m?.[1] ?? NaN);
}

export interface HttpMcp {
  child: ChildProcess;
  url: string;
  output: () => string;
  close: () => Promise<void>;
}

/** `berth mcp --listen 127.0.0.1:0 ARGS` as its own process; resolves once it listens. */
export function httpMcp(rig: UpRig, args: string[] = []): Promise<HttpMcp> {
  const child = spawn(process.execPath, [BIN, "mcp", "--listen", "127.0.0.1:0", "--config", rig.config, ...args], { env: { ...process.env, BERTH_PG_URL: "" }, stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  child.stdout!.on("data", (d: Buffer) => (out += d.toString()));
  child.stderr!.on("data", (d: Buffer) => (out += d.toString()));
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`berth mcp --listen did not start:\n${out}`)), 30_000);
    const check = () => {
      const m = /listening on (http:\/\/\S+)/.exec(out);
      if (!m) return;
      clearTimeout(t);
      child.stderr!.off("data", check);
      resolve({ child, url: m[1]!, output: () => out, close: () => stopProcess({ child, output: () => out }, "SIGTERM") });
    };
    child.stderr!.on("data", check);
    child.once("exit", (code) => {
      clearTimeout(t);
      reject(new Error(`berth mcp --listen exited ${code}:\n${out}`));
    });
  });
}

export async function httpClient(url: string, token: string): Promise<{ client: Client; transport: StreamableHTTPClientTransport }> {
  const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers: { authorization: `Bearer ${token}` } } });
  const client = new Client({ name: "berth-test", version: "1" });
  await client.connect(transport);
  return { client, transport };
}
