/**
 * Allocation create → SSH-ready, on the process runtime and (root + runsc)
 * gvisor. One coordinator (SQLite) and one agent, both in this process,
 * talking over loopback HTTP as in production; per round: POST
 * /v1/allocations with a fresh public key, then connect over SSH to the
 * agent's gateway with the allocation's key and the pinned host key until
 * `true` runs (SSH-ready); the coordinator's own create → ready figure is
 * read from the allocation (`launch.readyAt`). The allocation is then
 * released and its cleanup awaited before the next round (not timed).
 *
 *   node dist/bench/alloc-launch.js --rounds 20 --runtimes process,gvisor
 */
import { randomBytes } from "node:crypto";
import { PassThrough } from "node:stream";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pino from "pino";
import { startAgent } from "../src/agent/agent.js";
import { gvisorAvailability } from "../src/agent/runtime/index.js";
import { startCoordinator } from "../src/coordinator/server.js";
import { createToken } from "../src/coordinator/auth.js";
import { SqliteStore } from "../src/store/sqlite/sqlite-store.js";
import { Api } from "../src/cli/api.js";
import { connect, execStreaming } from "../src/cli/ssh-client.js";
import { generateSshKeyPair } from "../src/core/ssh-keys.js";
import { arg, dist, ms, printTable, writeResult } from "./lib.js";

const rounds = Number(arg("rounds", "20"));
const runtimes = arg("runtimes", "process,gvisor").split(",") as Array<"process" | "gvisor">;

interface View {
  state: string;
  createdAt: number;
  launch: { readyAt: number | null } | null;
  access: { host: string; port: number; user: string; hostKey: string } | null;
}

async function one(runtime: "process" | "gvisor"): Promise<Record<string, string | number>> {
  const dir = mkdtempSync(join(tmpdir(), "berth-bench-alloc-"));
  const store = new SqliteStore({ path: join(dir, "berth.db") });
  const c = await startCoordinator({ store, secret: randomBytes(32), log: pino({ level: "warn" }), reconcileIntervalMs: 50 });
  const admin = await createToken(store, { org: "b", role: "admin", expiresAt: null, label: null }, Date.now(), (n) => randomBytes(n));
  const agentTok = await createToken(store, { org: "b", role: "agent", expiresAt: null, label: null }, Date.now(), (n) => randomBytes(n));
  const agent = await startAgent({ stateDir: join(dir, "agent"), coordinatorUrl: c.url, enrollToken: agentTok.token, runtime, vcpu: 64, memoryMib: 262_144, slots: 64, name: "bench" });
  await agent.enrolled;
  const api = new Api(c.url, admin.token);
  await api.call("POST", `/v1/owners/${admin.id}/admit`, { vcpu: 1000, memoryMib: 10_000_000, count: 1000 });
  const sshReady: number[] = [];
  const serverReady: number[] = [];
  try {
    for (let i = 0; i < rounds; i++) {
      const key = generateSshKeyPair("bench");
      const id = `b${i}-${randomBytes(3).toString("hex")}`;
      const t0 = process.hrtime.bigint();
      await api.call("POST", "/v1/allocations", { id, size: "small", publicKey: key.publicKey });
      let v: View;
      for (;;) {
        v = await api.call<View>("GET", `/v1/allocations/${id}`);
        if (v.state === "ready" && v.access) break;
        if (v.state !== "placed" && v.state !== "launching") throw new Error(`allocation ${id} is ${v.state}`);
        await new Promise((r) => setTimeout(r, 5));
      }
      const conn = await connect({ ...v.access, privateKey: key.privateKey });
      const r = await execStreaming(conn, "true", { stdout: new PassThrough().resume(), stderr: new PassThrough().resume() });
      conn.end();
      if (r.code !== 0) throw new Error(`ssh exec exited ${r.code}`);
      sshReady.push(ms(t0));
      serverReady.push(v.launch!.readyAt! - v.createdAt);
      await api.call("POST", `/v1/allocations/${id}/release`, {});
      for (;;) {
        const s = await api.call<View>("GET", `/v1/allocations/${id}`);
        if (s.state === "released") break;
        if (s.state === "quarantined") throw new Error(`allocation ${id} quarantined`);
        await new Promise((res) => setTimeout(res, 10));
      }
    }
  } finally {
    await api.close();
    await c.stop();
    await agent.stop();
    await store.close();
    rmSync(dir, { recursive: true, force: true });
  }
  const s = dist(sshReady);
  const k = dist(serverReady);
  return { runtime, rounds, "ssh-ready p50 ms": s.p50, "ssh-ready p99 ms": s.p99, "ssh-ready max": s.max, "create→ready p50 ms (coordinator)": k.p50, "p99": k.p99 };
}

const rows: Record<string, string | number>[] = [];
for (const rt of runtimes) {
  if (rt === "gvisor" && !gvisorAvailability().ok) {
    process.stdout.write(`gvisor skipped: ${(gvisorAvailability() as { why: string }).why}\n`);
    continue;
  }
  rows.push(await one(rt));
}
printTable("allocation create → SSH-ready", rows);
writeResult("alloc-launch", { rows });
