/**
 * Workspace volume records (table `volumes`, migration 3), the state anchors
 * of src/agent/volumes.ts: `intent` is written BEFORE the directory is made,
 * `ready` with the exact identity (device, inode, marker) after; release
 * writes `release_intent` before anything is removed and `clean` only once
 * the directory is proven absent; `moved` once a kept volume was attached to
 * a new allocation (that allocation's record carries the path on). A
 * restarted agent that finds `intent` or `release_intent` finishes or proves
 * that step; it never guesses.
 */
import type { Statements } from "../../store/sqlite/statements.js";

/** `moved`: a kept volume attached to a new allocation; the directory is that allocation's record's now (volumes.ts `attach`). */
export type VolumeState = "intent" | "ready" | "release_intent" | "clean" | "moved";

export interface VolumeRecord {
  allocationId: string;
  state: VolumeState;
  path: string;
  dev: string | null;
  ino: string | null;
  marker: string;
  /** The disk size (MiB) the volume was made with; null: none named (made before the disk dimension). */
  diskMib: number | null;
  /** true: an ext4 image of diskMib is mounted on data/ (volume-disk.ts); false: accounted only (diskWhy says why); null: made before. */
  diskEnforced: boolean | null;
  diskWhy: string | null;
  createdAt: number;
  updatedAt: number;
}

interface Row {
  allocation_id: string;
  state: VolumeState;
  path: string;
  dev: string | null;
  ino: string | null;
  marker: string;
  disk_mib: number | null;
  disk_enforced: number | null;
  disk_why: string | null;
  created_at: number;
  updated_at: number;
}

const fromRow = (r: Row): VolumeRecord => ({
  allocationId: r.allocation_id, state: r.state, path: r.path, dev: r.dev, ino: r.ino, marker: r.marker,
  diskMib: r.disk_mib ?? null, diskEnforced: r.disk_enforced === null || r.disk_enforced === undefined ? null : r.disk_enforced === 1, diskWhy: r.disk_why ?? null,
  createdAt: r.created_at, updatedAt: r.updated_at,
});

export class VolumeTable {
  constructor(private readonly q: Statements) {}

  get(allocationId: string): VolumeRecord | null {
    const r = this.q("SELECT * FROM volumes WHERE allocation_id = ?").get(allocationId) as Row | undefined;
    return r ? fromRow(r) : null;
  }

  list(): VolumeRecord[] {
    return (this.q("SELECT * FROM volumes ORDER BY created_at, allocation_id").all() as Row[]).map(fromRow);
  }

  put(v: VolumeRecord): void {
    this.q(
      `INSERT INTO volumes (allocation_id, state, path, dev, ino, marker, disk_mib, disk_enforced, disk_why, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
       ON CONFLICT (allocation_id) DO UPDATE SET state = excluded.state, path = excluded.path, dev = excluded.dev, ino = excluded.ino,
         marker = excluded.marker, disk_mib = excluded.disk_mib, disk_enforced = excluded.disk_enforced, disk_why = excluded.disk_why, updated_at = excluded.updated_at`,
    ).run(v.allocationId, v.state, v.path, v.dev, v.ino, v.marker, v.diskMib, v.diskEnforced === null ? null : v.diskEnforced ? 1 : 0, v.diskWhy, v.createdAt, v.updatedAt);
  }
}
