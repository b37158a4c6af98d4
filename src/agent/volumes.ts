/**
 * Workspace volumes (the seeds' "state anchors"): one directory per
 * allocation under <stateDir>/volumes/<allocation>/, holding
 *   marker  — a random token written once, proving the directory is this volume;
 *   data/   — the workspace itself: the sandbox's /workspace (gvisor bind
 *             mount) or cwd and HOME (process runtime).
 * The sandbox's workspace path (<stateDir>/machines/<machine>/workspace) is
 * a symlink to data/, made before the runtime starts the sandbox, so every
 * restart of the sandbox (fence, agent restart) binds the same directory.
 *
 * Durable order (records in src/agent/store/volumes.ts):
 *   create:  record `intent` (path, marker) → mkdir data/, write marker
 *            (whole file, fsync) → stat data/ → record `ready` with the
 *            exact identity (st_dev, st_ino).
 *   release: the sandbox is destroyed first (the caller proves it: no
 *            process, no mount user left) → record `release_intent` → remove
 *            the directory → prove it absent → record `clean`.
 * A crash between steps leaves `intent` (the next ensure finishes it: the
 * directory it would make is named by the record) or `release_intent`
 * (recover() finishes the removal at start-up). Nothing is inferred from a
 * directory without a record: a directory with no record is never adopted.
 * Found at a volume's path when the volume is created (no record, or an
 * `intent` whose directory holds more than this agent could have made before
 * a crash: files in data/, or a marker that is not the record's), it is moved
 * aside, whole, into <stateDir>/volumes-quarantine/<allocation>-<time>/
 * (a rename: nothing is read, nothing deleted), reported in the agent's log
 * and in `GET /v1/agent/volumes` (`quarantined`), and the volume is made
 * fresh.
 *
 * A kept volume (release --keep-volume: its record stays `ready`) may be
 * attached to a new allocation (`alloc create --volume`, `attach`): the
 * record moves, the directory stays where it is. One transaction marks the
 * old record `moved` and writes the new allocation's record with the same
 * path, identity and marker; from then on the volume is that allocation's
 * (listed, verified, kept or wiped by it). The marker names the directory
 * (the allocation it was first made for), so it is never rewritten.
 *
 * Disk limit (volume-disk.ts): with enforcement, create is record `intent`
 * (with the size and the decision) → sparse image `disk.img` made and
 * formatted → data/ made → the image mounted on data/ → marker → identity →
 * `ready`; the image exists before the directory is recorded ready. An
 * interrupted create is undone at start-up (data/ unmounted, image removed)
 * and made again by the next launch. Release and `volume rm` unmount data/
 * (proven) before anything is removed; the image goes with the directory. At
 * start-up a ready volume whose image is not mounted (a host reboot) is
 * mounted again and its identity (the mount's device) re-recorded: the agent
 * mounted that very image itself. A kept volume keeps its image and size
 * when attached; attaching it to a smaller size is refused.
 */
import { chmodSync, existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, readlinkSync, renameSync, rmSync, statSync, symlinkSync, unlinkSync } from "node:fs";
import { randomBytes } from "node:crypto";
import { basename, join, resolve } from "node:path";
import { BerthError } from "../core/errors.js";
import { parseId } from "../core/ids.js";
import { writeFileDurable } from "../io/durable-file.js";
import { wipeDirectory } from "./runtime/durable.js";
import type { VolumeRecord, VolumeTable } from "./store/volumes.js";
import type { AgentLog } from "./log.js";
import { isMounted, makeImage, mountImage, planDisk, unmountImage, type DiskCapability, type DiskEnforceMode, type DiskPlan } from "./volume-disk.js";

/** The marker file's content: the directory's name (the allocation it was made for) and the record's token. */
function markerLine(v: VolumeRecord): string {
  return `${basename(v.path)} ${v.marker}\n`;
}

export interface VolumeCheck {
  allocationId: string;
  ok: boolean;
  state: string;
  /** What is wrong, one line each; empty when ok. */
  problems: string[];
}

export interface VolumesDeps {
  stateDir: string;
  /** The volume records. */
  records: VolumeTable;
  now: () => number;
  log: AgentLog;
  /** The disk limit: `--disk-enforce` and what this host can do (probed at start-up); absent: off. */
  disk?: { mode: DiskEnforceMode; cap: DiskCapability };
}

/** The image of an enforced volume, inside its directory. */
const imageOf = (v: { path: string }): string => join(v.path, "disk.img");

/** The disk part of a launch result: what limits this volume, in words. */
export function diskView(v: VolumeRecord): { enforced: boolean; how: string; sizeMib: number } | undefined {
  if (v.diskMib === null) return undefined;
  return v.diskEnforced ? { enforced: true, how: `ext4 image of ${v.diskMib} MiB on a loop device`, sizeMib: v.diskMib } : { enforced: false, how: v.diskWhy ?? "not enforced", sizeMib: v.diskMib };
}

export class Volumes {
  readonly root: string;
  /** Where unrecorded directories found at a volume's path are moved aside. */
  readonly quarantineRoot: string;
  constructor(private readonly d: VolumesDeps) {
    this.root = join(resolve(d.stateDir), "volumes");
    this.quarantineRoot = join(resolve(d.stateDir), "volumes-quarantine");
    mkdirSync(this.root, { recursive: true, mode: 0o700 });
  }

  /** Directories moved aside (names `<allocation>-<time>`), oldest first. */
  quarantined(): string[] {
    return existsSync(this.quarantineRoot) ? readdirSync(this.quarantineRoot).sort() : [];
  }

  /** Whether the directory at `path` could be this agent's own unfinished create of `v` (an `intent`). */
  #ownUnfinished(v: VolumeRecord | null, path: string): boolean {
    if (v === null || v.state !== "intent") return false;
    const data = join(path, "data");
    if (existsSync(data) && (!lstatSync(data).isDirectory() || readdirSync(data).length > 0)) return false;
    const marker = join(path, "marker");
    if (existsSync(marker) && readFileSync(marker, "utf8") !== markerLine(v)) return false;
    return readdirSync(path).every((n) => n === "data" || n === "marker");
  }

  /** Moves an unrecorded directory at `path` aside, whole (a rename), and says where. */
  #moveAside(allocationId: string, path: string): string {
    mkdirSync(this.quarantineRoot, { recursive: true, mode: 0o700 });
    const to = join(this.quarantineRoot, `${allocationId}-${this.d.now()}`);
    renameSync(path, to);
    this.d.log.warn({ allocationId, path, movedTo: to }, "an unrecorded directory was at the volume's path: moved aside, never adopted; an operator may inspect or delete it");
    return to;
  }

  private pathOf(allocationId: string): string {
    return join(this.root, parseId(allocationId, "allocation id"));
  }

  /** The allocation's volume, created if needed (intent first, identity after). Idempotent. `diskMib`: its size (null: none named). */
  ensure(allocationId: string, diskMib: number | null = null): VolumeRecord {
    const { records, now } = this.d;
    let v = records.get(allocationId);
    if (v?.state === "ready") {
      const c = this.verify(allocationId);
      if (!c.ok) throw new BerthError("conflict", `conflict: the workspace volume of allocation ${allocationId} does not match its record (${c.problems.join("; ")}); it is left untouched; see berth volume verify`);
      return v;
    }
    if (v && v.state !== "intent") throw new BerthError("conflict", `conflict: the workspace volume of allocation ${allocationId} was released (${v.state}); a released allocation is never launched again`);
    const path = v?.path ?? this.pathOf(allocationId);
    // Our own interrupted create: its image (if any) is undone first, then it is made again.
    if (v?.state === "intent") this.#undoDisk(v);
    if (existsSync(path) && !this.#ownUnfinished(v, path)) this.#moveAside(allocationId, path);
    const plan = planDisk(this.d.disk?.mode ?? "off", this.d.disk?.cap ?? { can: false, why: "no disk limit configured" }, v?.diskMib ?? diskMib);
    if (!v) {
      v = { allocationId, state: "intent", path: this.pathOf(allocationId), dev: null, ino: null, marker: randomBytes(16).toString("hex"), ...diskFields(plan), createdAt: now(), updatedAt: now() };
      records.put(v); // intent, before anything exists on disk
    } else if (v.diskEnforced !== plan.enforce || v.diskMib !== plan.sizeMib) {
      v = { ...v, ...diskFields(plan), updatedAt: now() };
      records.put(v);
    }
    mkdirSync(join(v.path, "data"), { recursive: true, mode: 0o755 });
    if (plan.enforce) v = this.#makeDisk(v, plan.sizeMib);
    writeFileDurable(join(v.path, "marker"), markerLine(v), 0o600);
    const st = statSync(join(v.path, "data"), { bigint: true });
    const ready: VolumeRecord = { ...v, state: "ready", dev: String(st.dev), ino: String(st.ino), updatedAt: now() };
    records.put(ready);
    return ready;
  }

  /**
   * Attaches the kept volume of allocation `from` to `allocationId` (its
   * launch): refused unless `from`'s record is here and `ready` (a directory
   * without a record is never adopted), `from` holds no slot here (`isHeld`),
   * and the volume passes verify (record, identity, marker) now; then the
   * record moves in one transaction (`inTx`). Nothing is made or changed on
   * a refusal. Again for the same allocation (a retried launch) it answers
   * the record already moved, verified like any ready volume.
   */
  attach(allocationId: string, from: string, isHeld: (allocationId: string) => boolean, inTx: <T>(fn: () => T) => T, diskMib: number | null = null): VolumeRecord {
    const own = this.d.records.get(allocationId);
    if (own?.state === "ready") return this.ensure(allocationId);
    if (own) throw new BerthError("conflict", `conflict: allocation ${allocationId} already has a workspace volume record (${own.state}); a kept volume is attached only to a new allocation`);
    const attached = inTx(() => {
      const v = this.d.records.get(from);
      if (!v) throw new BerthError("not_found", `not_found: no volume of allocation ${from} is recorded on this host; nothing was attached (a directory without a record is never adopted)`);
      if (v.state !== "ready") throw new BerthError("conflict", `conflict: the volume of allocation ${from} is ${v.state === "moved" ? "already attached to another allocation" : v.state}; only a kept volume is attached`);
      if (isHeld(from)) throw new BerthError("conflict", `conflict: allocation ${from} still holds its slot on this host; its volume is attached only once it was released with --keep-volume`);
      const c = this.verify(from);
      if (!c.ok) throw new BerthError("conflict", `conflict: the volume of allocation ${from} failed verification (${c.problems.join("; ")}); it was not attached; an operator must inspect it (berth volume verify ${from})`);
      // It keeps its image and size: a smaller size could not hold what it may hold.
      if (diskMib !== null && v.diskMib !== null && diskMib < v.diskMib) {
        throw new BerthError("conflict", `conflict: the volume of allocation ${from} has a disk of ${v.diskMib} MiB; a size with ${diskMib} MiB cannot take it; it was not attached; create with a size of at least ${v.diskMib} MiB of disk`);
      }
      const now = this.d.now();
      this.d.records.put({ ...v, state: "moved", updatedAt: now });
      const next: VolumeRecord = { ...v, allocationId, createdAt: now, updatedAt: now };
      this.d.records.put(next);
      return next;
    });
    this.d.log.info({ allocationId, from, path: attached.path }, "a kept volume was attached to a new allocation (its record moved; the directory stays)");
    return attached;
  }

  /**
   * Makes and mounts the image of an `intent` volume on data/. A failure
   * undoes what was made; under `required` it refuses the launch
   * (`disk_not_enforceable`), under `auto` the volume is made as a plain
   * directory, its record saying why it is not enforced.
   */
  #makeDisk(v: VolumeRecord, sizeMib: number): VolumeRecord {
    try {
      makeImage(imageOf(v), sizeMib);
      mountImage(imageOf(v), join(v.path, "data"));
      // mkfs leaves lost+found: the workspace starts empty (e2fsck makes it again if it ever needs it).
      rmSync(join(v.path, "data", "lost+found"), { recursive: true, force: true });
      chmodSync(join(v.path, "data"), 0o755);
      return v;
    } catch (e) {
      this.#undoDisk(v);
      if (this.d.disk?.mode === "required") throw e;
      const why = `the image could not be made: ${(e as Error).message}`;
      this.d.log.warn({ allocationId: v.allocationId, error: (e as Error).message }, "a volume's disk image could not be made: the volume is a plain directory, disk accounted only");
      const plain: VolumeRecord = { ...v, diskEnforced: false, diskWhy: why, updatedAt: this.d.now() };
      this.d.records.put(plain);
      mkdirSync(join(v.path, "data"), { recursive: true, mode: 0o755 });
      return plain;
    }
  }

  /** Undoes the image of an unfinished create: data/ unmounted (proven), the image removed. */
  #undoDisk(v: VolumeRecord): void {
    unmountImage(join(v.path, "data"));
    rmSync(imageOf(v), { force: true });
  }

  /** Points the sandbox's workspace path at the volume's data directory (before the runtime starts it). */
  link(workspacePath: string, v: VolumeRecord): void {
    const target = join(v.path, "data");
    mkdirSync(join(workspacePath, ".."), { recursive: true, mode: 0o700 });
    let st: ReturnType<typeof lstatSync> | null = null;
    try {
      st = lstatSync(workspacePath);
    } catch {
      st = null;
    }
    if (st?.isSymbolicLink() && readlinkSync(workspacePath) === target) return;
    if (st?.isSymbolicLink()) unlinkSync(workspacePath);
    else if (st?.isDirectory()) rmSync(workspacePath, { recursive: true, force: true }); // an empty workspace a runtime made before the link
    else if (st) throw new BerthError("conflict", `conflict: ${workspacePath} is neither the volume link nor a directory`);
    symlinkSync(target, workspacePath, "dir");
  }

  /** Structural check: record ready, directory present with the recorded identity, marker intact. */
  verify(allocationId: string): VolumeCheck {
    const v = this.d.records.get(allocationId);
    if (!v) throw new BerthError("not_found", `not_found: allocation ${allocationId} has no workspace volume on this host`);
    const problems: string[] = [];
    if (v.state !== "ready") problems.push(`record is ${v.state}, not ready`);
    const data = join(v.path, "data");
    try {
      const st = lstatSync(data, { bigint: true });
      if (!st.isDirectory()) problems.push(`${data} is not a directory`);
      if (v.dev !== null && (String(st.dev) !== v.dev || String(st.ino) !== v.ino)) {
        problems.push(`identity changed: recorded dev ${v.dev} inode ${v.ino}, found dev ${st.dev} inode ${st.ino}`);
      }
    } catch {
      problems.push(`${data} is missing`);
    }
    if (v.diskEnforced && !isMounted(data)) problems.push(`the disk image is not mounted on ${data}`);
    try {
      const m = readFileSync(join(v.path, "marker"), "utf8");
      if (m !== markerLine(v)) problems.push("marker does not match the record");
    } catch {
      problems.push("marker file is missing");
    }
    return { allocationId, ok: problems.length === 0, state: v.state, problems };
  }

  /** Empties the volume (same directory, same identity). Refused on a volume that fails verify. */
  reset(allocationId: string): { removed: number } {
    const c = this.verify(allocationId);
    if (!c.ok) throw new BerthError("conflict", `conflict: the workspace volume of allocation ${allocationId} failed verification (${c.problems.join("; ")}); it is not reset; an operator must inspect it`);
    const v = this.d.records.get(allocationId)!;
    return { removed: wipeDirectory(join(v.path, "data")) };
  }

  /**
   * Release, after the caller proved the sandbox gone: keep (the record stays
   * `ready`) or wipe in order (release_intent → removed → absent proven → clean).
   */
  release(allocationId: string, keep: boolean): "kept" | "wiped" | "none" {
    const { records, now } = this.d;
    const v = records.get(allocationId);
    // A moved record's directory belongs to the allocation it was attached to: never removed through this one.
    if (!v || v.state === "clean" || v.state === "moved") return "none";
    if (keep && v.state === "ready") return "kept";
    records.put({ ...v, state: "release_intent", updatedAt: now() });
    this.#remove(v);
    return "wiped";
  }

  #remove(v: VolumeRecord): void {
    // Unmounted (proven) before anything is removed; the image goes with the directory.
    unmountImage(join(v.path, "data"));
    rmSync(v.path, { recursive: true, force: true, maxRetries: 3 });
    if (existsSync(v.path)) throw new BerthError("operation_failed", `operation_failed: volume ${v.path} still exists after removal`);
    this.d.records.put({ ...v, state: "clean", updatedAt: this.d.now() });
  }

  /**
   * An operator removes a kept volume (`berth volume rm`): only once its
   * allocation's hold is released (the caller checks), in the release's
   * order (release_intent → removed → absent proven → clean). A clean one
   * is answered as removed.
   */
  removeKept(allocationId: string): { state: "clean" } {
    const v = this.d.records.get(allocationId);
    if (!v) throw new BerthError("not_found", `not_found: allocation ${allocationId} has no workspace volume on this host`);
    if (v.state === "moved") throw new BerthError("conflict", `conflict: the volume of allocation ${allocationId} was attached to another allocation; it is that allocation's now (berth volume ls), removed or kept by its release`);
    this.release(allocationId, false);
    return { state: "clean" };
  }

  #remount(v: VolumeRecord): void {
    const data = join(v.path, "data");
    if (isMounted(data)) return;
    try {
      if (!existsSync(imageOf(v))) throw new Error(`its image ${imageOf(v)} is missing`);
      mountImage(imageOf(v), data);
      const st = statSync(data, { bigint: true });
      this.d.records.put({ ...v, dev: String(st.dev), ino: String(st.ino), updatedAt: this.d.now() });
      this.d.log.info({ allocationId: v.allocationId }, "mounted a volume's disk image again at start-up");
    } catch (e) {
      // verify says so (not mounted), and a launch on it is refused until an operator looks.
      this.d.log.warn({ allocationId: v.allocationId, error: (e as Error).message }, "a volume's disk image could not be mounted again");
    }
  }

  /** Removes one moved-aside directory (`berth volume quarantine rm`), proving it absent. */
  removeQuarantined(name: string): { removed: string } {
    parseId(name, "quarantined volume directory");
    if (!this.quarantined().includes(name)) throw new BerthError("not_found", `not_found: no moved-aside volume directory ${name} on this host`);
    const path = join(this.quarantineRoot, name);
    rmSync(path, { recursive: true, force: true, maxRetries: 3 });
    if (existsSync(path)) throw new BerthError("operation_failed", `operation_failed: ${path} still exists after removal`);
    this.d.log.info({ name }, "a moved-aside volume directory was removed by an operator");
    return { removed: name };
  }

  /**
   * Start-up: finish removals a crash interrupted (release_intent → clean),
   * undo the image of an interrupted create (intent: made again by the next
   * launch), and mount again the image of a ready volume that is not mounted
   * (a host reboot), re-recording its identity.
   */
  recover(): void {
    for (const v of this.d.records.list()) {
      if (v.state === "intent" && v.diskEnforced) {
        try {
          this.#undoDisk(v);
        } catch (e) {
          this.d.log.warn({ allocationId: v.allocationId, error: (e as Error).message }, "an interrupted volume create could not be undone; retried at its next launch");
        }
        continue;
      }
      if (v.state === "ready" && v.diskEnforced) {
        this.#remount(v);
        continue;
      }
      if (v.state !== "release_intent") continue;
      try {
        this.#remove(v);
        this.d.log.info({ allocationId: v.allocationId }, "finished an interrupted volume release");
      } catch (e) {
        this.d.log.warn({ allocationId: v.allocationId, error: (e as Error).message }, "volume release still unfinished; retried at the next release or start");
      }
    }
  }
}

function diskFields(p: DiskPlan): Pick<VolumeRecord, "diskMib" | "diskEnforced" | "diskWhy"> {
  return p.enforce ? { diskMib: p.sizeMib, diskEnforced: true, diskWhy: null } : { diskMib: p.sizeMib, diskEnforced: p.sizeMib === null ? null : false, diskWhy: p.why };
}
