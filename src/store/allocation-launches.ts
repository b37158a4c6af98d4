/**
 * `allocation_launches`: one row per allocation that asked for a launch
 * (created with a public key). It holds the durable inputs of the launch and
 * release operations — the OpenSSH public key (public; the private half
 * never leaves the client) and whether to keep the volume — and what the
 * agent proved: the launch result (sandbox, incarnation, volume identity)
 * and the release result (sessions cut, processes gone, volume kept or wiped).
 */
import type { Tx } from "./store.js";
import type { Migration } from "./migrate.js";
import { parseOperationResult, type AllocLaunchResult, type AllocReleaseResult } from "../protocol/operations.js";

/**
 * Migration 12: an operator's resolution of a quarantined allocation
 * (`berth alloc resolve`): `resolve` is `keep` or `destroy` (the volume), and
 * `resolved_by` the operator's token id. Set once the operator asked; the
 * cleanup then sends the agent a release with `resolve`.
 */
export const ALLOCATION_RESOLVE_MIGRATION: Migration = {
  version: 12,
  name: "allocation quarantine resolution",
  sql: `
ALTER TABLE allocation_launches ADD COLUMN resolve TEXT;
ALTER TABLE allocation_launches ADD COLUMN resolved_by TEXT;
`,
};

/**
 * Migration 20: the kept volume a launch attaches (`alloc create --volume`):
 * `volume_from` names the released allocation whose volume it runs on (null:
 * a new volume). Indexed: whether a volume was attached already is read by it.
 */
export const ALLOCATION_VOLUME_MIGRATION: Migration = {
  version: 20,
  name: "allocation attached volume",
  sql: `
ALTER TABLE allocation_launches ADD COLUMN volume_from TEXT;
CREATE INDEX allocation_launches_volume_from ON allocation_launches (volume_from);
`,
};

export type ResolveChoice = "keep" | "destroy";

export interface LaunchRecord {
  allocationId: string;
  publicKey: string;
  fingerprint: string;
  keepVolume: boolean;
  launch: AllocLaunchResult | null;
  release: AllocReleaseResult | null;
  readyAt: number | null;
  attempts: number;
  error: string | null;
  /** An operator's resolution of the quarantine: the volume's fate, and who asked. */
  resolve: { volume: ResolveChoice; by: string } | null;
  /** The released allocation whose kept volume this launch attaches; null: a new volume. */
  volumeFrom: string | null;
}

interface Row {
  allocation_id: string;
  public_key: string;
  fingerprint: string;
  keep_volume: number | boolean;
  launch_result: string | null;
  release_result: string | null;
  ready_at: number | string | null;
  attempts: number;
  error: string | null;
  resolve: string | null;
  resolved_by: string | null;
  volume_from: string | null;
}

export async function getLaunch(tx: Tx, allocationId: string): Promise<LaunchRecord | null> {
  const r = await tx.get<Row>("SELECT * FROM allocation_launches WHERE allocation_id = ?", [allocationId]);
  if (!r) return null;
  return {
    allocationId: r.allocation_id,
    publicKey: r.public_key,
    fingerprint: r.fingerprint,
    keepVolume: Boolean(r.keep_volume),
    // Stored as the contract read them from the agent; read back by it again (never cast).
    launch: r.launch_result ? parseOperationResult("alloc_launch", JSON.parse(r.launch_result)) : null,
    release: r.release_result ? parseOperationResult("alloc_release", JSON.parse(r.release_result)) : null,
    readyAt: r.ready_at === null ? null : Number(r.ready_at),
    attempts: r.attempts,
    error: r.error,
    resolve: r.resolve === "keep" || r.resolve === "destroy" ? { volume: r.resolve, by: r.resolved_by ?? "" } : null,
    volumeFrom: r.volume_from ?? null,
  };
}

/** Records an operator's resolution (the volume choice follows it); attempts start again from zero. */
export async function setResolve(tx: Tx, allocationId: string, volume: ResolveChoice, by: string, now: number): Promise<void> {
  await tx.run("UPDATE allocation_launches SET resolve = ?, resolved_by = ?, keep_volume = ?, attempts = 0, updated_at = ? WHERE allocation_id = ?", [volume, by, volume === "keep" ? 1 : 0, now, allocationId]);
}

export async function insertLaunch(tx: Tx, allocationId: string, publicKey: string, fingerprint: string, now: number, volumeFrom: string | null = null): Promise<void> {
  await tx.run("INSERT INTO allocation_launches (allocation_id, public_key, fingerprint, updated_at, volume_from) VALUES (?, ?, ?, ?, ?) ON CONFLICT (allocation_id) DO NOTHING", [allocationId, publicKey, fingerprint, now, volumeFrom]);
}

/** The allocations whose launch attaches (or attached) the kept volume of `volumeFrom`, oldest first. */
export async function attachmentsOf(tx: Tx, volumeFrom: string): Promise<string[]> {
  const rows = await tx.all<{ allocation_id: string }>("SELECT allocation_id FROM allocation_launches WHERE volume_from = ? ORDER BY updated_at, allocation_id", [volumeFrom]);
  return rows.map((r) => r.allocation_id);
}

export async function setLaunched(tx: Tx, allocationId: string, result: AllocLaunchResult, now: number): Promise<void> {
  await tx.run("UPDATE allocation_launches SET launch_result = ?, ready_at = ?, error = NULL, updated_at = ? WHERE allocation_id = ?", [JSON.stringify(result), now, now, allocationId]);
}

export async function setReleased(tx: Tx, allocationId: string, result: AllocReleaseResult, now: number): Promise<void> {
  await tx.run("UPDATE allocation_launches SET release_result = ?, error = NULL, updated_at = ? WHERE allocation_id = ?", [JSON.stringify(result), now, allocationId]);
}

export async function setKeepVolume(tx: Tx, allocationId: string, keep: boolean, now: number): Promise<void> {
  await tx.run("UPDATE allocation_launches SET keep_volume = ?, updated_at = ? WHERE allocation_id = ?", [keep ? 1 : 0, now, allocationId]);
}

/** Counts a failed attempt and keeps its message; resolves to the attempts so far. */
export async function noteLaunchError(tx: Tx, allocationId: string, error: string, now: number): Promise<number> {
  const r = await tx.get<{ attempts: number }>("UPDATE allocation_launches SET attempts = attempts + 1, error = ?, updated_at = ? WHERE allocation_id = ? RETURNING attempts", [error.slice(0, 2000), now, allocationId]);
  return r?.attempts ?? 0;
}
