/**
 * The switch record (docs/host-identity.md): `identity-switch.json` in the
 * agent's state directory, non-secret JSON
 *
 *   {"schemaVersion":1,"step":"local"|"cloud"|"active","stopped":[{"machineId":"m_…","generation":3}]}
 *
 * written whole: a temp file, fsync, rename over the record, fsync of the
 * directory. It counts as durable only once that directory sync succeeded in
 * this process: a rename whose directory sync failed has put the record in
 * place (the enroll token is not used again) but a crash could still lose it,
 * so the switch waits until a later sync succeeds. A record found at boot is
 * synced the same way before anything runs on it. A record that cannot be
 * read counts as `local` (damaged), never as no record: it may stand for a
 * switch under way.
 *
 * Every file system call goes through `RecordFs`, so tests can make the
 * rename or a sync fail; `envFaults` reads the test-only fault and crash
 * points (BERTH_TEST_HOOKS=1 and BERTH_TEST_IDENTITY_FAULT /
 * BERTH_TEST_IDENTITY_CRASH), which have no effect otherwise.
 */
import { closeSync, constants, fstatSync, fsyncSync, lstatSync, openSync, readFileSync, renameSync, unlinkSync, writeSync } from "node:fs";
import { dirname, join } from "node:path";
import { randomBytes } from "node:crypto";
import { parseId } from "../../core/ids.js";
import { SWITCH_STEPS, type StoppedReport, type SwitchStep } from "../../core/host-identity.js";

export const RECORD_FILE = "identity-switch.json";
const SCHEMA_VERSION = 1;

export interface SwitchRecord {
  step: SwitchStep;
  /** Stopped reports owed: the coordinator may not have taken them yet. */
  stopped: StoppedReport[];
  /** The file could not be read; this record stands for it. */
  damaged?: true;
}

/** The file system calls the record makes (a test may fail any of them). */
export interface RecordFs {
  /** Writes and fsyncs the temp file. */
  writeTemp(path: string, data: string): void;
  rename(from: string, to: string): void;
  /** fsync of a directory: makes a rename in it durable. */
  syncDir(dir: string): void;
  /** fsync of the file itself (a record found in place). */
  syncFile(fd: number): void;
}

export const realFs: RecordFs = {
  writeTemp(path, data) {
    const fd = openSync(path, "wx", 0o600);
    try {
      const buf = Buffer.from(data, "utf8");
      let off = 0;
      while (off < buf.length) off += writeSync(fd, buf, off, buf.length - off);
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
  },
  rename: renameSync,
  syncDir(dir) {
    const fd = openSync(dir, "r");
    try {
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
  },
  syncFile: fsyncSync,
};

export type FaultPoint = "write" | "rename" | "dirsync";
/** Where a test may SIGKILL the agent: after a step's record was renamed but before its directory synced, or at a step boundary. */
export type CrashPoint = `renamed:${SwitchStep}` | `synced:${SwitchStep}` | "retired" | "committed" | "purged";

export interface TestHooks {
  /** File system calls failing while this returns true for them. */
  fail?: (point: FaultPoint) => boolean;
  /** Called at each crash point (a test's hook kills the process there). */
  at?: (point: CrashPoint) => void;
}

/** The fault and crash points set by the environment, only with BERTH_TEST_HOOKS=1 (tests). */
export function envHooks(env: NodeJS.ProcessEnv): TestHooks {
  if (env.BERTH_TEST_HOOKS !== "1") return {};
  const faults = new Set((env.BERTH_TEST_IDENTITY_FAULT ?? "").split(",").filter((s) => s !== ""));
  const crash = env.BERTH_TEST_IDENTITY_CRASH ?? "";
  return {
    fail: (point) => faults.has(point),
    at: (point) => {
      if (point === crash) process.kill(process.pid, "SIGKILL");
    },
  };
}

export function faultyFs(base: RecordFs, hooks: TestHooks): RecordFs {
  const fail = hooks.fail;
  if (fail === undefined) return base;
  const check = (p: FaultPoint) => {
    if (fail(p)) throw Object.assign(new Error(`injected ${p} failure`), { code: "EIO" });
  };
  return {
    writeTemp: (p, d) => (check("write"), base.writeTemp(p, d)),
    rename: (a, b) => (check("rename"), base.rename(a, b)),
    syncDir: (d) => (check("dirsync"), base.syncDir(d)),
    syncFile: (fd) => (check("dirsync"), base.syncFile(fd)),
  };
}

/** The record at `path`; null when there is none; damaged (`local`) when it cannot be read. */
export function readRecord(path: string): SwitchRecord | null {
  let raw: string;
  try {
    raw = readFileSync(path, "utf8");
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") return null;
    return { step: "local", stopped: [], damaged: true };
  }
  return parseRecord(raw);
}

export function parseRecord(raw: string): SwitchRecord {
  try {
    const j = JSON.parse(raw) as { schemaVersion?: unknown; step?: unknown; stopped?: unknown };
    if (j.schemaVersion === SCHEMA_VERSION && SWITCH_STEPS.includes(j.step as SwitchStep) && Array.isArray(j.stopped) && j.stopped.every(isReport)) {
      return { step: j.step as SwitchStep, stopped: (j.stopped as StoppedReport[]).map((r) => ({ machineId: r.machineId, generation: r.generation })) };
    }
  } catch {
    // unreadable: falls through
  }
  return { step: "local", stopped: [], damaged: true };
}

function isReport(v: unknown): v is StoppedReport {
  if (v === null || typeof v !== "object" || Array.isArray(v)) return false;
  const r = v as Record<string, unknown>;
  if (Object.keys(r).length !== 2 || typeof r.machineId !== "string" || !Number.isSafeInteger(r.generation) || (r.generation as number) < 0) return false;
  try {
    parseId(r.machineId, "machineId");
    return true;
  } catch {
    return false;
  }
}

export function recordText(r: SwitchRecord): string {
  return `${JSON.stringify({ schemaVersion: SCHEMA_VERSION, step: r.step, stopped: r.stopped })}\n`;
}

export function sameRecord(a: SwitchRecord | null, b: SwitchRecord): boolean {
  return a !== null && !a.damaged && !b.damaged && a.step === b.step && JSON.stringify(a.stopped) === JSON.stringify(b.stopped);
}

/**
 * The record file of one state directory and what this process knows of it.
 * `write` puts a record in place (throws when it could not; `renamed` tells
 * whether it is nevertheless the record now); `ensureDurable` proves the
 * record this process holds is the one synced at its path, writing it again
 * when the file was removed, replaced or damaged since.
 */
export class RecordFile {
  readonly path: string;
  readonly #fs: RecordFs;
  readonly #hooks: TestHooks;
  #held: SwitchRecord | null;
  #durable = false;

  constructor(stateDir: string, hooks: TestHooks = {}, fs: RecordFs = realFs) {
    this.path = join(stateDir, RECORD_FILE);
    this.#hooks = hooks;
    this.#fs = faultyFs(fs, hooks);
    this.#held = readRecord(this.path);
  }

  /** The record this process holds (null: none, the agent's legacy way). */
  get record(): SwitchRecord | null {
    return this.#held;
  }

  get durable(): boolean {
    return this.#durable;
  }

  /** Holds a record that exists only in memory (a floor found without a record): it is written by the next `ensureDurable`. */
  adopt(r: SwitchRecord): void {
    this.#held = r;
    this.#durable = false;
  }

  /** Writes `r` whole. From the rename on it is the record (held), durable only once its directory synced. */
  write(r: SwitchRecord): void {
    const next: SwitchRecord = { step: r.step, stopped: r.stopped.map((x) => ({ ...x })) };
    const tmp = join(dirname(this.path), `.${RECORD_FILE}.${process.pid}.${randomBytes(6).toString("hex")}.tmp`);
    try {
      this.#fs.writeTemp(tmp, recordText(next));
      this.#fs.rename(tmp, this.path);
    } catch (e) {
      try {
        unlinkSync(tmp);
      } catch {
        /* never read */
      }
      throw e;
    }
    this.#held = next;
    this.#durable = false;
    this.#hooks.at?.(`renamed:${next.step}`);
    this.#fs.syncDir(dirname(this.path));
    this.#durable = true;
    this.#hooks.at?.(`synced:${next.step}`);
  }

  /**
   * Whether the held record is known durable, proving it now if need be:
   * the regular file at the path says exactly the held record, is synced,
   * its directory is synced, and it is still that file afterwards. One that
   * says anything else is written again from memory. Throws when it cannot
   * be proven (the caller waits and tries later).
   */
  ensureDurable(): boolean {
    if (this.#durable) return true;
    const held = this.#held;
    if (held === null) return false;
    const onDisk = readRecord(this.path);
    if (!sameRecord(onDisk, held)) {
      this.write(held.damaged ? { step: held.step, stopped: held.stopped } : held);
      return true;
    }
    const fd = openSync(this.path, constants.O_RDONLY | constants.O_NOFOLLOW);
    try {
      const opened = fstatSync(fd);
      if (!opened.isFile()) throw new Error(`${this.path} is not a regular file`);
      this.#fs.syncFile(fd);
      this.#fs.syncDir(dirname(this.path));
      const named = lstatSync(this.path);
      if (named.dev !== opened.dev || named.ino !== opened.ino) throw new Error(`${this.path} was replaced while it was synced`);
    } finally {
      closeSync(fd);
    }
    this.#durable = true;
    return true;
  }
}
