/**
 * Progress of a borrow that waits for a ready machine (`berth borrow --wait`,
 * `berth run --wait`), on stderr: one line each time the reason changes (the
 * coordinator's words: at its maximum with every machine lent, hosts full and
 * which pool holds the slots, machines being made …), so a log shows why the
 * wait lasted; on a terminal a counter of the time waited follows the line.
 */
import { formatDuration } from "../core/durations.js";

export interface WaitProgress {
  onWait(waitedMs: number, why: string): void;
  /** A machine was lent (or the wait ended): end the counter's line. */
  done(): void;
}

export function waitProgress(pool: string, waitMs: number, quiet: boolean, stream: NodeJS.WriteStream = process.stderr): WaitProgress {
  let lastWhy = "";
  let counting = false;
  const tty = Boolean(stream.isTTY);
  return {
    onWait(waitedMs, why) {
      if (quiet) return;
      const reason = why.replace(/; try again shortly.*$/, "");
      if (reason !== lastWhy) {
        if (counting) stream.write("\n");
        counting = false;
        stream.write(`berth: waiting up to ${formatDuration(waitMs)} for a machine of pool ${pool}: ${reason}\n`);
        lastWhy = reason;
      }
      if (tty) {
        counting = true;
        stream.write(`\rberth: waited ${(waitedMs / 1000).toFixed(1)}s of ${formatDuration(waitMs)}…`);
      }
    },
    done() {
      if (counting) stream.write("\n");
      counting = false;
    },
  };
}
