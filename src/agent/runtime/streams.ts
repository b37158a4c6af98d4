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
import { PassThrough, Readable, Writable } from "node:stream";
import type { ChildProcess } from "node:child_process";
import { constants } from "node:os";
import type { IPty } from "node-pty";

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

/**
 * Strips the first line (up to and including "\n") from a byte stream and
 * hands it to `onLine` (with a trailing "\r" removed); `onLine(null)` if the
 * stream ends first.
 */
class FirstLine {
  private buf: Buffer[] = [];
  private len = 0;
  private done = false;
  constructor(private readonly onLine: (line: string | null) => void) {}
  /** Returns the bytes to pass on (possibly empty). */
  feed(chunk: Buffer): Buffer {
    if (this.done) return chunk;
    const nl = chunk.indexOf(0x0a);
    if (nl < 0) {
      this.buf.push(chunk);
      this.len += chunk.length;
      if (this.len > 65536) {
        // Not an identity line; give up capturing and pass everything on.
        this.done = true;
        this.onLine(null);
        const all = Buffer.concat(this.buf);
        this.buf = [];
        return all;
      }
      return Buffer.alloc(0);
    }
    this.buf.push(chunk.subarray(0, nl));
    const line = Buffer.concat(this.buf).toString("latin1").replace(/\r$/, "");
    this.buf = [];
    this.done = true;
    this.onLine(line);
    return chunk.subarray(nl + 1);
  }
  end(): void {
    if (!this.done) {
      this.done = true;
      this.onLine(null);
    }
  }
}

export function fromPty(p: IPty, firstLine?: (line: string | null) => void): Plumbing {
  const stdout = new PassThrough({ highWaterMark: 64 * 1024 });
  let pausedByCaller = false;
  let pausedByConsumer = false;
  const sync = (): void => {
    if (pausedByCaller || pausedByConsumer) p.pause();
    else p.resume();
  };
  stdout.on("drain", () => {
    pausedByConsumer = false;
    sync();
  });
  const cap = firstLine ? new FirstLine(firstLine) : null;
  // encoding: null was requested at spawn, so data arrives as Buffers.
  p.onData((d: string | Buffer) => {
    let b = typeof d === "string" ? Buffer.from(d, "utf8") : d;
    if (cap) b = cap.feed(b);
    if (b.length === 0) return;
    if (!stdout.write(b)) {
      pausedByConsumer = true;
      sync();
    }
  });
  const exited = new Promise<ExitStatus>((resolve) => {
    p.onExit(({ exitCode, signal }) => {
      cap?.end();
      stdout.end();
      if (signal) resolve({ code: null, signal: SIGNAL_NAMES[signal] ?? String(signal) });
      else resolve({ code: exitCode, signal: null });
    });
  });
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
  return {
    stdin,
    stdout,
    stderr: emptyReadable(),
    pause() {
      pausedByCaller = true;
      sync();
    },
    resume() {
      pausedByCaller = false;
      sync();
    },
    exited,
  };
}

export function fromChild(child: ChildProcess, stderrFirstLine?: (line: string | null) => void): Plumbing {
  const stdout = child.stdout as Readable;
  let stderr = child.stderr as Readable;
  if (stderrFirstLine) {
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
