/**
 * Stream plumbing shared by both runtimes: turns a piped child process or a
 * node-pty terminal into the stdin/stdout/stderr/pause/resume/exited part of
 * an ExecHandle.
 *
 * Backpressure: PTY output is pushed into a bounded PassThrough; when the
 * consumer stops reading (write() returns false) the PTY master is paused, so
 * the kernel's PTY buffer — not agent memory — absorbs a flood.
 *
 * Optional "first line" capture: the gvisor runtime's exec wrapper prints one
 * identity line (the in-sandbox leader's /proc/self/stat) before it execs the
 * command. That line is taken out of the stream here and never reaches the
 * borrower's output.
 */
import { readSync } from "node:fs";
import { PassThrough, Readable, Writable } from "node:stream";
import type { ChildProcess } from "node:child_process";
import { constants } from "node:os";
import type { IPty } from "node-pty";
import { FirstLine } from "./first-line.js";

export type ExitStatus = { code: number | null; signal: string | null };

export interface Plumbing {
  stdin: Writable;
  stdout: Readable;
  stderr: Readable;
  pause(): void;
  resume(): void;
  exited: Promise<ExitStatus>;
}

export const IDENTITY_PREFIX = "\x1eberth-leader ";

const SIGNAL_NAMES: Record<number, string> = Object.fromEntries(
  Object.entries(constants.signals).map(([name, n]) => [n, name]),
);

function emptyReadable(): Readable {
  const r = new PassThrough();
  r.end();
  return r;
}

/** After the command exited, the master counts as drained once it stayed silent this long while being read. */
const EXIT_QUIET_MS = 250;

/**
 * PTY plumbing. End of output, exactly. Three things lose the tail of a
 * command's output when it exits with output still pending, and each is
 * handled here:
 *   1. libuv ends a stream on POLLHUP after a short read (the slave was closed
 *      and a PTY read never fills libuv's buffer), while the kernel still holds
 *      up to ~64 KiB for the master: on the socket's 'end' the rest is read
 *      synchronously from the master (non-blocking) until EIO/EAGAIN.
 *   2. node-pty destroys the master ~200 ms after the child exits whether or not
 *      output is pending (e.g. the master is paused by backpressure): that
 *      destroy is taken over, and the master is read on (with backpressure)
 *      until EOF, until it stayed silent for EXIT_QUIET_MS while being read (a
 *      background process still holds the terminal), or until the consumer
 *      destroys our output stream (session release).
 *   3. a read error destroys the socket with the bytes it had read but not yet
 *      emitted (paused): those are handed on first.
 * node-pty reports the exit only once its socket closed, so `exited` resolves
 * after the last byte was written to stdout. Extra memory is bounded by the
 * kernel's PTY buffer.
 */
export function fromPty(p: IPty, firstLine?: (line: string | null) => void): Plumbing {
  const out = new PtyOutput(p, firstLine);
  // encoding: null was requested at spawn, so data arrives as Buffers.
  p.onData(out.take);
  const stopQuiet = readMasterToEnd(p, out);
  const exited = new Promise<ExitStatus>((resolve) => {
    p.onExit(({ exitCode, signal }) => {
      stopQuiet();
      out.end();
      if (signal) resolve({ code: null, signal: SIGNAL_NAMES[signal] ?? String(signal) });
      else resolve({ code: exitCode, signal: null });
    });
  });
  return {
    stdin: ptyStdin(p),
    stdout: out.stdout,
    stderr: emptyReadable(),
    pause() {
      out.pausedByCaller = true;
      out.sync();
    },
    resume() {
      out.pausedByCaller = false;
      out.sync();
    },
    exited,
  };
}

/** The PTY's output: bytes into a bounded `stdout`, the master paused while the caller or the consumer holds it. */
class PtyOutput {
  readonly stdout = new PassThrough({ highWaterMark: 64 * 1024 });
  pausedByCaller = false;
  pausedByConsumer = false;
  /** When the master last gave bytes (epoch ms). */
  lastData = Date.now();
  readonly #cap: FirstLine | null;

  constructor(
    private readonly p: IPty,
    firstLine?: (line: string | null) => void,
  ) {
    this.stdout.on("drain", () => {
      this.pausedByConsumer = false;
      this.sync();
    });
    this.#cap = firstLine ? new FirstLine(firstLine) : null;
  }

  get reading(): boolean {
    return !this.pausedByCaller && !this.pausedByConsumer;
  }

  sync(): void {
    if (this.reading) this.p.resume();
    else this.p.pause();
  }

  readonly take = (d: string | Buffer): void => {
    this.lastData = Date.now();
    let b = typeof d === "string" ? Buffer.from(d, "utf8") : d;
    if (this.#cap) b = this.#cap.feed(b);
    if (b.length === 0) return;
    if (!this.stdout.write(b)) {
      this.pausedByConsumer = true;
      this.sync();
    }
  };

  /** The command exited and the master is closed: no first line is coming, and no more output. */
  end(): void {
    this.#cap?.end();
    this.stdout.end();
  }
}

/**
 * (1)–(3) above: takes over the end, the errors and node-pty's destroy of the
 * master, so its output is read to the end. Returns what stops the silence
 * watch (once the command's exit is reported).
 */
function readMasterToEnd(p: IPty, out: PtyOutput): () => void {
  // node-pty's read side: a tty.ReadStream on the master (a private field; without it the
  // stock behaviour remains, which can lose the tail as described above).
  const sock = (p as unknown as { _socket?: Readable & { fd?: number } })._socket;
  let masterClosed = false;
  let quiet: NodeJS.Timeout | null = null;
  const stopQuiet = (): void => {
    if (quiet) clearInterval(quiet);
  };
  if (!sock || typeof sock.destroy !== "function") return stopQuiet;
  const realDestroy = sock.destroy.bind(sock);
  const closeMaster = (err?: Error): void => {
    if (masterClosed) return;
    masterClosed = true;
    stopQuiet();
    realDestroy(err);
  };
  sock.on("end", () => {
    // (1) libuv's early EOF: the rest is still in the kernel. The fd is open until closeMaster.
    const fd = (p as unknown as { fd?: number }).fd ?? sock.fd;
    if (typeof fd === "number" && fd >= 0 && !masterClosed) readRest(fd, out.take);
    closeMaster();
  });
  sock.destroy = (err?: Error) => {
    if (masterClosed) return sock;
    if (err) {
      // (3) Hand on what was read before the error (read() emits it as 'data'), then close.
      while (sock.readableLength > 0 && sock.read() !== null) {
        /* each chunk went through take() */
      }
      closeMaster(err);
      return sock;
    }
    // (2) node-pty's exit timer: keep reading until EOF, silence, or release.
    quiet ??= setInterval(() => {
      if (out.reading && sock.readableLength === 0 && Date.now() - out.lastData >= EXIT_QUIET_MS) closeMaster();
    }, 50);
    return sock;
  };
  // Our consumer is gone (session release destroys the streams): close the master now.
  out.stdout.on("close", () => closeMaster());
  return stopQuiet;
}

/** Reads what the kernel still holds for the master (non-blocking) until EIO or EAGAIN. */
function readRest(fd: number, take: (b: Buffer) => void): void {
  const buf = Buffer.allocUnsafe(64 * 1024);
  for (;;) {
    let n: number;
    try {
      n = readSync(fd, buf, 0, buf.length, null);
    } catch {
      break; // EIO (every slave end closed, nothing left) or EAGAIN
    }
    if (n <= 0) break;
    take(Buffer.from(buf.subarray(0, n)));
  }
}

/** The terminal's input; its end is the VEOF character. */
function ptyStdin(p: IPty): Writable {
  const stdin = new Writable({
    write(chunk: Buffer, _enc, cb) {
      try {
        p.write(chunk);
        cb();
      } catch (e) {
        cb(e as Error);
      }
    },
    final(cb) {
      // EOF on a terminal is the VEOF character, as a user's Ctrl-D would send.
      try {
        p.write("\x04");
      } catch {
        /* terminal already gone */
      }
      cb();
    },
  });
  stdin.on("error", () => {});
  return stdin;
}

/**
 * A child's output pipe as a stream that keeps its end for a consumer that
 * attaches late. A pipe socket that reaches EOF with nothing buffered emits
 * 'end' at once, to nobody, and is destroyed: a caller that attaches its
 * listeners after `exec` resolved (a command with no output that already
 * exited) would wait for that end for ever. Backpressure passes through
 * (pipe); a read error ends the stream.
 */
function held(src: Readable): Readable {
  const out = new PassThrough();
  src.pipe(out);
  src.on("error", () => out.end());
  out.on("close", () => src.destroy());
  return out;
}

export function fromChild(child: ChildProcess, stderrFirstLine?: (line: string | null) => void): Plumbing {
  const stdout = held(child.stdout as Readable);
  let stderr = child.stderr as Readable;
  if (!stderrFirstLine) stderr = held(stderr);
  else {
    const cap = new FirstLine(stderrFirstLine);
    const out = new PassThrough();
    const src = stderr;
    src.on("data", (c: Buffer) => {
      const b = cap.feed(c);
      if (b.length > 0 && !out.write(b)) src.pause();
    });
    out.on("drain", () => src.resume());
    src.on("end", () => {
      cap.end();
      out.end();
    });
    src.on("error", () => {
      cap.end();
      out.end();
    });
    stderr = out;
  }
  const stdin = child.stdin as Writable;
  stdin.on("error", () => {}); // EPIPE when the command exits without reading stdin
  const exited = new Promise<ExitStatus>((resolve) => {
    child.on("exit", (code, signal) => resolve({ code, signal }));
    child.on("error", () => resolve({ code: 127, signal: null }));
  });
  return {
    stdin,
    stdout,
    stderr,
    pause() {
      stdout.pause();
      stderr.pause();
    },
    resume() {
      stdout.resume();
      stderr.resume();
    },
    exited,
  };
}
