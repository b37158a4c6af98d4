/**
 * The host's network objects as the agent sees and changes them: `ip` and
 * `nft` commands, and the exact identities read back from the kernel
 * (network namespace inode, interface index, nftables table handle).
 * No records here; manager.ts owns those and their ordering.
 */
import { execFile } from "node:child_process";
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { BerthError } from "../../core/errors.js";

export const NETNS_DIR = "/run/netns";

export interface CmdResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs a command (no shell); never rejects: a failure is a non-zero code. */
export function cmd(file: string, args: string[], input?: string, timeoutMs = 15_000): Promise<CmdResult> {
  return new Promise((resolve) => {
    const child = execFile(file, args, { timeout: timeoutMs, maxBuffer: 8 << 20 }, (err, stdout, stderr) => {
      const code = err ? (typeof (err as { code?: unknown }).code === "number" ? (err as { code: number }).code : 1) : 0;
      resolve({ code, stdout: String(stdout), stderr: String(stderr) });
    });
    if (input !== undefined) child.stdin?.end(input);
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
