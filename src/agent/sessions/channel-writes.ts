/**
 * Writes to a session channel that the client's window holds back are all
 * resumed once the window opens again.
 *
 * ssh2 (1.x) parks a write that meets a closed window (the client has not
 * yet taken what was sent) in fields of the channel — `_chunk`/`_chunkcb`
 * for stdout, `_chunkErr`/`_chunkcbErr` for stderr — and, on the client's
 * window adjust, resumes ONE of them, stdout first. It never clears them once
 * the write went out. Two failures follow, both seen when a client is slower
 * than the command (a busy machine, a client writing to a slow disk):
 *
 * - stdout and stderr parked together (a command that ends its output with a
 *   line on stderr): the adjust resumes stdout only. When the rest of stdout
 *   fits in the new window the client has no reason to adjust again, so the
 *   stderr write waits for ever: its callback never runs, the session never
 *   finishes draining, the exit status is never sent, and the client waits
 *   for the command's end for ever.
 * - a stdout write parked and resumed leaves its fields behind: a later
 *   stderr write that parks is "resumed" by sending the old stdout bytes
 *   again (duplicated output) and calling their callback a second time, while
 *   the stderr bytes stay parked.
 *
 * Each stream's `_write` is wrapped (on this channel only): it first forgets
 * that stream's parked write (the one being resumed is passed in as the
 * arguments, and a write that parks again records itself anew), and when it
 * went out whole, the other stream's parked write is resumed now if the
 * window has room, else at the next adjust. Nothing changes for a channel whose internals are not the
 * ones described (another ssh2 version): it is left as it is.
 */
import type { ServerChannel } from "ssh2";

type WriteFn = (data: Buffer, encoding: BufferEncoding | null, cb: (e?: Error | null) => void) => void;

/** The parts of ssh2's server channel that hold a parked write. */
interface ParkedWrites {
  _write: WriteFn;
  stderr: { _write: WriteFn };
  outgoing: { window: number };
  /** Set: the next window adjust resumes a parked write. */
  _waitWindow: boolean;
  _chunk: Buffer | undefined;
  _chunkcb: ((e?: Error | null) => void) | undefined;
  _chunkErr: Buffer | undefined;
  _chunkcbErr: ((e?: Error | null) => void) | undefined;
}

function hasParkedWrites(ch: unknown): ch is ParkedWrites {
  const c = ch as Partial<ParkedWrites>;
  return (
    typeof c._write === "function" &&
    typeof c.stderr?._write === "function" &&
    typeof c.outgoing?.window === "number" &&
    typeof c._waitWindow === "boolean" &&
    "_chunk" in c && "_chunkcb" in c && "_chunkErr" in c && "_chunkcbErr" in c
  );
}

/** Make every parked write on `channel` resume when the client's window opens (see the header). */
export function resumeAllParkedWrites(channel: ServerChannel): void {
  if (!hasParkedWrites(channel)) return;
  const c = channel;
  const writeOut = c._write.bind(c);
  const writeErr = c.stderr._write.bind(c.stderr);
  /** After one stream's write went out whole: the other's parked write goes now, or at the next adjust. */
  const resume = (data: Buffer | undefined, cb: ((e?: Error | null) => void) | undefined, write: WriteFn) => {
    if (data === undefined || cb === undefined) return;
    if (c.outgoing.window > 0) write(data, null, cb);
    else c._waitWindow = true; // the adjust that resumed this stream cleared it; the next one must find the other
  };
  c._write = (data, encoding, cb) => {
    c._chunk = undefined;
    c._chunkcb = undefined;
    writeOut(data, encoding, cb);
    if (c._chunk === undefined) resume(c._chunkErr, c._chunkcbErr, c.stderr._write);
  };
  c.stderr._write = (data, encoding, cb) => {
    c._chunkErr = undefined;
    c._chunkcbErr = undefined;
    writeErr(data, encoding, cb);
    if (c._chunkErr === undefined) resume(c._chunk, c._chunkcb, c._write);
  };
}
