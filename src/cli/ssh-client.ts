/**
 * The CLI's SSH side (ssh2 client): connect to a machine's gateway with a
 * private key, pin the gateway's host key exactly (the one the coordinator
 * reported), run a command streaming its output, or open an interactive
 * shell. The data plane goes straight to the agent, never through the
 * coordinator.
 */
import ssh2 from "ssh2";
import type { ClientChannel } from "ssh2";
import { constants as osConstants } from "node:os";
import { BerthError } from "../core/errors.js";

export interface SshTarget {
  host: string;
  port: number;
  user: string;
  /** The gateway's host key, one OpenSSH public key line; connections to anything else are refused. */
  hostKey: string;
  privateKey: string;
}

function hostKeyBlob(line: string): Buffer {
  const b64 = line.trim().split(/\s+/)[1];
  if (!b64) throw new BerthError("invalid_request", "invalid_request: the machine has no pinned host key; refusing to connect");
  return Buffer.from(b64, "base64");
}

export function connect(t: SshTarget, timeoutMs = 15_000): Promise<ssh2.Client> {
  const pinned = hostKeyBlob(t.hostKey);
  return new Promise((resolve, reject) => {
    const c = new ssh2.Client();
    c.once("ready", () => resolve(c));
    // Not once: ssh2 can emit a second error (e.g. "Connection lost before handshake" after a
    // handshake timeout), and an unheard error event would crash the whole CLI.
    c.on("error", (e) => reject(new BerthError("provider_unavailable", `provider_unavailable: SSH to ${t.user}@${t.host}:${t.port} failed: ${e.message}`)));
    c.connect({
      host: t.host,
      port: t.port,
      username: t.user,
      privateKey: t.privateKey,
      readyTimeout: timeoutMs,
      hostVerifier: (key: Buffer) => key.equals(pinned),
      keepaliveInterval: 15_000,
    });
  });
}

export interface ExecResult {
  code: number | null;
  signal: string | null;
  /** The connection ended without an exit status (cut by revocation, expiry or a network failure). */
  cut: boolean;
}

/** Runs one command, piping its output to ours; resolves with its exit status. */
export function execStreaming(
  c: ssh2.Client,
  command: string,
  io: { stdout: NodeJS.WritableStream; stderr: NodeJS.WritableStream; stdin?: NodeJS.ReadableStream | null; onFirstByte?: () => void },
): Promise<ExecResult> {
  return new Promise((resolve, reject) => {
    c.exec(command, (err, ch: ClientChannel) => {
      if (err) return reject(new BerthError("operation_failed", `operation_failed: the machine refused the command: ${err.message}`));
      let code: number | null = null;
      let signal: string | null = null;
      let first = false;
      const mark = () => {
        if (!first) {
          first = true;
          io.onFirstByte?.();
        }
      };
      ch.on("exit", (c2: number | null, sig?: string) => {
        code = c2;
        signal = sig ?? null;
      });
      ch.on("data", (d: Buffer) => {
        mark();
        io.stdout.write(d);
      });
      ch.stderr.on("data", (d: Buffer) => {
        mark();
        io.stderr.write(d);
      });
      if (io.stdin) io.stdin.pipe(ch);
      else ch.end();
      ch.on("close", () => resolve({ code, signal, cut: code === null && signal === null }));
    });
  });
}

export interface SessionRequest {
  /** null: the machine's login shell. */
  command: string | null;
  /** A PTY of this size and terminal type, or none (plain pipes). */
  pty: { rows: number; cols: number; term: string } | null;
  /** Sent as SSH `env` requests (the agent passes LANG, LC_*, TERM, TZ and BERTH_*). */
  env?: Record<string, string>;
}

/** Open one session channel: a shell or a command, with or without a PTY. */
export function openSession(c: ssh2.Client, req: SessionRequest): Promise<ClientChannel> {
  const pty = req.pty ? { rows: req.pty.rows, cols: req.pty.cols, term: req.pty.term, width: 0, height: 0, modes: {} } : false;
  const opts = { ...(req.env ? { env: req.env } : {}) };
  return new Promise((resolve, reject) => {
    const done = (err: Error | undefined, ch: ClientChannel) => {
      if (err) reject(new BerthError("operation_failed", `operation_failed: the machine refused the session: ${err.message}`));
      else resolve(ch);
    };
    if (req.command === null) c.shell(pty, opts, done);
    else c.exec(req.command, { ...opts, ...(pty ? { pty } : {}) }, done);
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
