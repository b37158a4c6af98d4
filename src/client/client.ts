/**
 * The berth client: what `berth run` does, in-process, for programs (agent
 * harnesses, CI drivers). One object holds keep-alive connections to the
 * coordinator; any number of borrows and runs may be in flight on it.
 *
 *   borrow    take a ready machine (waiting up to `waitMs` when the pool is empty)
 *   ack       portable: install the per-borrow key; access is active only after it
 *   ssh       the SSH connection to the machine (opened once per borrow)
 *   exec      run a command: streamed output, stdin, exit status, AbortSignal
 *   heartbeat prove the borrower alive (never moves the hard deadline)
 *   return    give the machine back (repeating it answers the first outcome)
 *   run       all of the above in one call; the machine is returned on every way out
 *
 * Order on the way out: the return first; only once the coordinator accepted
 * it is the receipt marked (or removed) and the private key dropped, so a
 * failed return leaves everything needed to retry it.
 */
import { readFileSync } from "node:fs";
import { Writable } from "node:stream";
import { randomBytes } from "node:crypto";
import { BerthError } from "../core/errors.js";
import { newId } from "../core/ids.js";
import { newToken } from "../core/tokens.js";
import { formatDuration } from "../core/durations.js";
import { writeFileDurable } from "../io/durable-file.js";
import { Borrow, type Access } from "./borrow.js";
import { ConfigError, loadConfig, type ConfigFlags } from "./config.js";
import { Api, ApiError } from "./http.js";
import { removeQuietly, type Receipt } from "./receipt.js";
import { MachineFiles, openSftp, type FileEntry, type TransferOptions } from "./files.js";
import { connect, preloadSshClient, shellQuote, type ExecResult, type RemoteCommand, type SshConnection, type StartOptions } from "./ssh.js";
import type { RouteReply } from "../protocol/api.js";

export interface ClientOptions {
  /** Coordinator URL, e.g. http://127.0.0.1:7420 */
  url: string;
  /** API token (never put it in argv). */
  token: string;
  /** Keeper pools: the keeper's private key (OpenSSH text), or a file holding it. */
  keeperKey?: string | null;
  keeperKeyFile?: string | null;
}

export interface BorrowOptions {
  pool: string;
  /** keeper (default) or portable (per-borrow key, two-phase ack). */
  access?: Access;
  /**
   * How long the borrow lasts. Keeper: default 30 min (or half the pool's hard TTL if shorter), at most
   * what the pool's machines live (else `duration_too_long`). Portable: capped at 30 min, the machine's TTL and your token.
   */
  durationMs?: number;
  /** Write the borrow's receipt (0600) here, and a portable key next to it; default: memory only. */
  receiptPath?: string | null;
  /** How long to wait for a ready machine when the pool is momentarily empty (default 0: refuse at once). */
  waitMs?: number;
  /** Called while waiting, with the time waited so far and why no machine is ready (the coordinator's words). */
  onWait?: (waitedMs: number, why: string) => void;
  signal?: AbortSignal;
  /**
   * SSH follows: load the SSH client (ssh2, 50–130 ms of CPU) while the borrow request is in
   * flight instead of after its answer. `run` sets it; a borrow that only prints a receipt does not.
   */
  preloadSsh?: boolean;
}

export interface ExecOptions {
  /** Standard input: a stream (EOF delivered when it ends), bytes, or nothing (EOF at once). */
  stdin?: StartOptions["stdin"];
  /** Where output goes; without one, output is collected into the result. */
  stdout?: Writable;
  stderr?: Writable;
  env?: Record<string, string>;
  /** On abort: this SSH signal goes to the command, which gets `graceMs` to end before the session is closed. */
  signal?: AbortSignal;
  abortSignal?: string;
  graceMs?: number;
  /** Called once the command runs, with a handle to signal or close it. */
  onStart?: (cmd: RemoteCommand) => void;
}

export interface ExecOutput extends ExecResult {
  /** Collected output (only when no stream was given for it). */
  stdout?: Buffer;
  stderr?: Buffer;
}

export interface ReturnOutcome {
  /** The machine's state once the return was accepted (e.g. fencing, scrubbing, ready). */
  state: string;
  cleanup: string | null;
  /** This return repeated an earlier one (same token); the answer is where that one went. */
  repeated: boolean;
}

export interface RunOptions extends Omit<BorrowOptions, "signal">, Omit<ExecOptions, "onStart"> {
  /** argv (quoted for the remote shell) or one shell command line. */
  command: string[] | string;
  /** Retire the machine afterwards instead of returning it to the pool. */
  drain?: boolean;
  /** Called once the machine is borrowed (and acknowledged). */
  onBorrowed?: (b: Borrow) => void;
  onStart?: (cmd: RemoteCommand, b: Borrow) => void;
}

export interface RunResult extends ExecOutput {
  borrowId: string;
  machineId: string;
  /** The hard deadline interrupted the command. */
  expired: boolean;
  /** How the return went; null when it failed (then `returnError` says why, and the receipt is kept). */
  returned: ReturnOutcome | null;
  returnError: unknown;
}

/** Pauses before sending a borrow again after its reply was lost. */
const RESEND_PAUSES_MS = [50, 250, 1000];

/**
 * The request may have reached the coordinator and its answer did not come back: the
 * connection broke after sending (reset, hang-up, timeout), or a proxy in between answered
 * 502/504 without a berth error. A refused connection never carried the request: not this.
 */
function replyLost(e: unknown): boolean {
  if (e instanceof ApiError) return e.code === "http_error" && (e.status === 502 || e.status === 504);
  const code = (e as NodeJS.ErrnoException).code;
  return code === "ECONNRESET" || code === "EPIPE" || code === "ETIMEDOUT" || code === "ECONNABORTED";
}

const sleep = (ms: number, signal?: AbortSignal) =>
  new Promise<void>((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(signal!.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });

export class BerthClient {
  readonly api: Api;
  readonly url: string;
  readonly #keeper: { text: string | null; file: string | null };

  constructor(o: ClientOptions) {
    this.url = o.url.replace(/\/+$/, "");
    this.api = new Api(this.url, o.token);
    this.#keeper = { text: o.keeperKey ?? null, file: o.keeperKeyFile ?? null };
  }

  /** A client from the same places the CLI looks (flags, BERTH_* environment, .berth/client.json, ~/.config/berth/client.json). */
  static fromConfig(flags: ConfigFlags = {}): BerthClient {
    const c = loadConfig(flags);
    return new BerthClient({ url: c.url, token: c.token, keeperKeyFile: c.keeperKeyFile });
  }

  async borrow(o: BorrowOptions): Promise<Borrow> {
    const access = o.access ?? "keeper";
    let pair: { privateKey: string; publicKey: string } | null = null;
    let keyFile: string | null = null;
    const body: Record<string, unknown> = { access };
    if (access === "portable") {
      // The private key never leaves this process; only its public half goes to the coordinator.
      // Loaded here: key generation uses ssh2, which keeper borrows never need before SSH.
      const { generateSshKeyPair } = await import("../core/ssh-keys.js");
      pair = generateSshKeyPair("berth-borrow");
      if (o.receiptPath) {
        keyFile = `${o.receiptPath}.key`;
        writeFileDurable(keyFile, pair.privateKey, 0o600);
      }
      body.publicKey = pair.publicKey;
    }
    if (o.durationMs !== undefined) body.durationMs = o.durationMs;
    // The borrow's id and tokens are chosen here, so a request whose reply is lost can be sent
    // again and answers the same borrow instead of taking a second machine.
    body.borrowId = newId(access === "portable" ? "g" : "b", randomBytes);
    body.borrowToken = newToken("borrow", randomBytes);
    if (access === "portable") body.grantToken = newToken("grant", randomBytes);
    const started = Date.now();
    let pause = 25;
    let resent = 0;
    let r: RouteReply<"POST /v1/pools/{pool}/borrow">;
    for (;;) {
      try {
        r = await this.api.send("POST /v1/pools/{pool}/borrow", { pool: o.pool }, body, o.preloadSsh ? { onSent: preloadSshClient } : {});
        break;
      } catch (e) {
        if (resent < RESEND_PAUSES_MS.length && replyLost(e) && !o.signal?.aborted) {
          await sleep(RESEND_PAUSES_MS[resent++]!, o.signal);
          continue;
        }
        const waited = Date.now() - started;
        const exhausted = e instanceof ApiError && e.code === "pool_exhausted";
        const waitMs = o.waitMs ?? 0;
        if (!exhausted || waited >= waitMs || o.signal?.aborted) {
          removeQuietly(keyFile);
          if (exhausted && waitMs) throw new ApiError(e.status, e.code, `${e.message.replace(/; try again shortly.*$/, "")}; waited ${Math.round(waited / 100) / 10}s (--wait ${formatDuration(waitMs)})`);
          throw e;
        }
        // Why nothing is ready, as the coordinator said (its pool_exhausted message, code dropped).
        o.onWait?.(waited, e.message.replace(/^pool_exhausted: /, ""));
        // The last try is at the end of the wait, not a pause before it.
        await sleep(Math.min(pause, waitMs - waited), o.signal);
        pause = Math.min(250, Math.ceil(pause * 1.5));
      }
    }
    const receipt: Receipt = {
      version: 1,
      url: this.url,
      access,
      pool: o.pool,
      borrowId: r.borrowId,
      borrowToken: r.borrowToken,
      grantToken: r.grantToken ?? null,
      keyFile,
      publicKey: pair?.publicKey ?? null,
      machine: r.machine,
      state: access === "portable" ? "pending" : "active",
      heartbeatMs: r.heartbeatMs,
      expiresAt: r.expiresAt,
      createdAt: Date.now(),
    };
    const b = new Borrow(receipt, o.receiptPath ?? null, pair?.privateKey ?? null);
    if (o.receiptPath) b.update(receipt);
    return b;
  }

  /** Portable: install the borrow's key; the borrow is usable once this resolves. Keeper borrows are active at once. */
  async ack(b: Borrow): Promise<Borrow> {
    const r = b.receipt;
    if (r.access !== "portable" || r.state === "active") return b;
    if (r.grantToken === null || r.publicKey === null) throw new BerthError("invalid_request", `invalid_request: portable borrow ${r.borrowId} has no grant token or public key in its receipt`);
    const a = await this.api.send("POST /v1/borrows/{id}/ack", { id: r.borrowId }, { token: r.borrowToken, grantToken: r.grantToken, publicKey: r.publicKey });
    if (a.state !== "active") throw new BerthError("operation_failed", `operation_failed: borrow ${r.borrowId} is ${a.state} after acknowledgement, not active`);
    const m = a.machine;
    if (m?.generation === undefined || m.ssh === undefined) throw new ApiError(200, "invalid_reply", `invalid_reply: the acknowledged borrow ${r.borrowId} names no machine to reach`);
    b.update({ ...r, state: "active", expiresAt: a.expiresAt, machine: { id: m.id, generation: m.generation, ssh: m.ssh } });
    return b;
  }

  heartbeat(b: Borrow): Promise<{ heartbeatDeadline: number; expiresAt: number }> {
    const r = b.receipt;
    return this.api.send("POST /v1/borrows/{id}/heartbeat", { id: r.borrowId }, { token: r.borrowToken, ...(r.grantToken ? { grantToken: r.grantToken } : {}) });
  }

  /** Give the machine back. Repeating it (say after a lost reply) answers where the first return went. */
  async return(b: Borrow, o: { drain?: boolean; keepReceipt?: boolean } = {}): Promise<ReturnOutcome> {
    const conn = b.connection;
    b.connection = null;
    if (conn) void conn.then((c) => c.end(), () => undefined);
    const r = b.receipt;
    const wasReturned = r.state === "returned";
    const a = await this.api.send("POST /v1/borrows/{id}/return", { id: r.borrowId }, {
      token: r.borrowToken,
      disposition: o.drain ? "drain" : "ready",
      ...(r.grantToken ? { grantToken: r.grantToken } : {}),
    });
    b.returned({ keepReceipt: Boolean(o.keepReceipt) });
    return { state: a.state, cleanup: a.cleanup ?? null, repeated: Boolean(a.repeated) || wasReturned };
  }

  /** The SSH connection to the borrowed machine (one per borrow, shared by its commands; closed by `return`). */
  ssh(b: Borrow, o: { signal?: AbortSignal; timeoutMs?: number } = {}): Promise<SshConnection> {
    if (b.connection) {
      const existing = b.connection;
      return existing.then((c) => (c.closed ? this.#reconnect(b, o) : c));
    }
    return this.#reconnect(b, o);
  }

  #reconnect(b: Borrow, o: { signal?: AbortSignal; timeoutMs?: number }): Promise<SshConnection> {
    const r = b.receipt;
    if (r.state === "pending") return Promise.reject(new BerthError("borrow_not_active", `borrow_not_active: borrow ${r.borrowId} is not acknowledged yet`));
    const s = r.machine.ssh;
    const p = connect(
      { host: s.host ?? "127.0.0.1", port: s.port ?? 22, user: s.user ?? r.machine.id, hostKey: s.hostKey ?? "", privateKey: this.#privateKeyFor(b) },
      { signal: o.signal, timeoutMs: o.timeoutMs },
    );
    b.connection = p;
    p.catch(() => {
      if (b.connection === p) b.connection = null;
    });
    return p;
  }

  #privateKeyFor(b: Borrow): string {
    if (b.access === "portable") {
      if (b.privateKey) return b.privateKey;
      if (b.receipt.keyFile) return readKey(b.receipt.keyFile);
      throw new BerthError("invalid_request", `invalid_request: borrow ${b.id} has no private key`);
    }
    return this.#keeperKey();
  }

  /**
   * Refuses a keeper run that could not reach its machine, with the real cause: a pool that is
   * not a keeper pool at all (asked once, only when no keeper key is at hand), or the missing key.
   */
  async #checkKeeperKey(pool: string): Promise<void> {
    try {
      this.#keeperKey();
    } catch (e) {
      const p = await this.api.send("GET /v1/pools/{pool}", { pool });
      if (p.access !== "keeper") throw new BerthError("namespace_conflict", `namespace_conflict: pool ${pool} is a ${p.access} pool; borrow it with access ${p.access} (berth run --pool-access ${p.access})`);
      throw e;
    }
  }

  /** The keeper's private key (keeper pools), or a ConfigError saying where it should have come from. */
  #keeperKey(): string {
    if (this.#keeper.text) return this.#keeper.text;
    if (this.#keeper.file) return readKey(this.#keeper.file);
    throw new ConfigError(
      "no keeper key: a keeper pool's machines are reached with the keeper's private key, which the client config names as keeperKeyFile (`berth up` writes one in .berth/client.json); run from that directory, pass --config FILE, or borrow from a portable pool (--pool-access portable)",
    );
  }

  /**
   * Run one command on a borrowed machine. Resolves with its exit status (and
   * the output, when no stream was given). On abort, `abortSignal` (INT by
   * default) goes to the command, which has `graceMs` (2 s) to end; then the
   * session is closed and the promise rejects with the signal's reason.
   */
  async exec(b: Borrow, command: string[] | string, o: ExecOptions = {}): Promise<ExecOutput> {
    if (o.signal?.aborted) throw o.signal.reason;
    const conn = await this.ssh(b, { signal: o.signal });
    const out = o.stdout ?? collector();
    const err = o.stderr ?? collector();
    const cmd = await conn.start(typeof command === "string" ? command : shellQuote(command), { stdin: o.stdin, stdout: out, stderr: err, env: o.env });
    o.onStart?.(cmd);
    let grace: NodeJS.Timeout | null = null;
    const onAbort = () => {
      cmd.signal(o.abortSignal ?? "INT");
      grace = setTimeout(() => cmd.close(), o.graceMs ?? 2000);
    };
    o.signal?.addEventListener("abort", onAbort, { once: true });
    const res = await cmd.done.finally(() => {
      o.signal?.removeEventListener("abort", onAbort);
      if (grace) clearTimeout(grace);
    });
    if (o.signal?.aborted) throw o.signal.reason;
    return { ...res, ...(o.stdout ? {} : { stdout: (out as Collector).bytes() }), ...(o.stderr ? {} : { stderr: (err as Collector).bytes() }) };
  }

  /**
   * Borrow, (ack,) run the command, return — the machine goes back on every
   * way out: success, failure, abort, expiry. Heartbeats run meanwhile; the
   * hard deadline ends the command (`expired`). If the return fails, the
   * result says so (`returnError`) and the receipt, if any, is kept for a retry.
   */
  async run(o: RunOptions): Promise<RunResult> {
    // A keeper run needs the keeper's key for SSH: without it, refuse before a machine is taken.
    if ((o.access ?? "keeper") === "keeper") await this.#checkKeeperKey(o.pool);
    const b = await this.borrow({ ...o, preloadSsh: true });
    let hb: NodeJS.Timeout | null = null;
    let deadline: NodeJS.Timeout | null = null;
    let expired = false;
    let outcome: ExecOutput | null = null;
    let failure: unknown = null;
    try {
      if (o.signal?.aborted) throw o.signal.reason;
      await this.ack(b);
      o.onBorrowed?.(b);
      hb = setInterval(() => void this.heartbeat(b).catch(() => undefined), Math.max(1000, Math.floor(b.heartbeatMs / 3)));
      // The hard deadline is enforced here too (the agent cuts access at the same instant).
      deadline = setTimeout(() => {
        expired = true;
        void b.connection?.then((c) => c.end(), () => undefined);
      }, Math.max(0, b.expiresAt - Date.now()));
      outcome = await this.exec(b, o.command, { ...o, onStart: (cmd) => o.onStart?.(cmd, b) });
      if (outcome.cut && Date.now() >= b.expiresAt) expired = true;
    } catch (e) {
      failure = e;
    } finally {
      if (hb) clearInterval(hb);
      if (deadline) clearTimeout(deadline);
    }
    let returned: ReturnOutcome | null = null;
    let returnError: unknown = null;
    try {
      returned = await this.return(b, { drain: o.drain });
    } catch (e) {
      returnError = e;
    }
    if (failure !== null && !(expired && failure instanceof BerthError)) {
      if (returnError && failure instanceof Error) (failure as Error & { returnError?: unknown }).returnError = returnError;
      throw failure;
    }
    const res = outcome ?? { code: null, signal: null, cut: true, outputClosed: false, status: 124 };
    return { ...res, status: expired ? 124 : res.status, borrowId: b.id, machineId: b.machine.id, expired, returned, returnError };
  }

  /** Close keep-alive connections to the coordinator. */
  /**
   * The borrowed machine's files over SFTP: one SFTP session on the borrow's SSH connection
   * (docs/files.md). `files.close()` ends it; `return` cuts it with the connection.
   */
  async files(b: Borrow): Promise<MachineFiles> {
    if (b.state === "returned") throw new BerthError("borrow_not_active", `borrow_not_active: borrow ${b.id} was returned; its machine's files are gone with it`);
    return new MachineFiles(await openSftp(await this.ssh(b)));
  }

  /** One file's bytes (a path relative to the workspace, or absolute). */
  readFile(b: Borrow, path: string): Promise<Buffer> {
    return this.#withFiles(b, (f) => f.read(path));
  }

  /** Create or replace one file whole. */
  writeFile(b: Borrow, path: string, data: Buffer | string, o: { mode?: number } = {}): Promise<void> {
    return this.#withFiles(b, (f) => f.write(path, data, o));
  }

  /** A directory's entries. */
  listFiles(b: Borrow, path = "."): Promise<FileEntry[]> {
    return this.#withFiles(b, (f) => f.list(path));
  }

  /** Copy a local file or (recursive) directory to the machine, keeping modes. */
  uploadFile(b: Borrow, local: string, remote: string, o: TransferOptions = {}): Promise<void> {
    return this.#withFiles(b, (f) => f.upload(local, remote, o));
  }

  /** Copy a file or (recursive) directory from the machine, keeping modes; `LOCAL.partial` until complete. */
  downloadFile(b: Borrow, remote: string, local: string, o: TransferOptions = {}): Promise<void> {
    return this.#withFiles(b, (f) => f.download(remote, local, o));
  }

  async #withFiles<T>(b: Borrow, fn: (f: MachineFiles) => Promise<T>): Promise<T> {
    const f = await this.files(b);
    try {
      return await fn(f);
    } finally {
      f.close();
    }
  }

  close(): Promise<void> {
    return this.api.close();
  }
}

function readKey(file: string): string {
  try {
    return readFileSync(file, "utf8");
  } catch (e) {
    throw new ConfigError(`cannot read the private key ${file}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
  }
}

interface Collector extends Writable {
  bytes(): Buffer;
}

function collector(): Collector {
  const chunks: Buffer[] = [];
  const w = new Writable({
    write(chunk: Buffer, _enc, cb) {
      chunks.push(chunk);
      cb();
    },
  }) as Collector;
  w.bytes = () => Buffer.concat(chunks);
  return w;
}
