/** A writable stream that keeps what is written to it, for reading a command's output in tests. */
import { Writable } from "node:stream";

export function sink(): { stream: Writable; text: () => string } {
  let buf = "";
  return {
    stream: new Writable({
      write(chunk: Buffer, _e, cb) {
        buf += chunk.toString();
        cb();
      },
    }),
    text: () => buf,
  };
}
