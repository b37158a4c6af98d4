/**
 * A machine network's rules as they are in the kernel, and their comparison
 * with the ones recorded at set-up: the machine's nftables table (normalised:
 * handles kept, packet counts zeroed) and its namespace's addresses and
 * routes, each with a digest. Reads only; a mismatch is a verdict naming what
 * changed (`tampered` turns it into the refusal), never a repair.
 */
import { createHash } from "node:crypto";
import { BerthError } from "../../core/errors.js";
import { linesDiff, type RulesWitness } from "../../core/network-evidence.js";
import type { NetRecord } from "../store/networks.js";
import { cmd, ifindex, netnsInode } from "./host.js";
import type { NftSession } from "./nft-session.js";

/** The outcome of comparing a machine's live rules with the recorded ones. */
export type RulesVerdict =
  | { ok: true; digest: string; evidenceAt: number | null }
  | { ok: false; why: string; diff: string[] };

function digestOf(lines: readonly string[]): string {
  return "sha256:" + createHash("sha256").update(lines.join("\n")).digest("hex");
}

/** The refusal of a machine whose rules are not the recorded ones: what changed, for the audit timeline. */
export function tampered(machineId: string, v: Extract<RulesVerdict, { ok: false }>): BerthError {
  return new BerthError(
    "network_tampered",
    `network_tampered: the network rules of machine ${machineId} are not the ones recorded with its evidence: ${v.why}${v.diff.length > 0 ? `; diff: ${v.diff.join(" | ")}` : ""}; the machine is not lent again (quarantine and destroy it)`,
  );
}

/** The machine's table read back from the kernel: normalised lines (handles kept, packet counts zeroed) and the refuse chain's packet count. */
export async function liveTable(session: NftSession, table: string): Promise<{ lines: string[]; refused: number | null } | null> {
  let parsed: unknown;
  try {
    parsed = await session.ask(`list table inet ${table}`);
  } catch {
    return null;
  }
  const items = ((parsed as { nftables?: unknown[] }).nftables ?? []) as Array<Record<string, Record<string, unknown>>>;
  const lines: string[] = [];
  let refused: number | null = null;
  for (const item of items) {
    const [kind, body] = Object.entries(item)[0] ?? [];
    if (!kind || !body || kind === "metainfo") continue;
    if (kind === "rule" && body.chain === "refuse" && refused === null) {
      for (const x of (body.expr as Array<Record<string, { packets?: number }>>) ?? []) if (x.counter && typeof x.counter.packets === "number") refused = x.counter.packets;
    }
    lines.push(`${kind} ${JSON.stringify(body, (k, v: unknown) => (k === "counter" ? "counter" : v))}`);
  }
  return { lines, refused };
}

async function liveNamespace(netns: string): Promise<string[]> {
  const r = await cmd("ip", ["-n", netns, "-j", "-b", "-"], "addr show\nroute show\n");
  if (r.code !== 0) return [`unreadable: ${r.stderr.trim().slice(0, 200)}`];
  const out: string[] = [];
  for (const chunk of r.stdout.split("\n").filter((l) => l.trim().startsWith("["))) {
    for (const o of JSON.parse(chunk) as Array<Record<string, unknown>>) {
      if ("addr_info" in o) {
        out.push(`link ${String(o.ifname)} ${JSON.stringify(o.flags)}`);
        for (const a of (o.addr_info as Array<Record<string, unknown>>) ?? []) out.push(`addr ${String(o.ifname)} ${String(a.family)} ${String(a.local)}/${String(a.prefixlen)}`);
      } else {
        out.push(`route ${String(o.dst)} via ${String(o.gateway ?? "-")} dev ${String(o.dev)} ${String(o.protocol ?? "")} ${String(o.scope ?? "")}`);
      }
    }
  }
  return out;
}

/** The witness recorded at set-up and reload: the table and the namespace as loaded. */
export async function readBack(session: NftSession, table: string, netns: string): Promise<RulesWitness> {
  const t = await liveTable(session, table);
  if (!t) throw new BerthError("operation_failed", `operation_failed: nftables table ${table} could not be read back after loading it`);
  const ns = await liveNamespace(netns);
  return { digest: digestOf(t.lines), namespaceDigest: digestOf(ns), lines: t.lines, namespaceLines: ns };
}

/** Compares the live rules (table; the namespace too when `namespace`) with `rec`'s recorded ones. */
export async function compareRules(rec: NetRecord, namespace: boolean, session: NftSession): Promise<RulesVerdict> {
  if (rec.state !== "up") return { ok: false, why: `the network of machine ${rec.machineId} is ${rec.state}, not up`, diff: [] };
  if (!rec.rules) return { ok: false, why: `no rules were recorded for machine ${rec.machineId}'s network`, diff: [] };
  const ino = netnsInode(rec.netns);
  if (ino !== rec.netnsInode) return { ok: false, why: `namespace ${rec.netns} is ${ino === null ? "gone" : `inode ${ino}`}, recorded inode ${rec.netnsInode}`, diff: [] };
  const idx = ifindex(rec.hostIf);
  if (idx !== rec.hostIfindex) return { ok: false, why: `veth ${rec.hostIf} is ${idx === null ? "gone" : `ifindex ${idx}`}, recorded ${rec.hostIfindex}`, diff: [] };
  const live = await liveTable(session, rec.table);
  if (!live) return { ok: false, why: `nftables table ${rec.table} is gone`, diff: (rec.rules.lines ?? []).slice(0, 5).map((l) => `- ${l}`) };
  const digest = digestOf(live.lines);
  if (digest !== rec.rules.digest) return { ok: false, why: `the rules of table ${rec.table} changed (${rec.rules.digest.slice(0, 19)} recorded, ${digest.slice(0, 19)} now)`, diff: linesDiff(rec.rules.lines ?? [], live.lines) };
  if (namespace) {
    const ns = await liveNamespace(rec.netns);
    if (digestOf(ns) !== rec.rules.namespaceDigest) return { ok: false, why: `the addresses or routes of namespace ${rec.netns} changed`, diff: linesDiff(rec.rules.namespaceLines ?? [], ns) };
  }
  return { ok: true, digest, evidenceAt: rec.evidence?.at ?? null };
}
