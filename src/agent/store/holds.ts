/**
 * Allocation slot holds (table `alloc_holds`, migration 3): at most one row
 * per allocation. `held` names the generation of the launch actor that took
 * it; `released` is kept for good, so a late hold of any generation (an actor
 * that outlived its lease) is refused after the allocation was released;
 * `fenced` holds nothing: its generation is a floor raised by a replacement
 * actor's observation (`observe`), so a hold below it is refused whichever
 * arrives first, the observation or the late hold. A hold below the highest
 * generation seen is refused always. This is the fence that makes "never two
 * holds" hold even when two coordinators believe they are the actor
 * (src/agent/operations/alloc-hold.ts).
 */
import type { Statements } from "../../store/sqlite/statements.js";

export type HoldState = "held" | "released" | "fenced";

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

interface Row {
  allocation_id: string;
  machine_id: string;
  generation: number;
  state: HoldState;
  vcpu: number;
  memory_mib: number;
  taken_at: number;
  released_at: number | null;
}

const fromRow = (r: Row): HoldRecord => ({
  allocationId: r.allocation_id, machineId: r.machine_id, generation: r.generation, state: r.state,
  vcpu: r.vcpu, memoryMib: r.memory_mib, takenAt: r.taken_at, releasedAt: r.released_at,
});

export class HoldTable {
  constructor(private readonly q: Statements) {}

  get(allocationId: string): HoldRecord | null {
    const r = this.q("SELECT * FROM alloc_holds WHERE allocation_id = ?").get(allocationId) as Row | undefined;
    return r ? fromRow(r) : null;
  }

  /** The hold a machine (an allocation's sandbox) runs under, while held. */
  heldByMachine(machineId: string): HoldRecord | null {
    const r = this.q("SELECT * FROM alloc_holds WHERE machine_id = ? AND state = 'held'").get(machineId) as Row | undefined;
    return r ? fromRow(r) : null;
  }

  list(): HoldRecord[] {
    return (this.q("SELECT * FROM alloc_holds ORDER BY taken_at, allocation_id").all() as Row[]).map(fromRow);
  }

  put(h: HoldRecord): void {
    this.q(
      `INSERT INTO alloc_holds (allocation_id, machine_id, generation, state, vcpu, memory_mib, taken_at, released_at)
       VALUES (?, ?, ?, ?, ?, ?, ?, ?)
       ON CONFLICT (allocation_id) DO UPDATE SET machine_id = excluded.machine_id, generation = excluded.generation, state = excluded.state,
         vcpu = excluded.vcpu, memory_mib = excluded.memory_mib, taken_at = excluded.taken_at, released_at = excluded.released_at`,
    ).run(h.allocationId, h.machineId, h.generation, h.state, h.vcpu, h.memoryMib, h.takenAt, h.releasedAt);
  }

  /**
   * A replacement actor's observation: the hold as it is, and, when none is
   * held, the allocation's generation floor raised to `floor` in the same
   * transaction (durable before the answer), so any later hold below it is
   * refused. A held or released hold is answered unchanged.
   */
  observe(allocationId: string, machineId: string, floor: number, now: number): HoldRecord {
    const h = this.get(allocationId);
    if (h !== null && (h.state !== "fenced" || h.generation >= floor)) return h;
    const fenced: HoldRecord = { allocationId, machineId, generation: floor, state: "fenced", vcpu: 0, memoryMib: 0, takenAt: now, releasedAt: null };
    this.put(fenced);
    return fenced;
  }

  countHeld(): number {
    return (this.q("SELECT COUNT(*) AS n FROM alloc_holds WHERE state = 'held'").get() as { n: number }).n;
  }
}
