/**
 * Chaos run (by hand, not CI): three `berth serve --portable` on one
 * PostgreSQL schema, two `berth agent` (process runtime), a keeper pool and a
 * portable pool on the hosts provider, 32 clients (even ones on the keeper
 * pool, odd ones on the portable pool: per-borrow key, ack) borrowing,
 * running a command over SSH, and returning, while
 * coordinators and agents are SIGKILLed and restarted at random. After a
 * settle period (no more kills; the pool is drained) it prints and writes:
 *
 *   cycles completed (and of them portable), double grants (0), returned
 *   machines not fenced (0), leaked sandboxes / processes (0), cleanup
 *   obligations left (0), clients still busy 60 s after told to stop (0).
 *
 *   BERTH_PG_URL=postgres://postgres:berth@127.0.0.1:5432/berth_test \
 *     node dist/bench/chaos/run.js --minutes 10 [--clients 32] [--seed N]
 *
 * Everything listens on loopback; every loop is bounded in count and time.
 */
import { spawn, execFileSync, type ChildProcess } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, readlinkSync, rmSync, writeFileSync, existsSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { randomBytes } from "node:crypto";
import { PostgresStore } from "../../src/store/postgres/postgres-store.js";
import { Api, ApiError } from "../../src/cli/api.js";
import { connect, execStreaming } from "../../src/cli/ssh-client.js";
import { Writable } from "node:stream";
import { generateSshKeyPair } from "../../src/core/ssh-keys.js";

const BIN = resolve("bin/berth");
const args = process.argv.slice(2);
const flag = (name: string, dflt: number): number => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? Number(args[i + 1]) : dflt;
};
const MINUTES = flag("minutes", 10);
const CLIENTS = flag("clients", 32);
const SEED = flag("seed", Date.now() % 100000);
const PG_URL = process.env.BERTH_PG_URL ?? "postgres://postgres:berth@127.0.0.1:5432/berth_test";

let rnd = SEED >>> 0;
function random(): number {
  rnd = (rnd + 0x6d2b79f5) >>> 0;
  let t = rnd;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function freePort(): Promise<number> {
  return new Promise((res) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => {
      const p = (s.address() as { port: number }).port;
      s.close(() => res(p));
    });
  });
}

function berth(argv: string[], env: NodeJS.ProcessEnv): string {
  return execFileSync(process.execPath, [BIN, ...argv], { env: { ...process.env, ...env }, encoding: "utf8" });
}

interface Proc {
  name: string;
  child: ChildProcess | null;
  start(): Promise<void>;
  kills: number;
}

function spawnUntil(argv: string[], env: NodeJS.ProcessEnv, ready: RegExp, log: string): Promise<ChildProcess> {
  const child = spawn(process.execPath, [BIN, ...argv], { env: { ...process.env, BERTH_LOG_LEVEL: "warn", ...env }, stdio: ["ignore", "pipe", "pipe"] });
  child.stderr!.on("data", (d: Buffer) => writeFileSync(log, d, { flag: "a" }));
  return new Promise((res, rej) => {
    let buf = "";
    const t = setTimeout(() => rej(new Error(`${argv[0]} did not get ready in 30 s`)), 30_000);
    child.stdout!.on("data", (d: Buffer) => {
      buf += d.toString();
      if (ready.test(buf)) {
        clearTimeout(t);
        res(child);
      }
    });
    child.once("exit", (code) => {
      clearTimeout(t);
      rej(new Error(`${argv[0]} exited (${code}) before it was ready`));
    });
  });
}

async function main(): Promise<void> {
  const root = mkdtempSync(join(tmpdir(), "berth-chaos-"));
  const schema = "chaos_" + randomBytes(4).toString("hex");
  const env = { BERTH_PG_URL: PG_URL, BERTH_PG_SCHEMA: schema };
  const secretFile = join(root, "coordinator.secret");
  console.log(`chaos: ${MINUTES} min, ${CLIENTS} clients, seed ${SEED}, schema ${schema}, dir ${root}`);

  // Tokens and the keeper key, made against the store directly (as an operator would).
  const store = await PostgresStore.open({ connectionString: PG_URL, schema });
  const tok = (role: string) => berth(["token", "create", "--org", "acme", "--role", role, "--out", join(root, `${role}.token`)], env) && readFileSync(join(root, `${role}.token`), "utf8").trim();
  const admin = tok("admin");
  const member = tok("member");
  // One enroll token file per agent: an agent that enrolls with its identity
  // key removes the file it was given (docs/host-identity.md).
  const agentToken = tok("agent");
  for (let i = 0; i < 2; i++) writeFileSync(join(root, `agent${i}.token`), agentToken + "\n", { mode: 0o600 });
  execFileSync("ssh-keygen", ["-q", "-t", "ed25519", "-N", "", "-f", join(root, "keeper"), "-C", "chaos-keeper"]);
  const keeperPrivate = readFileSync(join(root, "keeper"), "utf8");

  const coordPorts = [await freePort(), await freePort(), await freePort()];
  const urls = coordPorts.map((p) => `http://127.0.0.1:${p}`);
  const procs: Proc[] = [];
  for (let i = 0; i < 3; i++) {
    const dir = join(root, `coord${i}`);
    mkdirSync(dir);
    const p: Proc = {
      name: `coordinator ${i}`,
      child: null,
      kills: 0,
      async start() {
        p.child = await spawnUntil(["serve", "--portable", "--state-dir", dir, "--listen", `127.0.0.1:${coordPorts[i]}`, "--secret-file", secretFile], env, /listening on/, join(root, `coord${i}.log`));
      },
    };
    procs.push(p);
  }
  // Whatever happens to this run, the processes it started do not outlive it.
  process.on("exit", () => {
    for (const p of procs) if (p.child && p.child.exitCode === null) p.child.kill("SIGKILL");
  });
  for (const p of procs) await p.start();
  for (let i = 0; i < 2; i++) {
    const dir = join(root, `agent${i}`);
    const api = await freePort();
    const ssh = await freePort();
    const p: Proc = {
      name: `agent ${i}`,
      child: null,
      kills: 0,
      async start() {
        // Enrolls through any live coordinator.
        for (let attempt = 0; attempt < 10; attempt++) {
          const url = urls[(attempt + i) % urls.length]!;
          try {
            p.child = await spawnUntil(
              ["agent", "--state-dir", dir, "--coordinator", url, "--enroll-token-file", join(root, `agent${i}.token`), "--listen", `127.0.0.1:${api}`, "--ssh-listen", `127.0.0.1:${ssh}`, "--runtime", "process", "--slots", "6", "--name", `host${i}`],
              {},
              /berth agent ready/,
              join(root, `agent${i}.log`),
            );
            return;
          } catch (e) {
            if (attempt === 9) throw e;
            await sleep(500);
          }
        }
      },
    };
    procs.push(p);
    await p.start();
  }

  const adminApi = new Api(urls[0]!, admin);
  await adminApi.call("POST", "/v1/pools/chaos/ensure", {
    minReady: 8, maxReady: 12, compatibilityKey: "chaos", provider: "hosts", heartbeatMs: 15_000, keeperKey: readFileSync(join(root, "keeper.pub"), "utf8").trim(),
  });
  await adminApi.call("POST", "/v1/pools/chaosp/ensure", { minReady: 4, maxReady: 6, compatibilityKey: "chaos", provider: "hosts", heartbeatMs: 15_000, access: "portable" });

  // ---- clients ----
  const apis = urls.map((u) => new Api(u, member, { connections: 16 }));
  const holder = new Map<string, number>();
  const stats = { cycles: 0, portableCycles: 0, sshRuns: 0, sshFailures: 0, exhausted: 0, errors: 0, doubleGrants: 0, coordinatorUnavailable: 0 };
  const errorsSeen = new Map<string, number>();
  let stopClients = false;
  const sink = new Writable({ write: (_c, _e, cb) => cb() });

  async function call<T>(f: (api: Api) => Promise<T>): Promise<T> {
    // Any live coordinator will do; a killed one answers with a connection error.
    for (let attempt = 0; ; attempt++) {
      const api = apis[Math.floor(random() * apis.length)]!;
      try {
        return await f(api);
      } catch (e) {
        if (e instanceof ApiError || attempt >= 20) throw e;
        stats.coordinatorUnavailable++;
        await sleep(100);
      }
    }
  }

  type Borrowed = { borrowId: string; borrowToken: string; grantToken?: string; privateKey: string; machine: { id: string; generation: number; ssh: { host: string; port: number; user: string; hostKey: string } } };
  /** Portable: borrow with a fresh per-borrow key, then ack (the agent installs the key); a failed ack returns the borrow. */
  async function borrowPortable(): Promise<Borrowed> {
    const pair = generateSshKeyPair("chaos-borrow");
    const r = await call<Omit<Borrowed, "privateKey">>((a) => a.call("POST", "/v1/pools/chaosp/borrow", { access: "portable", publicKey: pair.publicKey }));
    try {
      const a = await call<{ state: string; machine: Borrowed["machine"] }>((api) => api.call("POST", `/v1/borrows/${r.borrowId}/ack`, { token: r.borrowToken, grantToken: r.grantToken, publicKey: pair.publicKey }));
      if (a.state !== "active") throw new Error(`ack left the borrow ${a.state}`);
      return { ...r, machine: a.machine, privateKey: pair.privateKey };
    } catch (e) {
      await call((api) => api.call("POST", `/v1/borrows/${r.borrowId}/return`, { token: r.borrowToken, grantToken: r.grantToken })).catch(() => undefined);
      throw e;
    }
  }

  const doing: string[] = Array.from({ length: CLIENTS }, () => "idle");
  async function client(n: number): Promise<void> {
    while (!stopClients) {
      doing[n] = "borrow";
      let b: Borrowed;
      const portable = n % 2 === 1;
      try {
        b = portable ? await borrowPortable() : { ...(await call<Borrowed>((a) => a.call("POST", "/v1/pools/chaos/borrow", {}))), privateKey: keeperPrivate };
      } catch (e) {
        if (e instanceof ApiError && e.code === "pool_exhausted") stats.exhausted++;
        else {
          stats.errors++;
          const k = e instanceof ApiError ? e.code : String((e as Error).message).slice(0, 60);
          errorsSeen.set(k, (errorsSeen.get(k) ?? 0) + 1);
        }
        await sleep(100 + random() * 300);
        continue;
      }
      const other = holder.get(b.machine.id);
      if (other !== undefined) {
        stats.doubleGrants++;
        console.error(`DOUBLE GRANT: machine ${b.machine.id} lent to client ${n} while client ${other} holds it`);
      }
      holder.set(b.machine.id, n);
      doing[n] = "use";
      try {
        if (random() < 0.5) {
          try {
            const c = await connect({ host: b.machine.ssh.host, port: b.machine.ssh.port, user: b.machine.ssh.user, hostKey: b.machine.ssh.hostKey, privateKey: b.privateKey }, 5_000);
            try {
              const r = await Promise.race([execStreaming(c, "echo chaos", { stdout: sink, stderr: sink }), sleep(10_000).then(() => null)]);
              if (r && r.code === 0) stats.sshRuns++;
              else stats.sshFailures++;
            } finally {
              c.end();
            }
          } catch {
            stats.sshFailures++;
          }
        } else await sleep(random() * 500);
      } finally {
        if (holder.get(b.machine.id) === n) holder.delete(b.machine.id);
      }
      doing[n] = "return";
      try {
        await call((a) => a.call("POST", `/v1/borrows/${b.borrowId}/return`, { token: b.borrowToken, ...(b.grantToken ? { grantToken: b.grantToken } : {}) }));
        stats.cycles++;
        if (portable) stats.portableCycles++;
      } catch (e) {
        stats.errors++;
        const k = e instanceof ApiError ? e.code : String((e as Error).message).slice(0, 60);
        errorsSeen.set(`return:${k}`, (errorsSeen.get(`return:${k}`) ?? 0) + 1);
      }
    }
    doing[n] = "done";
  }

  // ---- chaos ----
  let stopChaos = false;
  const kills: string[] = [];
  async function chaos(): Promise<void> {
    while (!stopChaos) {
      await sleep(3_000 + random() * 9_000);
      if (stopChaos) break;
      const p = procs[Math.floor(random() * procs.length)]!;
      const liveCoords = procs.slice(0, 3).filter((x) => x.child && x.child.exitCode === null && x.child.signalCode === null).length;
      if (p.name.startsWith("coordinator") && liveCoords <= 1) continue;
      if (!p.child) continue;
      p.child.kill("SIGKILL");
      p.kills++;
      kills.push(p.name);
      await sleep(500 + random() * 4_000);
      try {
        await p.start();
      } catch (e) {
        console.error(`restart of ${p.name} failed: ${String(e)}; retrying`);
        await sleep(2_000);
        await p.start();
      }
    }
  }

  const t0 = Date.now();
  const clients = Array.from({ length: CLIENTS }, (_, i) => client(i));
  const chaosDone = chaos();
  const progress = setInterval(() => console.log(`  ${Math.round((Date.now() - t0) / 1000)}s: cycles ${stats.cycles}, ssh ${stats.sshRuns}, kills ${kills.length}, double grants ${stats.doubleGrants}`), 30_000);
  await sleep(MINUTES * 60_000);
  stopChaos = true;
  console.log("stopping chaos…");
  await chaosDone;
  stopClients = true;
  console.log("stopping clients…");
  const finished = await Promise.race([Promise.all(clients).then(() => true), sleep(60_000).then(() => false)]);
  const hung = doing.map((d, i) => `${i}:${d}`).filter((x) => !x.endsWith(":done"));
  if (!finished) console.error(`clients still busy after 60 s: ${hung.join(" ")}`);
  clearInterval(progress);
  for (const p of procs) if (!p.child || p.child.exitCode !== null || p.child.signalCode !== null) await p.start();

  // ---- settle: no kills; drain the pool; wait until no obligation is left ----
  console.log("settling…");
  await sleep(20_000);
  await adminApi.call("POST", "/v1/pools/chaos/drain", {});
  await adminApi.call("POST", "/v1/pools/chaosp/drain", {});
  const q = async <T>(sql: string) => store.transaction((tx) => tx.all<T>(sql));
  let left = { ops: -1, machines: -1 };
  for (let i = 0; i < 90; i++) {
    const ops = await q<{ n: number }>("SELECT COUNT(*) AS n FROM operations WHERE state IN ('pending','running')");
    const ms = await q<{ n: number }>("SELECT COUNT(*) AS n FROM machines WHERE state NOT IN ('destroyed')");
    left = { ops: Number(ops[0]!.n), machines: Number(ms[0]!.n) };
    if (left.ops === 0 && left.machines === 0) break;
    await sleep(2_000);
  }

  // Double grants in the store: two borrows of one machine at one generation, or overlapping borrows of one machine.
  const dupGen = await q<{ n: number }>("SELECT COUNT(*) AS n FROM (SELECT machine_id, generation FROM borrows GROUP BY machine_id, generation HAVING COUNT(*) > 1) d");
  const overlaps = await q<{ n: number }>(
    "SELECT COUNT(*) AS n FROM borrows a JOIN borrows b ON a.machine_id = b.machine_id AND a.id < b.id AND a.created_at < COALESCE(b.ended_at, 9e18) AND b.created_at < COALESCE(a.ended_at, 9e18)",
  );
  // Returned machines made ready without a proven fence of that generation.
  const unfenced = await q<{ n: number }>(
    `SELECT COUNT(*) AS n FROM audit r WHERE r.to_state = 'ready' AND r.generation > 0
       AND NOT EXISTS (SELECT 1 FROM operations o WHERE o.machine_id = r.machine_id AND o.generation = r.generation AND o.kind = 'fence' AND o.state = 'done')
       AND NOT EXISTS (SELECT 1 FROM audit f WHERE f.machine_id = r.machine_id AND f.generation = r.generation AND f.event = 'fenced' AND f.seq < r.seq)`,
  );
  const readyAfterReturn = await q<{ n: number }>("SELECT COUNT(*) AS n FROM audit WHERE to_state = 'ready' AND generation > 0");
  const quarantined = await q<{ n: number }>("SELECT COUNT(*) AS n FROM audit WHERE event = 'quarantine'");
  // Leaks: sandboxes left on the agents and processes still running from their state directories.
  let leakedSandboxes = 0;
  for (let i = 0; i < 2; i++) {
    const dir = join(root, `agent${i}`, "machines");
    if (existsSync(dir)) leakedSandboxes += readdirSync(dir).filter((n) => existsSync(join(dir, n, "machine.json")) && !readFileSync(join(dir, n, "machine.json"), "utf8").includes('"destroyed"')).length;
  }
  const agentPids = new Set(procs.slice(3).map((p) => p.child?.pid));
  let leakedProcesses = 0;
  for (const pid of readdirSync("/proc").filter((n) => /^\d+$/.test(n))) {
    if (agentPids.has(Number(pid))) continue;
    try {
      const cwd = readlinkSync(`/proc/${pid}/cwd`);
      if (cwd.startsWith(root)) leakedProcesses++;
    } catch {
      /* gone or not ours */
    }
  }

  const result = {
    bench: "chaos",
    at: new Date().toISOString(),
    minutes: MINUTES,
    clients: CLIENTS,
    seed: SEED,
    coordinators: 3,
    agents: 2,
    store: "postgresql",
    cycles: stats.cycles,
    portableCycles: stats.portableCycles,
    hungClients: finished ? 0 : hung.length,
    sshCommands: stats.sshRuns,
    sshFailures: stats.sshFailures,
    kills: { total: kills.length, coordinators: kills.filter((k) => k.startsWith("coord")).length, agents: kills.filter((k) => k.startsWith("agent")).length },
    poolExhaustedAnswers: stats.exhausted,
    clientErrors: Object.fromEntries(errorsSeen),
    quarantines: Number(quarantined[0]!.n),
    returnsToReady: Number(readyAfterReturn[0]!.n),
    doubleGrants: stats.doubleGrants + Number(dupGen[0]!.n) + Number(overlaps[0]!.n),
    returnedNotFenced: Number(unfenced[0]!.n),
    leakedSandboxes,
    leakedProcesses,
    cleanupObligationsLeft: left.ops,
    machinesNotDestroyedAfterDrain: left.machines,
  };
  console.log(JSON.stringify(result, null, 2));
  mkdirSync("bench/results", { recursive: true });
  const out = join("bench/results", `chaos-${result.at.replace(/[:.]/g, "-")}.json`);
  writeFileSync(out, JSON.stringify(result, null, 2) + "\n");
  console.log(`written ${out}`);

  for (const p of procs) {
    if (p.child && p.child.exitCode === null) {
      const gone = new Promise((r) => p.child!.once("exit", r));
      p.child.kill("SIGTERM");
      await Promise.race([gone, sleep(10_000).then(() => p.child!.kill("SIGKILL"))]);
    }
  }
  await Promise.all([...apis, adminApi].map((a) => a.close()));
  await store.pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  await store.close();
  rmSync(root, { recursive: true, force: true });
  const bad = result.hungClients + result.doubleGrants + result.returnedNotFenced + result.leakedSandboxes + result.leakedProcesses + Math.max(0, result.cleanupObligationsLeft);
  process.exit(bad === 0 ? 0 : 1);
}

main().catch((e: unknown) => {
  console.error(e);
  process.exit(1);
});
