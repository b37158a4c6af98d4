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
  created_at: number;
  updated_at: number;
}

const fromRow = (r: Row): VolumeRecord => ({
  allocationId: r.allocation_id, state: r.state, path: r.path, dev: r.dev, ino: r.ino, marker: r.marker,
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
      `INSERT INTO volumes (allocation_id, state, path, dev, ino, marker, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
       ON CONFLICT (allocation_id) DO UPDATE SET state = excluded.state, path = excluded.path, dev = excluded.dev, ino = excluded.ino,
         marker = excluded.marker, updated_at = excluded.updated_at`,
    ).run(v.allocationId, v.state, v.path, v.dev, v.ino, v.marker, v.createdAt, v.updatedAt);
  }
}
