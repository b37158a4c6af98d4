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
import { isUtf8 } from "node:buffer";
import type { Borrow } from "../client/borrow.js";
import type { BerthClient } from "../client/client.js";
import { ApiError } from "../client/http.js";
import { shellQuote, type RemoteCommand } from "../client/ssh.js";
import { BerthError } from "../core/errors.js";
import { ToolError, invalid } from "./errors.js";
import { LIST_SCRIPT, READ_SCRIPT, WORKSPACE_SCRIPT, WRITE_SCRIPT, parseListing, scriptRefusal, workspacePath, type ListedEntry } from "./files.js";
import { OutputStore, utf8Boundary, wholeUtf8, type CapturedOutput, type OutputLimits, type StreamCapture } from "./output.js";

export interface SessionLimits extends OutputLimits {
  /** Default and largest run_command timeout (ms). */
  defaultTimeoutMs: number;
  maxTimeoutMs: number;
  /** Largest write_file content (decoded bytes). */
  writeMaxBytes: number;
  /** read_file: bytes given without an explicit length; the most one call gives. */
  readDefaultBytes: number;
  readMaxBytes: number;
  /** read_output: bytes given without an explicit length; the most one call gives. */
  outputReadDefaultBytes: number;
  outputReadMaxBytes: number;
  /** list_files: entries given at most. */
  listMaxEntries: number;
}

export const DEFAULT_LIMITS: SessionLimits = {
  inlineBytes: 16 * 1024,
  spillLimit: 512 * 1024 * 1024,
  defaultTimeoutMs: 120_000,
  maxTimeoutMs: 30 * 60_000,
  // Base64 of it stays under the SDK's 4 MiB HTTP body and 10 MiB stdio message limits.
  writeMaxBytes: 2 * 1024 * 1024,
  readDefaultBytes: 256 * 1024,
  readMaxBytes: 1024 * 1024,
  outputReadDefaultBytes: 64 * 1024,
  outputReadMaxBytes: 1024 * 1024,
  listMaxEntries: 1000,
};

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

  async runCommand(a: {
    handle: string;
    command: string[] | string;
    shell?: boolean;
    stdin?: string;
    stdin_base64?: string;
    cwd?: string;
    env?: Record<string, string>;
    timeout_seconds?: number;
  }): Promise<Record<string, unknown>> {
    this.#open();
    const h = this.#get(a.handle);
    const line = commandLine(a, h.workspace);
    if (a.stdin !== undefined && a.stdin_base64 !== undefined) throw invalid("give stdin or stdin_base64, not both");
    const stdin = a.stdin_base64 !== undefined ? decodeBase64(a.stdin_base64, "stdin_base64") : (a.stdin ?? null);
    const lim = this.#d.limits;
    const askedMs = a.timeout_seconds !== undefined ? a.timeout_seconds * 1000 : lim.defaultTimeoutMs;
    if (askedMs > lim.maxTimeoutMs) throw invalid(`timeout_seconds is at most ${lim.maxTimeoutMs / 1000}`);
    const out = this.outputs.create(h.handle);
    let timedOut = false;
    let started: RemoteCommand | null = null;
    let grace: NodeJS.Timeout | null = null;
    const timer = setTimeout(() => {
      timedOut = true;
      // TERM to the command's process group, then the session is closed (the gateway ends the group).
      started?.signal("TERM");
      grace = setTimeout(() => started?.close(), 2000);
    }, askedMs);
    const t0 = Date.now();
    try {
      const res = await this.#d.client.exec(h.borrow, line, {
        stdin,
        stdout: out.stdout,
        stderr: out.stderr,
        onStart: (cmd) => {
          started = cmd;
          h.running.add(cmd);
          if (timedOut) cmd.close();
        },
      });
      await Promise.all([endCapture(out.stdout), endCapture(out.stderr)]);
      const result = this.#present(out, res.status, res.signal, Date.now() - t0);
      if (timedOut) {
        throw new ToolError("command_timeout", `command_timeout: the command ran past its timeout of ${askedMs / 1000} s and was ended (TERM, then its session closed after 2 s); its output so far is below`, { ...result, timed_out: true });
      }
      if (res.cut) {
        if (Date.now() >= h.borrow.expiresAt) throw new BerthError("borrow_expired", `borrow_expired: machine handle ${h.handle} reached its hard deadline at ${iso(h.borrow.expiresAt)} while the command ran; access was cut`);
        throw new ToolError("operation_failed", "operation_failed: the session to the machine ended without an exit status (the connection was cut); the output so far is below", result);
      }
      return result;
    } finally {
      clearTimeout(timer);
      if (grace) clearTimeout(grace);
      if (started) h.running.delete(started);
      for (const c of [out.stdout, out.stderr]) if (!c.writableEnded) c.end();
    }
  }

  #present(out: CapturedOutput, status: number, signal: string | null, ms: number): Record<string, unknown> {
    const inline = this.#d.limits.inlineBytes;
    const part = (name: "stdout" | "stderr", s: StreamCapture) => {
      const head = s.head();
      const cut = utf8Boundary(head, inline);
      const shown = head.subarray(0, cut);
      const binary = !isUtf8(shown);
      const truncated = s.total > shown.length;
      return {
        [name]: binary ? shown.toString("base64") : shown.toString("utf8"),
        ...(binary ? { [`${name}_encoding`]: "base64 (not UTF-8)" } : {}),
        [`${name}_bytes`]: s.total,
        ...(truncated ? { [`${name}_truncated`]: `shows the first ${shown.length} of ${s.total} bytes${s.dropped > 0 ? `; the last ${s.dropped} bytes were not kept (session spill limit ${this.#d.limits.spillLimit} bytes)` : ""}; read the rest with read_output(output_id="${out.id}", stream="${name}", offset=${shown.length})` } : {}),
      };
    };
    const truncated = out.stdout.total > inline || out.stderr.total > inline;
    // An output shown whole has nothing to read back: it is not kept.
    if (!truncated) this.outputs.forget(out.id);
    return {
      exit_status: status,
      ...(signal ? { signal } : {}),
      ...part("stdout", out.stdout),
      ...part("stderr", out.stderr),
      ...(truncated ? { output_id: out.id } : {}),
      duration_ms: ms,
    };
  }

  async readOutput(a: { output_id: string; stream: "stdout" | "stderr"; offset?: number; length?: number; encoding?: "utf8" | "base64" }): Promise<Record<string, unknown>> {
    const o = this.outputs.get(a.output_id);
    const s = a.stream === "stdout" ? o.stdout : o.stderr;
    const lim = this.#d.limits;
    const offset = a.offset ?? 0;
    const length = Math.min(a.length ?? lim.outputReadDefaultBytes, lim.outputReadMaxBytes);
    let buf = await s.read(offset, length);
    const encoding = a.encoding ?? "utf8";
    // Text is cut at a whole UTF-8 character, so next_offset continues exactly where this ended.
    if (encoding === "utf8" && offset + buf.length < s.retrievable) {
      const whole = wholeUtf8(buf);
      if (whole > 0) buf = buf.subarray(0, whole);
    }
    const next = offset + buf.length;
    return {
      output_id: o.id,
      stream: a.stream,
      offset,
      length: buf.length,
      total_bytes: s.total,
      retrievable_bytes: s.retrievable,
      next_offset: next < s.retrievable ? next : null,
      encoding,
      data: encoding === "base64" ? buf.toString("base64") : buf.toString("utf8"),
    };
  }

  async writeFile(a: { handle: string; path: string; content: string; encoding?: "utf8" | "base64"; append?: boolean }): Promise<Record<string, unknown>> {
    this.#open();
    const h = this.#get(a.handle);
    const path = workspacePath(h.workspace, a.path);
    const bytes = (a.encoding ?? "utf8") === "base64" ? decodeBase64(a.content, "content") : Buffer.from(a.content, "utf8");
    const max = this.#d.limits.writeMaxBytes;
    if (bytes.length > max) throw new ToolError("file_too_large", `file_too_large: the content is ${bytes.length} bytes; write_file takes at most ${max} bytes per call (append the rest with append: true)`);
    const r = await this.#d.client.exec(h.borrow, shellQuote(["sh", "-c", WRITE_SCRIPT, "berth-write", h.workspace, path, a.append ? "1" : "0"]), { stdin: bytes });
    if (r.status !== 0) throw scriptRefusal(r.status, r.stderr?.toString("utf8") ?? "", a.path, h.workspace);
    return { path: relativeTo(h.workspace, path), absolute_path: path, bytes_written: bytes.length, size: Number(r.stdout?.toString("utf8").trim() ?? bytes.length) };
  }

  async readFile(a: { handle: string; path: string; offset?: number; length?: number; encoding?: "auto" | "utf8" | "base64" }): Promise<Record<string, unknown>> {
    this.#open();
    const h = this.#get(a.handle);
    const path = workspacePath(h.workspace, a.path);
    const lim = this.#d.limits;
    if (a.length !== undefined && a.length > lim.readMaxBytes) throw invalid(`length is at most ${lim.readMaxBytes} bytes per call`);
    const offset = a.offset ?? 0;
    // Without a length, one byte more than the default tells a file that is too large.
    const want = a.length ?? lim.readDefaultBytes + 1;
    const r = await this.#d.client.exec(h.borrow, shellQuote(["sh", "-c", READ_SCRIPT, "berth-read", h.workspace, path, String(offset), String(want)]));
    const err = r.stderr?.toString("utf8") ?? "";
    if (r.status !== 0) throw scriptRefusal(r.status, err, a.path, h.workspace);
    const size = Number(/berth:size:(\d+)/.exec(err)?.[1] ?? NaN);
    let data = r.stdout ?? Buffer.alloc(0);
    if (a.length === undefined && data.length > lim.readDefaultBytes) {
      throw new ToolError("file_too_large", `file_too_large: ${a.path} is ${size} bytes; read_file gives at most ${lim.readDefaultBytes} bytes without a length (up to ${lim.readMaxBytes} with offset and length)`, { size });
    }
    data = data.subarray(0, want);
    const enc = a.encoding ?? "auto";
    const text = enc === "utf8" || (enc === "auto" && isUtf8(data));
    const next = offset + data.length;
    return {
      path: relativeTo(h.workspace, path),
      size,
      offset,
      length: data.length,
      next_offset: next < size ? next : null,
      encoding: text ? "utf8" : "base64",
      content: text ? data.toString("utf8") : data.toString("base64"),
    };
  }

  async listFiles(a: { handle: string; path?: string; depth?: number }): Promise<Record<string, unknown>> {
    this.#open();
    const h = this.#get(a.handle);
    const dir = workspacePath(h.workspace, a.path ?? ".");
    const r = await this.#d.client.exec(h.borrow, shellQuote(["sh", "-c", LIST_SCRIPT, "berth-list", h.workspace, dir, String(a.depth ?? 1)]));
    if (r.status !== 0) throw scriptRefusal(r.status, r.stderr?.toString("utf8") ?? "", a.path ?? ".", h.workspace);
    const all: ListedEntry[] = parseListing(r.stdout ?? Buffer.alloc(0), h.workspace).sort((x, y) => (x.path < y.path ? -1 : x.path > y.path ? 1 : 0));
    const max = this.#d.limits.listMaxEntries;
    return {
      path: relativeTo(h.workspace, dir),
      workspace: h.workspace,
      entries: all.slice(0, max),
      ...(all.length > max || (r.stdout?.length ?? 0) >= 1024 * 1024 ? { truncated: `more entries than shown (at most ${max}); list a subdirectory or a smaller depth` } : {}),
    };
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

function endCapture(s: StreamCapture): Promise<void> {
  return new Promise((resolve, reject) => {
    if (s.writableFinished) return resolve();
    s.once("error", reject);
    s.end(() => resolve());
  });
}

function decodeBase64(s: string, what: string): Buffer {
  if (!/^[A-Za-z0-9+/\s]*={0,2}\s*$/.test(s)) throw invalid(`${what} is not base64`);
  return Buffer.from(s, "base64");
}

function relativeTo(workspace: string, abs: string): string {
  if (abs === workspace) return ".";
  return abs.slice(workspace.length + (workspace.endsWith("/") ? 0 : 1));
}

const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

/**
 * The command line sent over SSH (the machine's login shell runs it: bash where present, else sh).
 *
 * argv (the default) is quoted word by word and run with `exec`, so the program gets exactly
 * these arguments (execve semantics: no shell builtins) and is itself the session's process
 * group leader: a timeout's TERM reaches it, and when it ignores TERM and HUP the gateway's
 * release escalates to KILL while that leader lives. `shell: true` runs one string as a shell
 * script. cwd (inside the workspace) and env are set by a first line (`cd`, `export`): the
 * gateway passes only a few variables as SSH env requests, so this works everywhere; when it
 * fails, the script does not run (exit 1).
 */
export function commandLine(a: { command: string[] | string; shell?: boolean; cwd?: string; env?: Record<string, string> }, workspace: string): string {
  let body: string;
  if (a.shell) {
    if (typeof a.command !== "string") throw invalid("with shell: true, command is one string (a shell command line), not an array");
    if (a.command.trim() === "") throw invalid("command is empty");
    body = a.command;
  } else {
    if (typeof a.command === "string") throw invalid("command is an array of arguments (argv), e.g. [\"ls\", \"-la\"]; for a shell command line (pipes, &&, globs) pass one string with shell: true");
    if (a.command.length === 0 || a.command[0] === "") throw invalid("command is empty; give at least the program, e.g. [\"ls\"]");
    body = `exec ${shellQuote(a.command)}`;
  }
  const prefix: string[] = [];
  if (a.cwd !== undefined) prefix.push(`cd -- ${shellQuote([workspacePath(workspace, a.cwd)])}`);
  for (const [k, v] of Object.entries(a.env ?? {})) {
    if (!ENV_NAME.test(k)) throw invalid(`env name ${JSON.stringify(k)} is not a variable name (letters, digits, _; not starting with a digit)`);
    if (v.includes("\0")) throw invalid(`env ${k} contains a NUL byte`);
    prefix.push(`export ${shellQuote([`${k}=${v}`])}`);
  }
  if (prefix.length === 0) return body;
  // On its own line, so the script's syntax cannot interact with it.
  return `${prefix.join(" && ")} || exit 1\n${body}`;
}
