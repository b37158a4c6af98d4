/**
 * One long-lived `nft -j -i` process for reading tables back: a spawn of
 * `nft` costs 10-25 ms on a loaded host, a line to an interactive one well
 * under a millisecond, which is what lets a lend-time comparison of a
 * machine's live rules stay cheap. Requests run one at a time; each answers
 * one JSON line on stdout, or an error on stderr, after which the process is
 * replaced (so no late stderr chunk can be taken for the next answer).
 * Only reads go through it; changes are `nft -f` transactions (manager.ts).
 */
import { spawn, type ChildProcessWithoutNullStreams } from "node:child_process";

interface Pending {
  resolve: (line: string) => void;
  reject: (e: Error) => void;
  timer: NodeJS.Timeout;
}

export class NftSession {
  #child: ChildProcessWithoutNullStreams | null = null;
  #buf = "";
  #pending: Pending | null = null;
  #queue: Promise<unknown> = Promise.resolve();
  #closed = false;

  #start(): ChildProcessWithoutNullStreams {
    const child = spawn("nft", ["-j", "-i"], { stdio: ["pipe", "pipe", "pipe"] });
    this.#buf = "";
    child.stdout.setEncoding("utf8");
    child.stdout.on("data", (d: string) => {
      this.#buf += d;
      let i: number;
      while ((i = this.#buf.indexOf("\n")) >= 0) {
        const line = this.#buf.slice(0, i);
        this.#buf = this.#buf.slice(i + 1);
        const p = this.#pending;
        if (p && line.trim() !== "") {
          this.#pending = null;
          clearTimeout(p.timer);
          p.resolve(line);
        }
      }
    });
    child.stderr.setEncoding("utf8");
    child.stderr.on("data", (d: string) => this.#fail(child, new Error(d.split("\n")[0]?.trim() || "nft error")));
    child.on("error", (e) => this.#fail(child, e));
    child.on("exit", () => this.#fail(child, new Error("nft exited")));
    child.stdin.on("error", () => undefined);
    // Never keeps the agent's event loop alive on its own.
    child.unref();
    (child.stdout as unknown as { unref?: () => void }).unref?.();
    (child.stderr as unknown as { unref?: () => void }).unref?.();
    (child.stdin as unknown as { unref?: () => void }).unref?.();
    return child;
  }

  #fail(child: ChildProcessWithoutNullStreams, e: Error): void {
    if (this.#child === child) {
      this.#child = null;
      child.kill("SIGKILL");
    }
    const p = this.#pending;
    if (p) {
      this.#pending = null;
      clearTimeout(p.timer);
      p.reject(e);
    }
  }

  /** Runs one read command (e.g. `list table inet NAME`) and resolves to its parsed JSON. */
  ask(command: string, timeoutMs = 5_000): Promise<unknown> {
    if (/[\n;]/.test(command)) return Promise.reject(new Error("one nft command per request"));
    const run = async (): Promise<unknown> => {
      if (this.#closed) throw new Error("the nft session is closed");
      const child = (this.#child ??= this.#start());
      const line = await new Promise<string>((resolve, reject) => {
        const timer = setTimeout(() => this.#fail(child, new Error(`nft did not answer within ${timeoutMs} ms`)), timeoutMs);
        this.#pending = { resolve, reject, timer };
        child.stdin.write(command + "\n");
      });
      return JSON.parse(line) as unknown;
    };
    const next = this.#queue.then(run, run);
    this.#queue = next.catch(() => undefined);
    return next;
  }

  close(): void {
    this.#closed = true;
    const c = this.#child;
    this.#child = null;
    c?.kill("SIGKILL");
  }
}
