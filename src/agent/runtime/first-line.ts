/**
 * The "first line" capture of runtime/streams.ts: the gvisor runtime's exec
 * wrapper prints one identity line before it execs the command; it is taken
 * out of the stream and never reaches the borrower's output.
 */
/**
 * Strips the first line (up to and including "\n") from a byte stream and
 * hands it to `onLine` (with a trailing "\r" removed); `onLine(null)` if the
 * stream ends first.
 */
export class FirstLine {
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
