/**
 * The client's SSH leg (ssh2 client): connect to a machine's gateway with a
 * private key, pin the gateway's host key exactly (the one the coordinator
 * reported), run commands with streamed output, standard input, signals and
 * exit status, or open sessions for an interactive terminal. The data plane
 * goes straight to the agent, never through the coordinator.
 *
 * Only the client half of ssh2 is loaded, and only when a connection is first
 * made: a client command that never opens SSH pays nothing for it. ssh2's
 * default algorithms are already the cheapest both ends share here
 * (curve25519-sha256, ssh-ed25519, aes128-gcm); the host key algorithm is
 * pinned to the one the gateway has. TCP_NODELAY is set on the socket (the
 * gateway sets it on its side too). Authentication goes straight to the key
 * (no `none` probe first), and exec sends no pty or env request unless asked.
 */
import { createRequire } from "node:module";
import { constants as osConstants } from "node:os";
import type { Readable, Writable } from "node:stream";
import type { Client as Ssh2Client, ClientChannel } from "ssh2";
import { BerthError } from "../core/errors.js";

export interface SshTarget {
  host: string;
  port: number;
  user: string;
  /** The gateway's host key, one OpenSSH public key line; connections to anything else are refused. */
  hostKey: string;
  privateKey: string;
}

let ssh2Client: typeof Ssh2Client | null = null;
function clientClass(): typeof Ssh2Client {
  // ssh2's index also loads its server, agent and key-generation code; the client is enough here.
  ssh2Client ??= createRequire(import.meta.url)("ssh2/lib/client.js") as typeof Ssh2Client;
  return ssh2Client;
}

/**
 * Load the SSH client now, on the next turn of the event loop (once the caller's pending I/O
 * is under way): the load is synchronous CPU work, best spent while waiting on the network.
 * Idempotent; a failure here is reported by the connect that needs the module.
 */
export function preloadSshClient(): void {
  if (ssh2Client) return;
  setImmediate(() => {
    try {
      clientClass();
    } catch {
      /* connect() loads it again and reports */
    }
  });
}

function hostKeyBlob(line: string): Buffer {
  const b64 = line.trim().split(/\s+/)[1];
  if (!b64) throw new BerthError("invalid_request", "invalid_request: the machine has no pinned host key; refusing to connect");
  return Buffer.from(b64, "base64");
}

export interface ExecResult {
  /** The exit status the command reported, or null. */
  code: number | null;
  /** The signal that ended it ("INT", "TERM", …), or null. */
  signal: string | null;
  /** The session ended without an exit status (cut by revocation, expiry or a network failure). */
  cut: boolean;
  /**
   * A stream given for output failed (EPIPE: its reader went away, as in `| head -2`); the
   * session was closed then, as ssh does, which ends the remote command. Not a cut.
   */
  outputClosed: boolean;
  /** As a process exit status: the code, 128 + n for a signal, 255 when none arrived; 141 (SIGPIPE) after `outputClosed`. */
  status: number;
}

export interface StartOptions {
  /** Standard input: a stream (piped, EOF delivered when it ends), bytes, or nothing (EOF at once). */
  stdin?: Readable | Buffer | string | null;
  /** Where output goes; the caller owns (and ends) these streams. */
  stdout: Writable;
  stderr: Writable;
  /** Sent as SSH `env` requests (the gateway passes LANG, LC_*, TERM, TZ and BERTH_*). */
  env?: Record<string, string>;
}

/** One command running on the machine. */
export interface RemoteCommand {
  /** Send an SSH signal ("INT", "TERM", "HUP", "QUIT") to the command's process group. */
  signal(name: string): void;
  /** Close the session now (the gateway then ends the command). */
  close(): void;
  /** Settles once the session closed: with the exit status, or cut. */
  done: Promise<ExecResult>;
}

export interface SessionRequest {
  /** null: the machine's login shell. */
  command: string | null;
  /** A PTY of this size and terminal type, or none (plain pipes). */
  pty: { rows: number; cols: number; term: string } | null;
  env?: Record<string, string>;
}

/** An authenticated SSH connection to one machine. Several commands may run on it at once. */
export class SshConnection {
  #closed = false;
  constructor(readonly client: Ssh2Client) {
    client.on("close", () => {
      this.#closed = true;
    });
  }

  get closed(): boolean {
    return this.#closed;
  }

  /** Start one command; output streams as it arrives (with backpressure). */
  async start(command: string, o: StartOptions): Promise<RemoteCommand> {
    const ch = await this.#open(command, null, o.env);
    let code: number | null = null;
    let signal: string | null = null;
    ch.on("exit", (c: number | null, sig?: string) => {
      if (typeof c === "number") code = c;
      else signal = sig ?? null;
    });
    // An output stream that fails (its reader went away: EPIPE) ends the session, as ssh
    // does: the channel is closed, the gateway ends the remote command, and the machine can
    // be returned normally. Without this the unread channel would stall the command forever.
    let outputClosed = false;
    const onOutputError = (failed: Writable) => {
      // What is still in flight for the failed stream is read and dropped: ssh2 reports the
      // channel closed only once its streams have ended, and a stream nobody reads never ends.
      for (const [from, to] of [[ch, o.stdout], [ch.stderr, o.stderr]] as const) {
        if (to !== failed) continue;
        from.unpipe(to);
        from.resume();
      }
      if (outputClosed) return;
      outputClosed = true;
      try {
        ch.close();
      } catch {
        /* already closed */
      }
    };
    const outputs = o.stdout === o.stderr ? [o.stdout] : [o.stdout, o.stderr];
    const listeners = outputs.map((w) => [w, () => onOutputError(w)] as const);
    for (const [w, l] of listeners) w.on("error", l);
    ch.pipe(o.stdout, { end: false });
    ch.stderr.pipe(o.stderr, { end: false });
    const input = o.stdin;
    let unpipe = () => {};
    if (input === null || input === undefined) ch.end();
    else if (typeof input === "string" || Buffer.isBuffer(input)) ch.end(input);
    else {
      input.pipe(ch);
      unpipe = () => input.unpipe(ch);
    }
    // A write after the command ended (EPIPE-like) is not the command's failure.
    ch.on("error", () => undefined);
    // An output already closed before the command started (a reader gone early).
    for (const w of outputs) if (w.destroyed) onOutputError(w);
    const done = new Promise<ExecResult>((resolve) => {
      ch.once("close", () => {
        unpipe();
        for (const [w, l] of listeners) w.off("error", l);
        if (outputClosed) resolve({ code, signal, cut: false, outputClosed, status: 128 + osConstants.signals.SIGPIPE });
        else resolve({ code, signal, cut: code === null && signal === null, outputClosed, status: exitStatusOf(code, signal) });
      });
    });
    return {
      signal: (name) => sendSignal(ch, name.replace(/^SIG/, "")),
      close: () => {
        try {
          ch.close();
        } catch {
          /* already closed */
        }
      },
      done,
    };
  }

  /** Open one session channel: a shell or a command, with or without a PTY (for an interactive terminal). */
  openSession(req: SessionRequest): Promise<ClientChannel> {
    return this.#open(req.command, req.pty, req.env);
  }

  #open(command: string | null, ptyReq: SessionRequest["pty"], env?: Record<string, string>): Promise<ClientChannel> {
    const pty = ptyReq ? { rows: ptyReq.rows, cols: ptyReq.cols, term: ptyReq.term, width: 0, height: 0, modes: {} } : false;
    const opts = { ...(env ? { env } : {}) };
    return new Promise((resolve, reject) => {
      if (this.#closed) return reject(new BerthError("operation_failed", "operation_failed: the SSH connection is closed"));
      const done = (err: Error | undefined, ch: ClientChannel) => {
        if (err) reject(new BerthError("operation_failed", `operation_failed: the machine refused the session: ${err.message}`));
        else resolve(ch);
      };
      if (command === null) this.client.shell(pty, opts, done);
      else this.client.exec(command, { ...opts, ...(pty ? { pty } : {}) }, done);
    });
  }

  end(): void {
    this.client.end();
  }
}

interface ChannelInternals {
  outgoing: { id: number; state: string };
  _client: { _protocol: { signal(id: number, name: string): void } };
}

/**
 * ssh2's `channel.signal()` is silently dropped once our side sent EOF (stdin
 * ended), yet a command whose input is finished is exactly one a person
 * interrupts; RFC 4254 allows requests on a channel until it is closed. So
 * the request goes out through the protocol layer while the channel is open
 * or half-closed by us.
 */
function sendSignal(ch: ClientChannel, name: string): void {
  const c = ch as unknown as ChannelInternals;
  if (c.outgoing.state !== "open" && c.outgoing.state !== "eof") return;
  try {
    c._client._protocol.signal(c.outgoing.id, name);
  } catch {
    /* an unknown signal name, or the connection is gone */
  }
}

/** Connect and authenticate; the host key must be exactly the pinned one. */
export function connect(t: SshTarget, opts: { timeoutMs?: number; signal?: AbortSignal; debug?: (message: string) => void } = {}): Promise<SshConnection> {
  const pinned = hostKeyBlob(t.hostKey);
  const Client = clientClass();
  return new Promise((resolve, reject) => {
    const c = new Client();
    const onAbort = () => {
      c.end();
      reject(opts.signal!.reason);
    };
    if (opts.signal?.aborted) return reject(opts.signal.reason);
    opts.signal?.addEventListener("abort", onAbort, { once: true });
    c.once("ready", () => {
      opts.signal?.removeEventListener("abort", onAbort);
      resolve(new SshConnection(c));
    });
    // Not once: ssh2 can emit a second error (e.g. "Connection lost before handshake" after a
    // handshake timeout), and an unheard error event would crash the whole process.
    c.on("error", (e) => {
      opts.signal?.removeEventListener("abort", onAbort);
      reject(new BerthError("provider_unavailable", `provider_unavailable: SSH to ${t.user}@${t.host}:${t.port} failed: ${e.message}`));
    });
    // A peer that closes after its version line but before authentication ends (an agent killed
    // mid-handshake) gives ssh2 no error to report, and ssh2 has already cleared its ready timer:
    // without this the promise would never settle.
    c.once("close", () => {
      opts.signal?.removeEventListener("abort", onAbort);
      reject(new BerthError("provider_unavailable", `provider_unavailable: SSH to ${t.user}@${t.host}:${t.port} failed: the connection closed before authentication finished`));
    });
    c.connect({
      host: t.host,
      port: t.port,
      username: t.user,
      privateKey: t.privateKey,
      readyTimeout: opts.timeoutMs ?? 15_000,
      hostVerifier: (key: Buffer) => key.equals(pinned),
      keepaliveInterval: 15_000,
      algorithms: { serverHostKey: [t.hostKey.trim().split(/\s+/)[0] as "ssh-ed25519"] },
      // Straight to the key: ssh2 otherwise opens with a `none` attempt, one round trip that can only fail here.
      authHandler: ["publickey"],
      // ssh2's protocol trace (bench/cli-latency times the handshake's phases with it).
      ...(opts.debug ? { debug: opts.debug } : {}),
    });
    (c as unknown as { setNoDelay(on: boolean): void }).setNoDelay(true);
  });
}

/** What `exit-status` / `exit-signal` said, as a process exit status (128 + n for a signal, 255 when none arrived). */
export function exitStatusOf(code: number | null, signal: string | null): number {
  if (code !== null) return code;
  if (signal !== null) {
    const n = (osConstants.signals as Record<string, number>)[`SIG${signal.replace(/^SIG/, "")}`];
    return 128 + (n ?? 1);
  }
  return 255;
}

/** POSIX shell quoting of an argv, for the SSH exec request (which carries one command line). */
export function shellQuote(argv: string[]): string {
  return argv.map((a) => (/^[A-Za-z0-9_./:=@%+-]+$/.test(a) ? a : `'${a.replace(/'/g, `'\\''`)}'`)).join(" ");
}
