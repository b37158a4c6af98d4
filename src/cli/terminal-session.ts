/**
 * One interactive SSH session on the local terminal (`berth ssh`; the terminal
 * contract is in commands/ssh.ts's header). Its steps: open the session
 * channel (a PTY of the current window size when stdin and stdout are a
 * terminal); wire the channel (output, exit status, close, connection error);
 * wire the local process (Ctrl-Z suspend and SIGCONT, SIGWINCH, the
 * forwarded signals with their grace, stdin, restore at exit); and finish
 * once, undoing every listener and restoring the terminal on every way out.
 */
import type { Client, ClientChannel } from "ssh2";
import { exitStatusOf, type SshConnection } from "../client/ssh.js";

const SIGNAL_EXIT: Partial<Record<NodeJS.Signals, number>> = { SIGHUP: 129, SIGINT: 130, SIGTERM: 143 };
const SIGNAL_GRACE_MS = 3_000;
const CTRL_Z = 0x1a;
const FORWARDED = ["SIGTERM", "SIGHUP", "SIGINT"] as const;

/** The local terminal: raw mode on and off, idempotent, restorable from anywhere (also synchronously at exit). */
class LocalTerminal {
  private raw = false;
  constructor(private readonly stdin: NodeJS.ReadStream) {}
  enter(): void {
    if (!this.stdin.isTTY || this.raw) return;
    this.stdin.setRawMode(true);
    this.raw = true;
  }
  restore(): void {
    if (!this.stdin.isTTY || !this.raw) return;
    try {
      this.stdin.setRawMode(false);
    } catch {
      /* the terminal is gone */
    }
    this.raw = false;
  }
}

/** The terminal's size now. */
function windowSize(stdout: NodeJS.WriteStream): { cols: number; rows: number } {
  // Node caches the size and refreshes it on SIGWINCH, but a resize while berth was
  // stopped signalled the local shell, not berth: ask the terminal again (ioctl).
  (stdout as unknown as { _refreshSize?: () => void })._refreshSize?.();
  const [cols, rows] = stdout.getWindowSize();
  return { cols: Math.max(1, cols || 80), rows: Math.max(1, rows || 24) };
}

/** Run one interactive session over `client`; resolves with the exit status for berth. */
export async function interactive(conn: SshConnection, command: string | null, env: Record<string, string>): Promise<number> {
  const tty = Boolean(process.stdin.isTTY && process.stdout.isTTY);
  const ch: ClientChannel = await conn.openSession({
    command,
    pty: tty ? { ...windowSize(process.stdout), term: process.env.TERM || "xterm-256color" } : null,
    env,
  });
  return new Promise<number>((resolveStatus) => new TerminalSession(conn.client, ch, tty, resolveStatus).start());
}

/** One open session channel tied to the local terminal and process until it finishes. */
class TerminalSession {
  private readonly stdin = process.stdin;
  private readonly stdout = process.stdout;
  private readonly term = new LocalTerminal(process.stdin);
  private code: number | null = null;
  private signal: string | null = null;
  private gotStatus = false;
  private finished = false;
  /** The first forwarded signal; a second one closes the session. */
  private signalled: NodeJS.Signals | null = null;
  private grace: NodeJS.Timeout | null = null;

  constructor(
    private readonly client: Client,
    private readonly ch: ClientChannel,
    private readonly tty: boolean,
    private readonly resolveStatus: (status: number) => void,
  ) {}

  start(): void {
    this.wireChannel();
    this.wireProcess();
  }

  /** The channel's output, its exit status, and the ways it or the connection end. */
  private wireChannel(): void {
    const { ch, client } = this;
    ch.on("data", (b: Buffer) => this.stdout.write(b));
    ch.stderr.on("data", (b: Buffer) => process.stderr.write(b));
    ch.on("exit", (c: number | null, sig?: string) => {
      this.gotStatus = true;
      if (typeof c === "number") this.code = c;
      else this.signal = sig ?? null;
    });
    ch.on("close", () => {
      if (this.gotStatus) this.finish(exitStatusOf(this.code, this.signal));
      else this.finish(255, "berth: the session ended without an exit status (the connection was cut, or access ended)\r\n");
    });
    client.on("error", (e: Error) => this.finish(255, `berth: SSH connection failed: ${e.message}\r\n`));
    client.on("close", () => {
      if (this.gotStatus) this.finish(exitStatusOf(this.code, this.signal));
      else this.finish(255, "berth: the SSH connection closed without an exit status\r\n");
    });
  }

  /** The local side: restore at exit, forwarded signals, the terminal's suspend/resume/resize, and stdin. */
  private wireProcess(): void {
    process.on("exit", this.onExitRestore);
    for (const s of FORWARDED) process.on(s, this.onKill);
    if (this.tty) {
      process.on("SIGWINCH", this.sendSize);
      process.on("SIGCONT", this.onCont);
      process.on("SIGTSTP", this.onStopSignal);
      this.term.enter();
    }
    this.stdin.on("data", this.onInput);
    this.stdin.on("end", this.onStdinEnd);
    this.stdin.resume();
  }

  private readonly sendSize = (): void => {
    if (!this.tty || this.finished) return;
    const s = windowSize(this.stdout);
    this.ch.setWindow(s.rows, s.cols, 0, 0);
  };

  private readonly onInput = (buf: Buffer): void => {
    if (!this.tty) return void this.ch.write(buf);
    // Ctrl-Z is the local suspend; everything else goes to the remote terminal as typed.
    let from = 0;
    for (let i = 0; i < buf.length; i++) {
      if (buf[i] !== CTRL_Z) continue;
      if (i > from) this.ch.write(buf.subarray(from, i));
      from = i + 1;
      this.suspend();
    }
    if (from < buf.length) this.ch.write(from === 0 ? buf : buf.subarray(from));
  };

  private suspend(): void {
    // Terminal first, so the local shell gets a sane terminal back; then stop ourselves.
    this.term.restore();
    this.stdin.pause();
    process.kill(process.pid, "SIGSTOP");
  }

  private readonly onCont = (): void => {
    if (this.finished) return;
    this.term.enter();
    this.stdin.resume();
    this.sendSize();
  };

  private readonly onStopSignal = (): void => this.suspend();

  // Like `berth run`: the signal goes to the remote command, which has a grace to end;
  // a second signal (or the grace running out) closes the session.
  private readonly onKill = (sig: NodeJS.Signals): void => {
    if (this.signalled !== null) return this.finish(SIGNAL_EXIT[this.signalled] ?? 1, `berth: ${sig}: closing the session\r\n`);
    this.signalled = sig;
    try {
      this.ch.signal(sig.slice(3));
    } catch {
      /* the channel is already closed */
    }
    this.grace = setTimeout(() => this.finish(SIGNAL_EXIT[sig] ?? 1, `berth: ${sig}: the command did not end; closing the session\r\n`), SIGNAL_GRACE_MS);
  };

  private readonly onExitRestore = (): void => this.term.restore();

  private readonly onStdinEnd = (): void => {
    if (!this.tty) this.ch.end();
  };

  /** Once: every listener off, the terminal restored, the channel and connection closed, the status given. */
  private finish(status: number, note?: string): void {
    if (this.finished) return;
    this.finished = true;
    if (this.grace) clearTimeout(this.grace);
    if (this.signalled !== null) status = SIGNAL_EXIT[this.signalled] ?? status;
    this.term.restore();
    this.stdin.off("data", this.onInput);
    this.stdin.off("end", this.onStdinEnd);
    this.stdin.pause();
    process.off("SIGWINCH", this.sendSize);
    process.off("SIGCONT", this.onCont);
    process.off("SIGTSTP", this.onStopSignal);
    for (const s of FORWARDED) process.off(s, this.onKill);
    process.off("exit", this.onExitRestore);
    if (note) process.stderr.write(note);
    try {
      this.ch.close();
    } catch {
      /* already closed */
    }
    this.client.end();
    this.resolveStatus(status);
  }
}
