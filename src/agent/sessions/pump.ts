/**
 * The data path of one session: two bounded byte queues between the exec and
 * the SSH channel, with backpressure both ways.
 *
 * - Output (exec -> channel): at most ~256 KiB queued; past that the exec's
 *   output is paused, resumed below half. A chunk goes to the channel only
 *   while its write() does not report backpressure; 'drain' resumes it.
 * - Input (channel -> exec): at most ~64 KiB queued; past that the channel is
 *   paused (so the client's SSH window closes), resumed below half. A stdin
 *   write that reports backpressure waits for 'drain'. Client EOF ends a pipe
 *   session's stdin after the queued input; a PTY ignores it (as sshd does).
 *
 * The session's loop calls forwardInput/forwardOutput one chunk at a time,
 * after its control events; `poke` wakes that loop.
 */
import type { ServerChannel } from "ssh2";
import type { ExecHandle } from "../runtime/types.js";

const OUTPUT_BOUND = 256 * 1024;
const INPUT_BOUND = 64 * 1024;

type Chunk = { err: boolean; buf: Buffer };

export interface PumpHooks {
  /** Wake the session's loop. */
  poke: () => void;
  /** True once the session is being cut or released: new output is discarded. */
  discarding: () => boolean;
  /** True while terminal input is admitted. */
  admitting: () => boolean;
  /** True once the channel is closed (nothing more can be written). */
  channelClosed: () => boolean;
}

export class Pump {
  /** Last time output was read from the exec or handed to the SSH transport (epoch ms). */
  lastProgress = 0;
  /** The exec's stdout / stderr ended. */
  outEnded = false;
  errEnded = false;

  private readonly input: Buffer[] = [];
  private inputBytes = 0;
  private inputEof = false;
  private stdinBlocked = false;
  private channelPaused = false;

  private readonly output: Chunk[] = [];
  private outputBytes = 0;
  private execPaused = false;
  private channelBlocked = false;
  private pendingWrites = 0;

  constructor(
    private readonly h: ExecHandle,
    private readonly channel: ServerChannel,
    private readonly pty: boolean,
    private readonly hooks: PumpHooks,
  ) {}

  /** Queue the exec's output; note the ends of its streams. */
  wireExec(): void {
    const h = this.h;
    const onData = (err: boolean) => (buf: Buffer) => {
      this.lastProgress = Date.now();
      if (this.hooks.discarding()) return; // being released: discard
      this.output.push({ err, buf });
      this.outputBytes += buf.length;
      if (this.outputBytes >= OUTPUT_BOUND && !this.execPaused) {
        this.execPaused = true;
        h.pause();
      }
      this.hooks.poke();
    };
    h.stdout.on("data", onData(false));
    h.stderr.on("data", onData(true));
    h.stdout.on("end", () => ((this.outEnded = true), this.hooks.poke()));
    h.stderr.on("end", () => ((this.errEnded = true), this.hooks.poke()));
    h.stdout.on("close", () => ((this.outEnded = true), this.hooks.poke()));
    h.stderr.on("close", () => ((this.errEnded = true), this.hooks.poke()));
  }

  /** Queue the client's input while admitted; note its EOF. */
  wireChannel(): void {
    const ch = this.channel;
    ch.on("data", (buf: Buffer) => {
      if (!this.hooks.admitting()) return;
      this.input.push(buf);
      this.inputBytes += buf.length;
      if (this.inputBytes >= INPUT_BOUND && !this.channelPaused) {
        this.channelPaused = true;
        ch.pause();
      }
      this.hooks.poke();
    });
    ch.on("end", () => {
      this.inputEof = true;
      this.hooks.poke();
    });
  }

  /** One input chunk to the exec's stdin; false when nothing could be done. */
  forwardInput(): boolean {
    const h = this.h;
    if (this.stdinBlocked) return false;
    const buf = this.input.shift();
    if (!buf) {
      if (this.inputEof && !this.pty && h.stdin.writable) {
        h.stdin.end();
        return true;
      }
      return false;
    }
    this.inputBytes -= buf.length;
    if (this.channelPaused && this.inputBytes < INPUT_BOUND / 2) {
      this.channelPaused = false;
      this.channel.resume();
    }
    if (!h.stdin.writable) return true;
    if (!h.stdin.write(buf)) {
      this.stdinBlocked = true;
      h.stdin.once("drain", () => ((this.stdinBlocked = false), this.hooks.poke()));
    }
    return true;
  }

  /** One output chunk to the channel; false when nothing could be done. */
  forwardOutput(): boolean {
    if (this.channelBlocked || this.hooks.channelClosed()) return false;
    const c = this.output.shift();
    if (!c) return false;
    this.outputBytes -= c.buf.length;
    if (this.execPaused && this.outputBytes < OUTPUT_BOUND / 2) {
      this.execPaused = false;
      this.h.resume();
    }
    const stream = c.err ? this.channel.stderr : this.channel;
    this.pendingWrites++;
    const ok = stream.write(c.buf, () => {
      this.pendingWrites--;
      this.lastProgress = Date.now();
      this.hooks.poke();
    });
    if (!ok) {
      this.channelBlocked = true;
      stream.once("drain", () => {
        this.channelBlocked = false;
        this.lastProgress = Date.now();
        this.hooks.poke();
      });
    }
    return true;
  }

  /** Every queued output byte has been handed to the SSH transport. */
  get outputFlushed(): boolean {
    return this.output.length === 0 && this.pendingWrites === 0;
  }

  /** Drop queued input (completion, release). */
  dropInput(): void {
    this.input.length = 0;
  }

  /** Drop queued output (release). */
  dropOutput(): void {
    this.output.length = 0;
  }
}
