/**
 * Address-slot leases, host-wide: a machine's /30 of the machine range is
 * taken by creating its lease file with O_EXCL in a directory every agent on
 * the host shares, the owner (state directory, machine id) written in it. A
 * lease is given back only by its owner, and a restarted agent removes the
 * leases of its own that no network record explains (`sweepOrphans`).
 */
import { closeSync, existsSync, mkdirSync, openSync, readdirSync, readFileSync, unlinkSync, writeSync } from "node:fs";
import { join } from "node:path";
import { BerthError } from "../../core/errors.js";

export const DEFAULT_LEASE_DIR = "/run/berth/net-leases";

interface LeaseOwner {
  stateDir: string;
  machineId: string;
}

export class SlotLeases {
  constructor(
    private readonly dir: string,
    private readonly range: string,
    private readonly stateDir: string,
    private readonly slots: number,
  ) {}

  /** Takes the first free slot from `start` on (or finds the one this machine already holds). */
  lease(machineId: string, start: number): number {
    mkdirSync(this.dir, { recursive: true, mode: 0o700 });
    const owner = JSON.stringify({ stateDir: this.stateDir, machineId }) + "\n";
    for (let i = 0; i < this.slots; i++) {
      const slot = (start + i) % this.slots;
      const path = this.#path(slot);
      let fd: number;
      try {
        fd = openSync(path, "wx", 0o600);
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code === "EEXIST") {
          if (this.#mine(this.#owner(path), machineId)) return slot;
          continue;
        }
        throw e;
      }
      writeSync(fd, owner);
      closeSync(fd);
      return slot;
    }
    throw new BerthError("no_capacity", `no_capacity: every address slot of ${this.range} is leased on this host`);
  }

  /** Gives the slot back if this machine of this agent holds it. */
  release(slot: number, machineId: string): void {
    const path = this.#path(slot);
    if (this.#mine(this.#owner(path), machineId)) unlinkSync(path);
  }

  /** Removes this agent's leases of slots not in `live`; resolves to how many. */
  sweepOrphans(live: ReadonlySet<number | null>): number {
    if (!existsSync(this.dir)) return 0;
    let n = 0;
    for (const f of readdirSync(this.dir)) {
      const o = this.#owner(join(this.dir, f));
      const slot = Number(f.slice(f.lastIndexOf("-") + 1));
      if (o && o.stateDir === this.stateDir && !live.has(slot)) {
        unlinkSync(join(this.dir, f));
        n++;
      }
    }
    return n;
  }

  #path(slot: number): string {
    return join(this.dir, `${this.range.replace("/", "_")}-${slot}`);
  }

  #mine(o: LeaseOwner | null, machineId: string): boolean {
    return o !== null && o.stateDir === this.stateDir && o.machineId === machineId;
  }

  #owner(path: string): LeaseOwner | null {
    try {
      return JSON.parse(readFileSync(path, "utf8")) as LeaseOwner;
    } catch {
      return null;
    }
  }
}
