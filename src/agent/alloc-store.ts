/**
 * The agent's allocation records (store migration 3): slot holds and
 * workspace volumes, in the agent's own SQLite file (opened only by the
 * process holding the state directory's lock, see store.ts).
 *
 * Holds: at most one row per allocation. `held` names the generation of the
 * launch actor that took it; `released` is kept for good, so a late hold of
 * any generation (an actor that outlived its lease) is refused after the
 * allocation was released, and a hold below the highest generation seen is
 * refused always. This is the fence that makes "never two holds" hold even
 * when two coordinators believe they are the actor.
 *
 * Volumes (state anchors): `intent` is written BEFORE the directory is made,
 * `ready` with the exact identity (device, inode, marker) after; release
 * writes `release_intent` before anything is removed and `clean` only once
 * the directory is proven absent. A restarted agent that finds `intent` or
 * `release_intent` finishes or proves that step; it never guesses.
 */
import type Database from "better-sqlite3";
import type { Migration } from "../store/migrate.js";
import { statements } from "../store/sqlite/statements.js";

export const ALLOC_AGENT_MIGRATION: Migration = {
  version: 3,
  name: "allocation holds and volumes",
  sql: `
    CREATE TABLE alloc_holds (
      allocation_id TEXT PRIMARY KEY,
      machine_id    TEXT NOT NULL,
      generation    INTEGER NOT NULL,   -- the launch actor's generation that took (or last touched) it
      state         TEXT NOT NULL,      -- held | released
      vcpu          INTEGER NOT NULL,
      memory_mib    INTEGER NOT NULL,
      taken_at      INTEGER NOT NULL,
      released_at   INTEGER
    );
    CREATE TABLE volumes (
      allocation_id TEXT PRIMARY KEY,
      state         TEXT NOT NULL,      -- intent | ready | release_intent | clean
      path          TEXT NOT NULL,
      dev           TEXT,               -- st_dev of <path>/data, exact (bigint as text)
      ino           TEXT,               -- st_ino of <path>/data, exact
      marker        TEXT NOT NULL,      -- random, written to <path>/marker; proves the directory is this volume
      created_at    INTEGER NOT NULL,
      updated_at    INTEGER NOT NULL
    );
  `,
};

export type HoldState = "held" | "released";

export interface HoldRecord {
  allocationId: string;
  machineId: string;
  generation: number;
  state: HoldState;
  vcpu: number;
  memoryMib: number;
  takenAt: number;
  releasedAt: number | null;
}

export type VolumeState = "intent" | "ready" | "release_intent" | "clean";

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

interface HoldRow {
  allocation_id: string;
  machine_id: string;
  generation: number;
  state: HoldState;
  vcpu: number;
  memory_mib: number;
  taken_at: number;
  released_at: number | null;
}

interface VolumeRow {
  allocation_id: string;
  state: VolumeState;
  path: string;
  dev: string | null;
  ino: string | null;
  marker: string;
  created_at: number;
  updated_at: number;
}

const hold = (r: HoldRow): HoldRecord => ({
  allocationId: r.allocation_id, machineId: r.machine_id, generation: r.generation, state: r.state,
  vcpu: r.vcpu, memoryMib: r.memory_mib, takenAt: r.taken_at, releasedAt: r.released_at,
});
const volume = (r: VolumeRow): VolumeRecord => ({
  allocationId: r.allocation_id, state: r.state, path: r.path, dev: r.dev, ino: r.ino, marker: r.marker,
  createdAt: r.created_at, updatedAt: r.updated_at,
});

/** Named statements over the two tables (callers group them in `store.transaction`). */
export class AllocStore {
  readonly #q: (sql: string) => Database.Statement;
  constructor(private readonly db: Database.Database) {
    this.#q = statements(db);
  }

  getHold(allocationId: string): HoldRecord | null {
    const r = this.#q("SELECT * FROM alloc_holds WHERE allocation_id = ?").get(allocationId) as HoldRow | undefined;
    return r ? hold(r) : null;
  }
  getHoldByMachine(machineId: string): HoldRecord | null {
    const r = this.#q("SELECT * FROM alloc_holds WHERE machine_id = ? AND state = 'held'").get(machineId) as HoldRow | undefined;
    return r ? hold(r) : null;
  }
  listHolds(): HoldRecord[] {
    return (this.#q("SELECT * FROM alloc_holds ORDER BY taken_at, allocation_id").all() as HoldRow[]).map(hold);
  }
  putHold(h: HoldRecord): void {
    this.#q(
      `INSERT INTO alloc_holds (allocation_id, machine_id, generation, state, vcpu, memory_mib, taken_at, released_at)
       VALUES (?, ?, ?, ?, ?, ?, ?, ?)
       ON CONFLICT (allocation_id) DO UPDATE SET machine_id = excluded.machine_id, generation = excluded.generation, state = excluded.state,
         vcpu = excluded.vcpu, memory_mib = excluded.memory_mib, taken_at = excluded.taken_at, released_at = excluded.released_at`,
    )
      .run(h.allocationId, h.machineId, h.generation, h.state, h.vcpu, h.memoryMib, h.takenAt, h.releasedAt);
  }
  countHeld(): number {
    return (this.#q("SELECT COUNT(*) AS n FROM alloc_holds WHERE state = 'held'").get() as { n: number }).n;
  }

  getVolume(allocationId: string): VolumeRecord | null {
    const r = this.#q("SELECT * FROM volumes WHERE allocation_id = ?").get(allocationId) as VolumeRow | undefined;
    return r ? volume(r) : null;
  }
  listVolumes(): VolumeRecord[] {
    return (this.#q("SELECT * FROM volumes ORDER BY created_at, allocation_id").all() as VolumeRow[]).map(volume);
  }
  putVolume(v: VolumeRecord): void {
    this.#q(
      `INSERT INTO volumes (allocation_id, state, path, dev, ino, marker, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
       ON CONFLICT (allocation_id) DO UPDATE SET state = excluded.state, path = excluded.path, dev = excluded.dev, ino = excluded.ino,
         marker = excluded.marker, updated_at = excluded.updated_at`,
    )
      .run(v.allocationId, v.state, v.path, v.dev, v.ino, v.marker, v.createdAt, v.updatedAt);
  }
}
