/**
 * Command output as `berth mcp` keeps it: a model sees the first bytes of each
 * stream in the tool result, and reads the rest by offset (`read_output`).
 *
 * Memory is bounded whatever a command prints: each stream keeps at most its
 * inline size in memory; past that, everything (the inline part included) is
 * streamed to a spill file, with backpressure: a chunk is taken from the SSH
 * channel only after the previous one was written, so the channel's window
 * (not the output's size) bounds what is in flight.
 *
 * Spill files live in one directory per session (0700, files 0600), deleted
 * when the session ends. Their total is bounded per session (`spillLimit`):
 * to make room, the oldest finished outputs' files are deleted first (reading
 * them then says so); a single output larger than the limit keeps its first
 * `spillLimit` bytes and says how many it dropped.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { open, type FileHandle } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Writable } from "node:stream";
import { ToolError } from "./errors.js";

export interface OutputLimits {
  /** Bytes of each stream kept in memory and shown inline. */
  inlineBytes: number;
  /** Spill bytes kept per session, over all outputs. */
  spillLimit: number;
  /** Where the session's spill directory is made (default: the system's temp directory). */
  spillDir?: string;
}

/** The end of the longest prefix of `buf` (at most `max` bytes) that does not cut a UTF-8 sequence. */
export function utf8Boundary(buf: Buffer, max: number): number {
  if (buf.length <= max) return buf.length;
  let end = max;
  // Step back over continuation bytes (10xxxxxx) to the start of the cut sequence.
  while (end > 0 && end > max - 4 && (buf[end]! & 0xc0) === 0x80) end--;
  return end;
}

/** The length of `buf` without a UTF-8 sequence cut off at its end. */
export function wholeUtf8(buf: Buffer): number {
  let i = buf.length - 1;
  let back = 0;
  while (i >= 0 && back < 3 && (buf[i]! & 0xc0) === 0x80) {
    i--;
    back++;
  }
  if (i < 0) return buf.length;
  const lead = buf[i]!;
  const need = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc0 ? 2 : 1;
  return buf.length - i >= need ? buf.length : i;
}

export class StreamCapture extends Writable {
  #head: Buffer[] = [];
  #headBytes = 0;
  #file: FileHandle | null = null;
  #opening: Promise<FileHandle> | null = null;
  /** Bytes the command wrote on this stream. */
  total = 0;
  /** Bytes kept in the spill file (0 while the output fits inline). */
  spilled = 0;
  /** Bytes not kept: the session's spill limit was reached. */
  dropped = 0;
  /** The spill file was deleted to make room for newer output. */
  evicted = false;
  #ended = false;

  constructor(
    private readonly store: OutputStore,
    readonly path: string,
  ) {
    super({ highWaterMark: 64 * 1024 });
  }

  get inMemory(): boolean {
    return this.#file === null && this.#opening === null && !this.evicted;
  }

  get finished(): boolean {
    return this.#ended;
  }

  /** The first bytes (at most the inline size), for the tool result. */
  head(): Buffer {
    return Buffer.concat(this.#head, this.#headBytes);
  }

  override _write(chunk: Buffer, _enc: BufferEncoding, cb: (e?: Error | null) => void): void {
    this.total += chunk.length;
    const inline = this.store.limits.inlineBytes;
    if (this.#file === null && this.#opening === null && this.#headBytes + chunk.length <= inline) {
      this.#head.push(chunk);
      this.#headBytes += chunk.length;
      return cb();
    }
    this.#spill(chunk).then(() => cb(), (e: unknown) => cb(e as Error));
  }

  async #spill(chunk: Buffer): Promise<void> {
    if (this.#file === null) {
      // The whole output goes to the file, the part already held in memory first.
      this.#opening ??= open(this.path, "wx", 0o600);
      this.#file = await this.#opening;
      const held = this.head();
      await this.#append(held);
      // Memory keeps only the inline part from here on.
      const inline = this.store.limits.inlineBytes;
      const room = inline - held.length;
      if (room > 0) {
        const part = chunk.subarray(0, room);
        this.#head.push(part);
        this.#headBytes += part.length;
      }
    }
    await this.#append(chunk);
  }

  async #append(buf: Buffer): Promise<void> {
    if (buf.length === 0) return;
    const allowed = this.evicted ? 0 : this.store.reserve(this, buf.length);
    if (allowed > 0) {
      await this.#file!.write(buf, 0, allowed, this.spilled);
      this.spilled += allowed;
    }
    this.dropped += buf.length - allowed;
  }

  override _final(cb: (e?: Error | null) => void): void {
    this.#ended = true;
    const f = this.#file;
    if (!f) return cb();
    f.close().then(() => cb(), (e: unknown) => cb(e as Error));
  }

  /** Delete the spill file (to make room, or at the end of the session). */
  evict(): number {
    const freed = this.spilled;
    this.evicted = true;
    rmSync(this.path, { force: true });
    return freed;
  }

  /** Bytes from `offset` (at most `length`), exactly as the command wrote them. */
  async read(offset: number, length: number): Promise<Buffer> {
    if (this.#file === null && this.#opening === null) {
      return this.head().subarray(offset, offset + length);
    }
    if (this.evicted) throw new ToolError("unknown_output", `unknown_output: this output's spill file was deleted to keep the session under its spill limit (${this.store.limits.spillLimit} bytes); rerun the command, redirecting its output to a file on the machine`);
    const end = Math.min(this.spilled, offset + length);
    if (offset >= end) return Buffer.alloc(0);
    const fh = await open(this.path, "r");
    try {
      const buf = Buffer.alloc(end - offset);
      const { bytesRead } = await fh.read(buf, 0, buf.length, offset);
      return buf.subarray(0, bytesRead);
    } finally {
      await fh.close();
    }
  }

  /** How much of the stream can be read back with read_output. */
  get retrievable(): number {
    if (this.inMemory) return this.#headBytes;
    return this.evicted ? 0 : this.spilled;
  }
}

export interface CapturedOutput {
  id: string;
  handle: string;
  stdout: StreamCapture;
  stderr: StreamCapture;
  createdAt: number;
}

/** One session's outputs and their spill directory. */
export class OutputStore {
  #dir: string | null = null;
  #next = 1;
  readonly #outputs = new Map<string, CapturedOutput>();
  #spilled = 0;

  constructor(readonly limits: OutputLimits) {}

  #directory(): string {
    // mkdtemp makes it 0700: the files' names and sizes are this session's business only.
    this.#dir ??= mkdtempSync(join(this.limits.spillDir ?? tmpdir(), "berth-mcp-"));
    return this.#dir;
  }

  /** The directory spill files go to, or null while none was needed. */
  get directory(): string | null {
    return this.#dir;
  }

  /** Total bytes in spill files now. */
  get spilledBytes(): number {
    return this.#spilled;
  }

  create(handle: string): CapturedOutput {
    const id = `out_${this.#next++}`;
    const dir = this.#directory();
    const o: CapturedOutput = { id, handle, stdout: new StreamCapture(this, join(dir, `${id}.stdout`)), stderr: new StreamCapture(this, join(dir, `${id}.stderr`)), createdAt: Date.now() };
    this.#outputs.set(id, o);
    return o;
  }

  get(id: string): CapturedOutput {
    const o = this.#outputs.get(id);
    if (!o) throw new ToolError("unknown_output", `unknown_output: no output ${JSON.stringify(id)} in this session`);
    return o;
  }

  /** An output that fit inline has nothing to read back: forget it. */
  forget(id: string): void {
    this.#outputs.delete(id);
  }

  /**
   * Room for `want` more spill bytes of `who`: the oldest finished outputs' files are deleted
   * until it fits; what still does not fit is refused (the caller counts it as dropped).
   */
  reserve(who: StreamCapture, want: number): number {
    const limit = this.limits.spillLimit;
    if (this.#spilled + want > limit) {
      for (const o of this.#outputs.values()) {
        for (const s of [o.stdout, o.stderr]) {
          if (s === who || !s.finished || s.evicted || s.spilled === 0) continue;
          this.#spilled -= s.evict();
          if (this.#spilled + want <= limit) break;
        }
        if (this.#spilled + want <= limit) break;
      }
    }
    const allowed = Math.max(0, Math.min(want, limit - this.#spilled));
    this.#spilled += allowed;
    return allowed;
  }

  /** Delete every spill file and the directory. */
  close(): void {
    this.#outputs.clear();
    if (this.#dir) rmSync(this.#dir, { recursive: true, force: true });
    this.#dir = null;
    this.#spilled = 0;
  }
}
