/**
 * The shared agent test harness: real agents, real gateways, real runtimes,
 * each in its own temp state directory, all released by one `close()`.
 *
 *   const h = new AgentHarness("berth-ops-");
 *   after(() => h.close());
 *   const a = await h.agent();                          // startAgent in this process (process runtime)
 *   const p = h.spawnAgent({ stateDir: h.dir() });      // `bin/berth agent` as a child (SIGKILL-able)
 *   const g = await h.gateway("gvisor", "m_x");         // runtime + one machine + SSH gateway + a borrow key
 *   const c = await h.enroller();                       // the enroll route of a coordinator from before host identity
 *
 * Against a real coordinator (test/helpers/cluster.ts, serve.ts) a fresh
 * agent enrolls straight into host identity mode; the small enroller plays a
 * coordinator that does not offer it, so agents enroll on the shared token.
 *
 * close() stops in-process agents and gateways, destroys the machines the
 * harness created, kills child agents still running and removes every temp
 * directory. Nothing here fakes berth's own code: the only stand-in is the
 * coordinator's enroll route (the outermost boundary of an agent).
 */
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import type ssh2 from "ssh2";
import { startAgent, type AgentOptions, type RunningAgent } from "../../src/agent/agent.js";
import { createRuntime } from "../../src/agent/runtime/index.js";
import type { CreateOptions, Runtime, RuntimeKind } from "../../src/agent/runtime/types.js";
import { memorySessionStore, type SessionStore } from "../../src/agent/sessions/store.js";
import type { Log, SessionTiming } from "../../src/agent/sessions/types.js";
import { startGateway, type Gateway } from "../../src/agent/ssh/gateway.js";
import { generateSshKeyPair, type SshKeyPair } from "../../src/core/ssh-keys.js";
import { newToken } from "../../src/core/tokens.js";
import { MemoryKeys, connect } from "./ssh-testkit.js";

export const BERTH_BIN = resolve("bin/berth");

export const quietLog = { info() {}, warn() {}, error() {} };

/** A fresh OpenSSH key pair plus its public line in the shape operations take. */
export function sshKey(comment = "test"): SshKeyPair & { line: string } {
  const pair = generateSshKeyPair(comment);
  return { ...pair, line: pair.publicKey };
}

/** Polls `cond` until true; throws naming `what` after `ms` (a hang guard, not a timing check). */
export async function until(cond: () => boolean | Promise<boolean>, what: string, ms = 30_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** A `bin/berth agent` child process. */
export interface SpawnedAgent {
  child: ChildProcess;
  /** Resolves with the agent's API URL and ready line; rejects with the exit and stderr if it exits first. */
  ready: Promise<{ url: string; line: string }>;
  exit: Promise<{ code: number | null; signal: NodeJS.Signals | null; stderr: string }>;
}

export interface SpawnAgentOptions {
  stateDir: string;
  runtime?: RuntimeKind;
  coordinator?: string;
  enrollTokenFile?: string;
  name?: string;
  logLevel?: "debug" | "info" | "warn" | "error";
  /** More `berth agent` flags, e.g. ["--vcpu", "8", "--memory-mb", "16384"]. */
  extraArgs?: string[];
}

/** One machine on a real runtime behind a real gateway, with a borrow key installed for it. */
export interface GatewayRig {
  runtime: Runtime;
  gw: Gateway;
  keys: MemoryKeys;
  store: SessionStore;
  machine: string;
  /** The rig's own temp directory (runtime state under rt/, the host key file). */
  dir: string;
  /** The gateway's host key file. */
  hostKeyPath: string;
  /** The installed borrow key. */
  pair: SshKeyPair;
  /** A connected ssh2 client as the borrower (ended by close()). */
  client(): Promise<ssh2.Client>;
  /** Ends clients, closes the gateway, destroys the machine (idempotent). */
  close(): Promise<void>;
}

export interface GatewayRigOptions {
  /** Clock for key expiry; default Date.now. */
  now?: () => number;
  timing?: Partial<SessionTiming>;
  /** Session records; default an in-memory store. */
  store?: SessionStore;
  /** Install a borrow key for the machine (default true). */
  borrowKey?: boolean;
  /** How the machine is created (what a provision passes the runtime). */
  create?: CreateOptions;
  /** The gateway's log; default quiet. */
  log?: Log;
}

/** What the enroll route saw and what it answered. */
export interface Enroller {
  url: string;
  /** The raw enroll token it accepts. */
  token: string;
  /** Every request: its Authorization header and JSON body. */
  requests: Array<{ auth: string | undefined; body: any }>; // eslint-disable-line @typescript-eslint/no-explicit-any -- bodies are asserted field by field
  /** Every successful enrollment: the body and what was answered. */
  issued: Array<{ body: any; hostId: string; hostCallToken: string }>; // eslint-disable-line @typescript-eslint/no-explicit-any -- as above
  /** How to answer an accepted request; default host id "h_<name>" and a fresh host-call token. */
  answer: (body: { name?: string }) => { hostId: string; hostCallToken: string };
}

export class AgentHarness {
  private readonly prefix: string;
  private readonly dirs: string[] = [];
  private readonly agents: RunningAgent[] = [];
  private readonly children = new Set<ChildProcess>();
  private readonly rigs: GatewayRig[] = [];
  private readonly servers: Server[] = [];

  constructor(prefix = "berth-agent-test-") {
    this.prefix = prefix;
  }

  /** A fresh temp directory, removed by close(). */
  dir(): string {
    const d = mkdtempSync(join(tmpdir(), this.prefix));
    this.dirs.push(d);
    return d;
  }

  /** startAgent in this process: a temp state dir and the process runtime unless given; stopped by close(). */
  async agent(opts: Partial<AgentOptions> = {}): Promise<RunningAgent> {
    const a = await startAgent({ runtime: "process", ...opts, stateDir: opts.stateDir ?? this.dir() });
    this.agents.push(a);
    return a;
  }

  /** `bin/berth agent` as a child process (so a test can SIGKILL it); killed by close() if still running. */
  spawnAgent(o: SpawnAgentOptions): SpawnedAgent {
    const args = [BERTH_BIN, "agent", "--state-dir", o.stateDir, "--runtime", o.runtime ?? "process", "--log-level", o.logLevel ?? "warn"];
    if (o.coordinator) args.push("--coordinator", o.coordinator);
    if (o.enrollTokenFile) args.push("--enroll-token-file", o.enrollTokenFile);
    if (o.name) args.push("--name", o.name);
    if (o.extraArgs) args.push(...o.extraArgs);
    const child = spawn(process.execPath, args, { stdio: ["ignore", "pipe", "pipe"] });
    this.children.add(child);
    let stdout = "";
    let stderr = "";
    child.stderr!.on("data", (b: Buffer) => (stderr += b.toString()));
    const exit = new Promise<{ code: number | null; signal: NodeJS.Signals | null; stderr: string }>((res) =>
      child.once("exit", (code, signal) => res({ code, signal, stderr })),
    );
    const ready = new Promise<{ url: string; line: string }>((res, rej) => {
      child.stdout!.on("data", (b: Buffer) => {
        stdout += b.toString();
        const line = stdout.split("\n").find((l) => /^berth agent ready api=\S+/.test(l));
        if (line) res({ url: /api=(\S+)/.exec(line)![1]!, line });
      });
      void exit.then((e) => rej(new Error(`agent exited (${e.code ?? e.signal}) before ready: ${e.stderr}`)));
    });
    ready.catch(() => undefined);
    return { child, ready, exit };
  }

  /** A runtime of `kind` in a temp dir, machine `machine` created on it, a gateway in front, a borrow key installed. */
  async gateway(kind: RuntimeKind, machine: string, o: GatewayRigOptions = {}): Promise<GatewayRig> {
    const dir = this.dir();
    const runtime = createRuntime(kind, join(dir, "rt"));
    await runtime.create(machine, o.create);
    const keys = new MemoryKeys();
    const store = o.store ?? memorySessionStore();
    const hostKeyPath = join(dir, "host_key");
    const gw = await startGateway({
      hostKeyPath,
      listen: { host: "127.0.0.1", port: 0 },
      keys,
      runtime,
      log: o.log ?? quietLog,
      sessionStore: store,
      ...(o.now ? { now: o.now } : {}),
      ...(o.timing ? { timing: o.timing } : {}),
    });
    const pair = generateSshKeyPair("borrower");
    if (o.borrowKey ?? true) keys.install({ machineId: machine, fingerprint: pair.fingerprint, grantId: "g_test", expiresAt: null });
    const clients: ssh2.Client[] = [];
    let closed: Promise<void> | null = null;
    const rig: GatewayRig = {
      runtime,
      gw,
      keys,
      store,
      machine,
      dir,
      hostKeyPath,
      pair,
      async client() {
        const c = await connect({ port: gw.port, username: machine, privateKey: pair.privateKey, hostKey: gw.hostKey });
        c.on("error", () => {});
        clients.push(c);
        return c;
      },
      close() {
        closed ??= (async () => {
          for (const c of clients) c.end();
          await gw.close();
          await runtime.destroy(machine);
        })();
        return closed;
      },
    };
    this.rigs.push(rig);
    return rig;
  }

  /** A small real HTTP server playing the coordinator's `POST /v1/hosts/enroll`; closed by close(). */
  async enroller(): Promise<Enroller> {
    const e: Enroller = {
      url: "",
      token: newToken("enroll", randomBytes),
      requests: [],
      issued: [],
      answer: (body) => ({ hostId: `h_${body.name ?? "host"}`, hostCallToken: newToken("host-call", randomBytes) }),
    };
    const server = createServer((req, res) => {
      let text = "";
      req.on("data", (c: Buffer) => (text += c.toString()));
      req.on("end", () => {
        let body: unknown = null;
        try {
          body = JSON.parse(text);
        } catch {
          /* recorded as null */
        }
        e.requests.push({ auth: req.headers.authorization, body });
        // A coordinator from before host identity: no challenge route, so agents enroll on the shared token.
        if (req.url !== "/v1/hosts/enroll") {
          res.writeHead(404, { "content-type": "application/json" });
          res.end(JSON.stringify({ error: { code: "not_found", message: "not_found: no such route" } }));
          return;
        }
        if (req.method !== "POST" || req.headers.authorization !== `Bearer ${e.token}`) {
          res.writeHead(401, { "content-type": "application/json" });
          res.end(JSON.stringify({ error: { code: "unauthorized", message: "unauthorized: bad enroll token" } }));
          return;
        }
        const a = e.answer((body ?? {}) as { name?: string });
        e.issued.push({ body, ...a });
        res.writeHead(200, { "content-type": "application/json" });
        res.end(JSON.stringify(a));
      });
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    this.servers.push(server);
    e.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    return e;
  }

  /** Releases everything this harness started, in reverse dependency order; never throws on one failure. */
  async close(): Promise<void> {
    const errors: unknown[] = [];
    const attempt = async (f: () => Promise<unknown> | unknown) => {
      try {
        await f();
      } catch (e) {
        errors.push(e);
      }
    };
    for (const r of this.rigs) await attempt(() => r.close());
    for (const a of this.agents) await attempt(() => a.stop());
    for (const c of this.children) {
      if (c.exitCode === null && c.signalCode === null) {
        const gone = new Promise((r) => c.once("exit", r));
        c.kill("SIGKILL");
        await gone;
      }
    }
    for (const s of this.servers) await attempt(() => new Promise<void>((r) => s.close(() => r())));
    // Volume disk images stay mounted after their agent ends (kept volumes; a test that stopped before a release):
    // unmount what is mounted under our directories, deepest first, before removing them.
    const mounts = readFileSync("/proc/self/mounts", "utf8").split("\n").map((l) => l.split(" ")[1] ?? "");
    const ours = mounts.filter((m) => this.dirs.some((d) => m.startsWith(d + "/")));
    for (const m of ours.sort().reverse()) spawnSync("umount", [m]);
    for (const d of this.dirs) rmSync(d, { recursive: true, force: true });
    if (errors.length > 0) throw errors[0];
  }
}
