/**
 * One MCP session of `berth mcp`: the machines it borrowed (by handle), their
 * heartbeats, and the output of its commands. Built on the client library
 * (BerthClient: borrow, ack, exec, heartbeat, return); nothing here talks to
 * the coordinator or an agent any other way.
 *
 * Handles are this session's: a handle is the borrow id, looked up only in
 * this session's own table, so another session's (or organisation's) borrow
 * id is an unknown handle here even when it names a real borrow.
 *
 * The way out: `close()` returns every machine still held (all at once), ends
 * running commands first, then deletes the session's spill files. A server
 * that dies without closing stops heartbeating: the coordinator ends each
 * borrow at its heartbeat deadline (the machine is quarantined and replaced,
 * never lent on uncleaned), and the hard deadline holds in any case.
 */
import type { Borrow } from "../client/borrow.js";
import type { BerthClient } from "../client/client.js";
import { ApiError } from "../client/http.js";
import type { RemoteCommand } from "../client/ssh.js";
import { BerthError } from "../core/errors.js";
import { ToolError, invalid } from "./errors.js";
import { readOutput, runCommand, type RunCommandArgs } from "./commands.js";
import { WORKSPACE_SCRIPT, listFiles, readFile, writeFile } from "./files.js";
import type { SessionLimits } from "./limits.js";
import { OutputStore } from "./output.js";

export interface SessionDeps {
  /** The client every call of this session goes through (its token is this session's principal). */
  client: BerthClient;
  /** The pool borrow_machine uses when none is named. */
  defaultPool: string | null;
  /** Keeper pools are reachable (a keeper key is configured). */
  keeperKey: boolean;
  limits: SessionLimits;
  /** One line for the operator (stderr), never a secret. */
  log: (line: string) => void;
}

interface PoolView {
  name: string;
  access: "keeper" | "portable";
  provider: string;
  compatibilityKey: string;
  minReady: number;
  maxReady: number;
  hardTtlMs: number;
  heartbeatMs: number;
  network?: { mode: string; allow?: string[] };
  image?: string | null;
  ready?: number;
  machines?: number;
}

interface Held {
  handle: string;
  borrow: Borrow;
  pool: PoolView;
  heartbeat: NodeJS.Timeout;
  /** Keeper pools: the requested duration, kept by returning the machine then. */
  durationTimer: NodeJS.Timeout | null;
  workspace: string;
  running: Set<RemoteCommand>;
}

const iso = (ms: number) => new Date(ms).toISOString();

export class McpSession {
  readonly #d: SessionDeps;
  readonly #held = new Map<string, Held>();
  readonly #returned = new Map<string, { at: number; why: string }>();
  readonly outputs: OutputStore;
  #closing: Promise<void> | null = null;

  constructor(deps: SessionDeps) {
    this.#d = deps;
    this.outputs = new OutputStore(deps.limits);
  }

  get closed(): boolean {
    return this.#closing !== null;
  }

  /** Handles held now (for tests and the operator's log). */
  get handles(): string[] {
    return [...this.#held.keys()];
  }

  async listPools(): Promise<Record<string, unknown>> {
    const r = await this.#d.client.api.send("GET /v1/pools", {});
    return {
      pools: r.pools.map((p) => ({
        name: p.name,
        access: p.access,
        ready: p.ready ?? 0,
        machines: p.machines ?? 0,
        min_ready: p.minReady,
        max_ready: p.maxReady,
        hard_ttl_seconds: Math.round(p.hardTtlMs / 1000),
        max_borrow_seconds: Math.round(Math.min(p.hardTtlMs, 30 * 60_000) / 1000),
        image: p.image ?? null,
        network: p.network?.mode ?? "none",
        compatibility_key: p.compatibilityKey,
        default: p.name === this.#d.defaultPool,
        ...(p.access === "keeper" && !this.#d.keeperKey ? { borrowable: false, why: "keeper pool, and this server has no keeper key (run berth mcp with the client config `berth up` wrote)" } : {}),
      })),
    };
  }

  async borrowMachine(a: { pool?: string; duration_seconds?: number; wait_seconds?: number }): Promise<Record<string, unknown>> {
    this.#open();
    const poolName = a.pool ?? this.#d.defaultPool;
    if (!poolName) throw invalid("no pool named and no default pool; pass pool (list_pools shows them), or start berth mcp with --pool or BERTH_POOL");
    const client = this.#d.client;
    const pool = await client.api.send("GET /v1/pools/{pool}", { pool: poolName });
    if (pool.access === "keeper" && !this.#d.keeperKey) {
      throw new BerthError("namespace_conflict", `namespace_conflict: pool ${poolName} is a keeper pool and this server has no keeper key; borrow from a portable pool, or start berth mcp with the client config \`berth up\` wrote`);
    }
    const durationMs = a.duration_seconds !== undefined ? a.duration_seconds * 1000 : undefined;
    const b = await client.borrow({
      pool: poolName,
      access: pool.access,
      ...(pool.access === "portable" && durationMs !== undefined ? { durationMs } : {}),
      waitMs: (a.wait_seconds ?? 5) * 1000,
      preloadSsh: true,
    });
    try {
      await client.ack(b);
      if (this.closed) throw new ToolError("invalid_request", "invalid_request: the session ended while the machine was being borrowed; it was returned");
      const workspace = await this.#workspace(b);
      const heartbeat = setInterval(() => void client.heartbeat(b).catch(() => undefined), Math.max(1000, Math.floor(b.heartbeatMs / 3)));
      heartbeat.unref();
      let durationTimer: NodeJS.Timeout | null = null;
      if (pool.access === "keeper" && durationMs !== undefined && Date.now() + durationMs < b.expiresAt) {
        durationTimer = setTimeout(() => void this.#returnHeld(b.id, "its requested duration ran out").catch(() => undefined), durationMs);
        durationTimer.unref();
      }
      this.#held.set(b.id, { handle: b.id, borrow: b, pool, heartbeat, durationTimer, workspace, running: new Set() });
      this.#d.log(`borrowed ${b.id} (machine ${b.machine.id}, pool ${poolName})`);
    } catch (e) {
      await client.return(b).catch(() => undefined);
      throw e;
    }
    const until = durationMs !== undefined ? Math.min(b.expiresAt, Date.now() + durationMs) : b.expiresAt;
    return {
      handle: b.id,
      pool: poolName,
      access: b.access,
      machine: b.machine.id,
      deadline: iso(until),
      hard_deadline: iso(b.expiresAt),
      seconds_left: Math.max(0, Math.floor((until - Date.now()) / 1000)),
      image: pool.image ?? "the host's root (no image)",
      network: pool.network?.mode ?? "none",
      compatibility_key: pool.compatibilityKey,
      workspace: this.#held.get(b.id)!.workspace,
      note: "Commands start in the workspace; files paths are relative to it. Return the machine with return_machine when done.",
    };
  }

  /** The workspace's physical path on the machine (one command, run once per borrow). */
  async #workspace(b: Borrow): Promise<string> {
    const r = await this.#d.client.exec(b, WORKSPACE_SCRIPT);
    const w = r.stdout?.toString("utf8").trim() ?? "";
    if (r.status !== 0 || !w.startsWith("/")) throw new BerthError("operation_failed", `operation_failed: could not find the machine's workspace (exit ${r.status}): ${r.stderr?.toString("utf8").trim().slice(0, 200) ?? ""}`);
    return w;
  }

  #get(handle: string): Held {
    const h = this.#held.get(handle);
    if (h) {
      if (Date.now() >= h.borrow.expiresAt) throw new BerthError("borrow_expired", `borrow_expired: machine handle ${handle} reached its hard deadline at ${iso(h.borrow.expiresAt)}`);
      return h;
    }
    const r = this.#returned.get(handle);
    if (r) throw new ToolError("machine_returned", `machine_returned: machine handle ${handle} was returned at ${iso(r.at)} (${r.why}); a returned machine is never used again`);
    throw new ToolError("unknown_handle", `unknown_handle: ${JSON.stringify(handle)} is not a machine this session borrowed`);
  }

  #open(): void {
    if (this.closed) throw new ToolError("invalid_request", "invalid_request: this session is ending");
  }

  // The tools: async, so that a refusal of #open or #get is a rejected promise (a tool error, never a throw).
  async runCommand(a: RunCommandArgs): Promise<Record<string, unknown>> {
    this.#open();
    return runCommand(this.#get(a.handle), this.#tools(), a);
  }

  async readOutput(a: Parameters<typeof readOutput>[1]): Promise<Record<string, unknown>> {
    return readOutput(this.#tools(), a);
  }

  async writeFile(a: Parameters<typeof writeFile>[2]): Promise<Record<string, unknown>> {
    this.#open();
    return writeFile(this.#get(a.handle), this.#tools(), a);
  }

  async readFile(a: Parameters<typeof readFile>[2]): Promise<Record<string, unknown>> {
    this.#open();
    return readFile(this.#get(a.handle), this.#tools(), a);
  }

  async listFiles(a: Parameters<typeof listFiles>[2]): Promise<Record<string, unknown>> {
    this.#open();
    return listFiles(this.#get(a.handle), this.#tools(), a);
  }

  /** What the command and file tools need of this session. */
  #tools(): { client: BerthClient; limits: SessionLimits; outputs: OutputStore } {
    return { client: this.#d.client, limits: this.#d.limits, outputs: this.outputs };
  }

  async returnMachine(a: { handle: string }): Promise<Record<string, unknown>> {
    const prior = this.#returned.get(a.handle);
    if (prior) return { handle: a.handle, returned: true, repeated: true, note: `already returned at ${iso(prior.at)} (${prior.why})` };
    if (!this.#held.has(a.handle)) throw new ToolError("unknown_handle", `unknown_handle: ${JSON.stringify(a.handle)} is not a machine this session borrowed`);
    const outcome = await this.#returnHeld(a.handle, "return_machine");
    return { handle: a.handle, returned: true, repeated: false, machine_state: outcome.state };
  }

  async #returnHeld(handle: string, why: string): Promise<{ state: string }> {
    const h = this.#held.get(handle);
    if (!h) {
      const r = this.#returned.get(handle);
      return { state: r ? "returned" : "unknown" };
    }
    clearInterval(h.heartbeat);
    if (h.durationTimer) clearTimeout(h.durationTimer);
    for (const c of h.running) c.close();
    try {
      const o = await this.#d.client.return(h.borrow);
      this.#held.delete(handle);
      this.#returned.set(handle, { at: Date.now(), why });
      this.#d.log(`returned ${handle} (${why}): ${o.state}`);
      return o;
    } catch (e) {
      // An ended borrow (deadline passed, ended by an operator) is not this session's any more.
      if (e instanceof ApiError && (e.code === "borrow_expired" || e.code === "grant_expired" || e.code === "not_found")) {
        this.#held.delete(handle);
        this.#returned.set(handle, { at: Date.now(), why: `${why}; the borrow had already ended: ${e.code}` });
        return { state: e.code };
      }
      // Kept: heartbeats resume, and the session's end tries again.
      h.heartbeat = setInterval(() => void this.#d.client.heartbeat(h.borrow).catch(() => undefined), Math.max(1000, Math.floor(h.borrow.heartbeatMs / 3)));
      h.heartbeat.unref();
      throw e;
    }
  }

  /** The session ends: every machine still held is returned (each retried twice), then the spill files go. Idempotent. */
  close(why: string): Promise<void> {
    this.#closing ??= (async () => {
      const handles = [...this.#held.keys()];
      await Promise.all(
        handles.map(async (handle) => {
          for (let attempt = 0; ; attempt++) {
            try {
              await this.#returnHeld(handle, `session ended: ${why}`);
              return;
            } catch (e) {
              if (attempt >= 2) {
                this.#d.log(`could not return ${handle}: ${(e as Error).message}; it ends at its heartbeat deadline`);
                const h = this.#held.get(handle);
                if (h) clearInterval(h.heartbeat);
                return;
              }
              await new Promise((r) => setTimeout(r, 250 * (attempt + 1)));
            }
          }
        }),
      );
      this.outputs.close();
    })();
    return this.#closing;
  }
}
