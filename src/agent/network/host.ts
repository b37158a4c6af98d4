/**
 * The host's network objects as the agent sees and changes them: `ip` and
 * `nft` commands, and the exact identities read back from the kernel
 * (network namespace inode, interface index, nftables table handle).
 * No records here; manager.ts owns those and their ordering.
 */
import { Worker } from "node:worker_threads";
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { BerthError } from "../../core/errors.js";
import type { CommandAnswer, CommandRequest, HoldRequest } from "./command-worker.js";

export const NETNS_DIR = "/run/netns";

export interface CmdResult {
  code: number;
  stdout: string;
  stderr: string;
}

/**
 * The commands' own thread (command-worker.ts), started at the first command
 * and kept while commands are in flight (unref'd when idle, so it never keeps
 * a process alive on its own). A thread that fails answers every pending
 * command with a failure (code 1) and is started again at the next one.
 */
let worker: Worker | null = null;
let nextId = 1;
const pending = new Map<number, (r: CmdResult) => void>();

function commandThread(): Worker {
  if (worker) return worker;
  const w = new Worker(new URL("./command-worker.js", import.meta.url));
  w.unref();
  w.on("message", (a: CommandAnswer) => {
    const done = pending.get(a.id);
    pending.delete(a.id);
    if (pending.size === 0) w.unref();
    done?.({ code: a.code, stdout: a.stdout, stderr: a.stderr });
  });
  const fail = (why: string): void => {
    if (worker === w) worker = null;
    for (const [id, done] of pending) {
      pending.delete(id);
      done({ code: 1, stdout: "", stderr: why });
    }
  };
  w.on("error", (e) => fail(`the command thread failed: ${e.message}`));
  w.on("exit", (code) => fail(`the command thread exited (${code})`));
  worker = w;
  return w;
}

/**
 * Fault point (tests): the next command `file` whose arguments start with
 * `args` is held in the thread that starts it, before its spawn — as a spawn
 * whose child is slow to exec holds that thread. `state[0]` is 1 while held
 * and 2 after; the hold ends when `state[1]` becomes non-zero (with
 * Atomics.notify) or after `boundMs`.
 */
export function holdNextCommand(hold: HoldRequest["hold"]): void {
  commandThread().postMessage({ hold } satisfies HoldRequest);
}

/**
 * Runs a command (no shell) on the commands' own thread, never on the
 * caller's: a spawn holds its thread until the child has exec'd. Never
 * rejects: a failure is a non-zero code.
 */
export function cmd(file: string, args: string[], input?: string, timeoutMs = 15_000): Promise<CmdResult> {
  return new Promise((resolve) => {
    const w = commandThread();
    const id = nextId++;
    pending.set(id, resolve);
    w.ref();
    w.postMessage({ id, file, args, ...(input !== undefined ? { input } : {}), timeoutMs } satisfies CommandRequest);
  });
}

/** Like cmd, but a non-zero exit throws operation_failed naming `what`. */
export async function must(file: string, args: string[], what: string, input?: string): Promise<string> {
  const r = await cmd(file, args, input);
  if (r.code !== 0) throw new BerthError("operation_failed", `operation_failed: ${what} failed (${file} exit ${r.code}): ${r.stderr.trim().slice(0, 300)}`);
  return r.stdout;
}

export function netnsPath(name: string): string {
  return `${NETNS_DIR}/${name}`;
}

/** Inode of a named network namespace (its exact identity), or null when absent. */
export function netnsInode(name: string): string | null {
  try {
    return statSync(netnsPath(name), { bigint: true }).ino.toString();
  } catch {
    return null;
  }
}

export function listNetns(): string[] {
  try {
    return readdirSync(NETNS_DIR);
  } catch {
    return [];
  }
}

/** Interface index of a host interface, or null when absent. */
export function ifindex(name: string): number | null {
  try {
    return Number(readFileSync(`/sys/class/net/${name}/ifindex`, "utf8").trim());
  } catch {
    return null;
  }
}

export function listLinks(): string[] {
  try {
    return readdirSync("/sys/class/net");
  } catch {
    return [];
  }
}

/** Every `inet` nftables table: name -> handle. */
export async function listTables(): Promise<Map<string, number>> {
  const out = await must("nft", ["-j", "list", "tables"], "listing nftables tables");
  const parsed = JSON.parse(out) as { nftables?: Array<{ table?: { family: string; name: string; handle: number } }> };
  const m = new Map<string, number>();
  for (const e of parsed.nftables ?? []) if (e.table && e.table.family === "inet") m.set(e.table.name, e.table.handle);
  return m;
}

/** Whether `ip` and `nft` can be used here (root, both installed). */
export function networkAvailability(): { ok: true } | { ok: false; why: string } {
  if (process.platform !== "linux") return { ok: false, why: "network policies need Linux" };
  if (process.getuid?.() !== 0) return { ok: false, why: "network policies need the agent to run as root" };
  const onPath = (b: string): boolean => ["/usr/sbin", "/sbin", "/usr/bin", "/bin"].some((d) => existsSync(`${d}/${b}`));
  if (!onPath("ip")) return { ok: false, why: "`ip` (iproute2) is not installed" };
  if (!onPath("nft")) return { ok: false, why: "`nft` (nftables) is not installed" };
  return { ok: true };
}
