/**
 * `berth up`: everything on one machine, no root needed. An embedded
 * coordinator (SQLite under the state directory), one `berth agent` child
 * process (gvisor where runsc and root are available, else the process
 * runtime), a `default` keeper pool (minReady 2) whose machines carry a
 * keeper key kept in the state directory, an admin token in a 0600 file,
 * and a client config so that `berth run --pool default -- CMD` works from
 * this directory.
 *
 * `berth up -- CMD` brings it all up, runs CMD on a borrowed machine, tears
 * everything down (machines destroyed, agent stopped) and exits with CMD's
 * status. Without a command it runs until interrupted, then tears down.
 * The agent runs in its own session, so a terminal's Ctrl-C reaches berth
 * alone; how it stops, and within what bound: up-stop.ts.
 */
import type { Command } from "commander";
import { Option } from "commander";
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdirSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { randomBytes } from "node:crypto";
import type { Coordinator } from "../../coordinator/server.js";
import type { Logger } from "pino";
import type { SqliteStore } from "../../store/sqlite/sqlite-store.js";
import { generateSshKeyPair } from "../../core/ssh-keys.js";
import { hashToken } from "../../core/tokens.js";
import { writeFileDurable } from "../../io/durable-file.js";
import { Api } from "../../client/http.js";
import { BerthClient } from "../../client/client.js";
import { describeError, EXIT, exitCodeOf, intArg, loadOrCreateSecret, reportError, UsageError } from "../common.js";
import { StateDirLock } from "../state-lock.js";
import { admitLocalOwner, releaseKeepingVolumes, unmountVolumeImages } from "../up-allocations.js";
import { agentStopMs, Interrupted, SIGNAL_EXIT, TEARDOWN_MS, UpSignals } from "../up-stop.js";
import { parseListen } from "./serve.js";
import { waitReady } from "./pool.js";
import { DEFAULT_WAIT_MS, runOnBorrowed } from "./run.js";
import { loadConfig } from "../../client/config.js";

interface UpOptions {
  stateDir: string;
  listen: string;
  runtime: "auto" | "process" | "gvisor";
  runsc?: string;
  runscPlatform: string;
  minReady: number;
  slots: number;
  quiet: boolean;
  portable: boolean;
}

function tokenFile(path: string, make: () => Promise<string>): Promise<string> {
  if (existsSync(path)) return Promise.resolve(readFileSync(path, "utf8").trim());
  return make().then((t) => {
    writeFileDurable(path, t + "\n", 0o600);
    return t;
  });
}

/**
 * The agent, in a session of its own (`detached`): a terminal's Ctrl-C or
 * hangup must reach berth alone, which stops the agent in order (up-stop.ts).
 * Its standard input is a pipe from berth: if berth dies without stopping it
 * (kill -9), the agent sees end of file and stops, releasing its directory.
 */
function startAgentProcess(o: UpOptions, dir: string, url: string, enrollToken: string, say: (s: string) => void): { child: ChildProcess; ready: Promise<string> } {
  const bin = process.argv[1]!;
  const child = spawn(
    process.execPath,
    [bin, "agent", "--state-dir", join(dir, "agent"), "--coordinator", url, "--runtime", o.runtime, ...(o.runsc !== undefined ? ["--runsc", resolve(o.runsc)] : []), "--runsc-platform", o.runscPlatform, "--slots", String(o.slots), "--name", "local", "--log-level", process.env.BERTH_LOG_LEVEL ?? "error", "--stop-on-stdin-eof"],
    { env: { ...process.env, BERTH_ENROLL_TOKEN: enrollToken }, stdio: ["pipe", "pipe", "pipe"], detached: true },
  );
  // Never written: its other end closes when berth ends, however it ends, and the agent then stops.
  child.stdin!.on("error", () => undefined);
  child.stderr!.on("data", (d: Buffer) => {
    if (!o.quiet) process.stderr.write(d);
  });
  const ready = new Promise<string>((resolveReady, reject) => {
    let buf = "";
    const onData = (d: Buffer) => {
      buf += d.toString();
      const line = buf.split("\n").find((l) => l.startsWith("berth agent ready"));
      if (line) {
        child.stdout!.off("data", onData);
        say(line.replace(/^berth /, ""));
        if (line.includes("runtime=process")) say("runtime: process — plain child processes, NO isolation (install runsc and run as root for gvisor)");
        resolveReady(line);
      }
    };
    child.stdout!.on("data", onData);
    child.once("exit", (code) => reject(new Error(`the agent exited with status ${code} before it was ready (see its messages above)`)));
  });
  return { child, ready };
}

interface Running {
  dir: string;
  o: UpOptions;
  store: SqliteStore;
  coord: Coordinator | null;
  api: Api | null;
  agent: ChildProcess | null;
  /** The agent's runtime, from its ready line (null: it never said). */
  runtime: "gvisor" | "process" | null;
  /** Pools ensured so far, drained in reverse order at the end. */
  pools: string[];
}

/** Steps 2–4 of up-stop.ts: drain (bounded, forcible), stop the agent, destroy what is left. */
async function teardown(r: Running, signals: UpSignals, say: (s: string) => void): Promise<void> {
  signals.beginStop();
  const alive = (c: ChildProcess | null): c is ChildProcess => c !== null && c.exitCode === null && c.signalCode === null;
  // One bound for the whole stop: allocations released (volumes kept), then the pools' machines destroyed.
  const deadline = Date.now() + TEARDOWN_MS;
  if (r.api && alive(r.agent)) {
    say(`stopping: releasing allocations (volumes kept) and destroying the machines of ${r.pools.join(", ") || "no pool"} (up to ${TEARDOWN_MS / 1000} s; Ctrl-C again to force)`);
    await releaseKeepingVolumes(r.api, deadline, signals.force, say).catch((e: unknown) => say(`could not release the allocations: ${describeError(e)}`));
  }
  if (r.api && alive(r.agent) && r.pools.length > 0) {
    for (const name of r.pools) {
      if (signals.force.aborted) break;
      await drainAndWait(r.api, name, deadline, signals.force, say);
    }
  }
  if (alive(r.agent)) await stopAgent(r.agent, say);
  await destroyLeftovers(r, say);
  for (const failure of await unmountVolumeImages(join(r.dir, "agent"))) say(failure);
  await r.api?.close();
  await r.coord?.stop();
  await r.store.close();
}

async function stopAgent(agent: ChildProcess, say: (s: string) => void): Promise<void> {
  const exited = new Promise((res) => agent.once("exit", res));
  agent.kill("SIGTERM");
  const ms = agentStopMs();
  const t = setTimeout(() => {
    say(`the agent did not stop within ${ms / 1000} s; killing it`);
    agent.kill("SIGKILL");
  }, ms);
  await exited;
  clearTimeout(t);
}

/** Step 4: machines the agent did not destroy (a forced stop, an agent that died) are destroyed here, by the same runtime code. */
async function destroyLeftovers(r: Running, say: (s: string) => void): Promise<void> {
  const agentDir = join(r.dir, "agent");
  if (!existsSync(join(agentDir, "machines"))) return;
  try {
    const { createRuntime } = await import("../../agent/runtime/index.js");
    const runtime = createRuntime(r.runtime ?? r.o.runtime, agentDir, { ...(r.o.runsc !== undefined ? { runsc: resolve(r.o.runsc) } : {}), platform: r.o.runscPlatform as "auto" });
    const left = await runtime.list();
    if (left.length === 0) return;
    say(`destroying ${left.length} machine(s) the agent left running`);
    for (const id of left) {
      await runtime.destroy(id).catch((e: unknown) => say(`could not destroy ${id}: ${describeError(e)}`));
    }
  } catch (e) {
    say(`could not check for machines left running: ${describeError(e)}`);
  }
}

async function drainAndWait(api: Api, name: string, deadline: number, force: AbortSignal, say: (s: string) => void): Promise<void> {
  try {
    const r = await api.send("POST /v1/pools/{pool}/drain", { pool: name }, { force: true });
    say(`draining pool ${name} (${r.remaining} machine(s))`);
    for (;;) {
      const p = await api.send("GET /v1/pools/{pool}", { pool: name });
      const live = Object.entries(p.states ?? {}).filter(([s]) => s !== "destroyed").reduce((n, [, k]) => n + k, 0);
      if (live === 0) break;
      if (force.aborted) return;
      if (Date.now() > deadline) {
        say(`${live} machine(s) of pool ${name} not destroyed within ${TEARDOWN_MS / 1000} s; stopping the agent and destroying them directly`);
        break;
      }
      // One listener at a time: each wait removes its own (a listener per poll would pile up on the signal).
      await new Promise<void>((res) => {
        const onAbort = () => {
          clearTimeout(t);
          res();
        };
        const t = setTimeout(() => {
          force.removeEventListener("abort", onAbort);
          res();
        }, 100);
        force.addEventListener("abort", onAbort, { once: true });
      });
    }
  } catch (e) {
    say(`teardown: ${describeError(e)}`);
  }
}

export function register(program: Command): void {
  program
    .command("up")
    .description("Run everything on this machine: coordinator (SQLite), one agent, a default pool; optionally run one command")
    .option("--state-dir <dir>", "where everything is kept", ".berth")
    .option("--listen <host:port>", "coordinator address", "127.0.0.1:7420")
    .addOption(new Option("--runtime <kind>", "sandbox runtime for the agent").choices(["auto", "process", "gvisor"]).default("auto"))
    .option("--runsc <path>", "the agent's runsc binary (gvisor; default: runsc on PATH)")
    .addOption(new Option("--runsc-platform <platform>", "gVisor platform (auto: the fastest available)").choices(["auto", "kvm", "systrap", "ptrace"]).default("auto"))
    .option("--min-ready <n>", "ready machines the default pool keeps", intArg("--min-ready", 0, 64), 2)
    .option("--slots <n>", "machines the local agent offers", intArg("--slots", 1, 256), 4)
    .option("--portable", "also enable portable access and a portable pool `agents` (per-borrow keys, two-phase ack); `-- CMD` then runs there", false)
    .option("-q, --quiet", "print only the command's output", false)
    .argument("[command...]", "run this on a borrowed machine, then tear down (after --)")
    .addHelpText(
      "after",
      `
Examples:
  berth up -- echo hello from a borrowed machine
  berth up                 # then, from the same directory: berth run --pool default -- uname -a
  berth up --portable      # then: berth run --pool agents --pool-access portable -- uname -a

The process runtime (used without root or runsc) gives NO isolation; gvisor does.`,
    )
    .action(runUp);
}

/**
 * `berth up`: refused at once if --portable would find no slot; signal
 * handling before anything starts; the state directory's lock; then the
 * coordinator (step 1), the agent and the pools (step 2), the command or a
 * wait for a signal (step 3); the teardown on every way out.
 */
async function runUp(argv: string[], o: UpOptions): Promise<void> {
  const say = (s: string) => {
    if (!o.quiet) process.stderr.write(`berth: ${s}\n`);
  };
  const dir = resolve(o.stateDir);
  // The portable pool needs a slot of the one local host: a default pool whose min-ready takes
  // every slot would leave it waiting for one that never frees. Said now, before anything starts.
  if (o.portable && o.minReady >= o.slots) {
    reportError(
      new UsageError(
        `--portable needs a host slot for the portable pool: --min-ready ${o.minReady} on ${o.slots} slots leaves none (the default pool keeps them all); use --min-ready ${o.slots - 1} or less, or --slots ${o.minReady + 1}`,
      ),
    );
    process.exitCode = EXIT.usage;
    return;
  }
  // Before anything is started: no signal may kill berth and leave its children running.
  const signals = new UpSignals(say);
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  // Before the database is opened or any file written: a second berth up here refuses,
  // and can neither drain this one's pools nor point client.json elsewhere.
  let lock: StateDirLock;
  try {
    lock = StateDirLock.take(dir, "berth up");
  } catch (e) {
    signals.dispose();
    reportError(e);
    process.exitCode = exitCodeOf(e);
    return;
  }
  // The server side is loaded only by the command that runs it.
  const [{ createToken, readApiToken }, { SqliteStore }, { default: pino }] = await Promise.all([
    import("../../store/api-tokens.js"),
    import("../../store/sqlite/sqlite-store.js"),
    import("pino"),
  ]);
  const r: Running = { dir, o, store: new SqliteStore({ path: join(dir, "berth.db") }), coord: null, api: null, agent: null, runtime: null, pools: [] };
  // The admin's token and the agent's enroll token, made in this state directory's store.
  const mint = async (role: "admin" | "agent", label: string) => (await createToken(r.store, { org: "local", role, expiresAt: null, label }, Date.now(), (n) => randomBytes(n))).token;
  let status: number = EXIT.ok;
  try {
    const { coord, admin, enroll, keeperKey } = await upCoordinator(r, lock, say, mint, () => pino({ level: process.env.BERTH_LOG_LEVEL ?? "warn" }));
    const api = (r.api = new Api(coord.url, admin));
    await upAgentAndPools(r, api, signals, coord.url, enroll, keeperKey, say);
    // The admin token is the local owner of allocations (up-allocations.ts).
    const adminId = (await readApiToken(r.store, hashToken("api", admin)))?.id;
    if (adminId && (await signals.interruptible(admitLocalOwner(api, adminId))) === "admitted") say("admitted the admin token as the owner of allocations, with everything the host offers as its budget");
    status = await runOrWait(argv, r, coord, signals);
  } catch (e) {
    if (e instanceof Interrupted) {
      say(`${e.signal} while starting: stopping`);
      status = SIGNAL_EXIT[e.signal];
    } else {
      reportError(e);
      status = exitCodeOf(e);
    }
  } finally {
    await teardown(r, signals, say);
    signals.dispose();
    lock.release();
  }
  process.exitCode = status;
}

/** Step 1: the coordinator on the state directory's SQLite, its tokens, the keeper key and client.json. */
async function upCoordinator(r: Running, lock: StateDirLock, say: (s: string) => void, mint: (role: "admin" | "agent", label: string) => Promise<string>, newLog: () => Logger) {
  const { o } = r;
  const secret = loadOrCreateSecret(join(r.dir, "coordinator.secret"));
  const { host, port } = parseListen(o.listen);
  // Loaded only here: every other command starts without the coordinator.
  const { startCoordinator } = await import("../../coordinator/server.js");
  const coord = (r.coord = await startCoordinator({ store: r.store, secret, host, port, config: { portable: o.portable }, log: newLog() }));
  say(`coordinator on ${coord.url} (SQLite ${join(r.dir, "berth.db")})`);
  lock.setUrl(coord.url);
  const admin = await tokenFile(join(r.dir, "admin.token"), () => mint("admin", "berth up admin"));
  const enroll = await tokenFile(join(r.dir, "agent.token"), () => mint("agent", "berth up agent"));
  const keeperKey = join(r.dir, "keeper_ed25519");
  if (!existsSync(keeperKey)) {
    const pair = generateSshKeyPair("berth-keeper");
    writeFileDurable(keeperKey, pair.privateKey, 0o600);
    writeFileDurable(`${keeperKey}.pub`, pair.publicKey + "\n", 0o644);
  }
  writeFileDurable(join(r.dir, "client.json"), JSON.stringify({ url: coord.url, tokenFile: "admin.token", keeperKeyFile: "keeper_ed25519", pool: "default" }, null, 2) + "\n", 0o600);
  return { coord, admin, enroll, keeperKey };
}

/** Step 2: the agent process (up to its ready line), the default keeper pool, and with --portable the portable pool `agents`. */
async function upAgentAndPools(r: Running, api: Api, signals: UpSignals, url: string, enroll: string, keeperKey: string, say: (s: string) => void): Promise<void> {
  const started = startAgentProcess(r.o, r.dir, url, enroll, say);
  r.agent = started.child;
  const line = await signals.interruptible(started.ready);
  r.runtime = line.includes("runtime=gvisor") ? "gvisor" : "process";
  r.pools.unshift("default");
  await signals.interruptible(
    api.send("POST /v1/pools/{pool}/ensure", { pool: "default" }, {
      minReady: r.o.minReady,
      // With --portable, one slot stays for the portable pool.
      maxReady: Math.max(r.o.minReady, Math.min(r.o.portable ? r.o.slots - 1 : r.o.slots, r.o.minReady * 2)),
      compatibilityKey: "local",
      access: "keeper",
      provider: "hosts",
      keeperKey: readFileSync(`${keeperKey}.pub`, "utf8").trim(),
    }),
  );
  await signals.interruptible(waitReady(api, "default", Math.min(1, r.o.minReady), 120_000, say));
  if (r.o.portable) {
    // A second pool for portable access: each borrow brings its own key; nothing is shared with the keeper pool.
    r.pools.unshift("agents");
    await signals.interruptible(api.send("POST /v1/pools/{pool}/ensure", { pool: "agents" }, { minReady: 1, maxReady: 2, compatibilityKey: "local", access: "portable", provider: "hosts" }));
    await signals.interruptible(waitReady(api, "agents", 1, 120_000, say));
  }
}

/** Step 3: the command on a borrowed machine (its exit status), or the addresses printed and a wait for a signal. */
async function runOrWait(argv: string[], r: Running, coord: Coordinator, signals: UpSignals): Promise<number> {
  const { o } = r;
  if (argv.length > 0) {
    const config = loadConfig({ config: join(r.dir, "client.json") });
    const target = o.portable ? { pool: "agents", access: "portable" as const } : { pool: "default", access: "keeper" as const };
    const client = new BerthClient({ url: config.url, token: config.token, keeperKeyFile: config.keeperKeyFile });
    try {
      return await signals.delegate(() => runOnBorrowed(client, config, argv, { ...target, drain: false, quiet: o.quiet, stdin: "auto", waitMs: DEFAULT_WAIT_MS }));
    } finally {
      await client.close();
    }
  } else {
    process.stdout.write(
      `berth is up.\n  coordinator  ${coord.url}\n  dashboard    ${coord.url}/ui (sign in with the admin token)\n  admin token  ${join(r.dir, "admin.token")} (0600)\n  client conf  ${join(r.dir, "client.json")}\n\nNext, from this directory:\n  berth pool show default\n  berth run --pool default -- uname -a\n  berth alloc create --size small --wait\nCtrl-C stops berth: machines destroyed, allocations released with their volumes kept.\n`,
    );
    await signals.waitForSignal();
    return EXIT.ok;
  }
}
