/**
 * The gvisor runtime's machine records: one `machine.json` per machine under
 * <stateDir>/machines/<id>/, beside its workspace and bundles, written
 * durably (durable.ts) before the step it announces. It names the container
 * (and, once started, its sandbox's host pid and start time), the limits,
 * network, image and pool switches every start of the machine applies.
 */
import { existsSync, readdirSync } from "node:fs";
import { join, resolve } from "node:path";
import { BerthError } from "../../core/errors.js";
import { isId, parseId } from "../../core/ids.js";
import { readRecord, writeRecord } from "./durable.js";
import type { BootImage, CreateOptions } from "./types.js";

export interface ContainerRecord {
  id: string;
  bundle: string;
  /** Host pid and start time of runsc-sandbox; 0 while `runsc run` is in flight (intent). */
  sandboxPid: number;
  sandboxStart: number;
  /** Inode of the network namespace the sandbox was started in (network policy `egress`). */
  netnsInode?: string;
}

export interface GvisorMachineRecord {
  v: 1;
  machineId: string;
  createdAt: string;
  incarnation: string | null;
  container: ContainerRecord | null;
  /** Limits applied on every start (allocations); absent: cgroups ignored. */
  resources?: { vcpu: number; memoryMib: number } | null;
  /** The machine's network namespace and the files bound over /etc/hosts and /etc/resolv.conf; absent: no network. */
  network?: NonNullable<CreateOptions["network"]>;
  /** The image it boots; absent: the host's root. */
  image?: BootImage;
  /** "off": its pool refuses forwards (CreateOptions.forwarding); absent: allowed. */
  forwarding?: "off";
  /** "workspace": its pool confines SFTP to the workspace (CreateOptions.files); absent: the machine's view. */
  files?: "workspace";
}

export class GvisorRecords {
  constructor(readonly machinesDir: string) {}

  /** The machine's directory (its id checked). */
  dir(id: string): string {
    return join(this.machinesDir, parseId(id, "machine id"));
  }

  workspace(id: string): string {
    return join(this.dir(id), "workspace");
  }

  get(id: string): GvisorMachineRecord | null {
    return readRecord<GvisorMachineRecord>(join(this.dir(id), "machine.json"));
  }

  must(id: string): GvisorMachineRecord {
    const rec = this.get(id);
    if (!rec) throw new BerthError("not_found", `not_found: machine ${id} does not exist on this host; create it first`);
    return rec;
  }

  save(rec: GvisorMachineRecord): void {
    writeRecord(join(this.dir(rec.machineId), "machine.json"), rec);
  }

  /** Machines with a record, sorted. */
  list(): string[] {
    return readdirSync(this.machinesDir).filter((n) => isId(n) && existsSync(join(this.machinesDir, n, "machine.json"))).sort();
  }
}

/**
 * Machines per cached image id under an agent's state directory, from the
 * gvisor machine records (what the image cache must keep; also read by
 * `berth image rm --state-dir` while no agent runs there). A record that
 * cannot be read counts as using nothing here: recovery reports it.
 */
export function imagesInUseIn(stateDir: string): Map<string, number> {
  const used = new Map<string, number>();
  const dir = join(resolve(stateDir), "machines");
  if (!existsSync(dir)) return used;
  for (const id of readdirSync(dir)) {
    if (!isId(id)) continue;
    let rec: GvisorMachineRecord | null = null;
    try {
      rec = readRecord<GvisorMachineRecord>(join(dir, id, "machine.json"));
    } catch {
      continue;
    }
    const img = rec?.image?.id;
    if (img) used.set(img, (used.get(img) ?? 0) + 1);
  }
  return used;
}
