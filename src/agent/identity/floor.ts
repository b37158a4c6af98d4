/**
 * The identity floor: once a host's switch reached its local commit, no agent
 * built before it may run on this state directory again (it would enroll with
 * the shared token). Two marks, both idempotent:
 *
 *   - `identity.floor` ({"minAgentVersion": …}): this build and every later
 *     one refuse to start below that version;
 *   - a `schema_migrations` row in the agent store named `identity_floor`
 *     (src/agent/store/floor-mark.ts): builds from before host identity
 *     refuse to open a store that records a migration they do not know
 *     ("written by another berth build").
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { writeFileDurable } from "../../io/durable-file.js";
import type { AgentStore } from "../store/store.js";

export const FLOOR_FILE = "identity.floor";

export class FloorRefusedError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "FloorRefusedError";
  }
}

/** Whether the floor was claimed on this state directory (either mark). */
export function floorClaimed(stateDir: string, store: AgentStore): boolean {
  return readFloor(stateDir) !== null || store.floor.present();
}

/** Refuses to start an agent of `version` below the claimed floor. */
export function checkFloor(stateDir: string, version: string): void {
  const floor = readFloor(stateDir);
  if (floor === null) return;
  if (compareVersions(version, floor) < 0) {
    throw new FloorRefusedError(
      `identity_floor: this state directory switched to host identity and needs berth agent ${floor} or newer (this is ${version}); run a newer agent`,
    );
  }
}

export function claimFloor(stateDir: string, store: AgentStore, version: string): void {
  const current = readFloor(stateDir);
  if (current === null || compareVersions(version, current) > 0) writeFileDurable(join(stateDir, FLOOR_FILE), `${JSON.stringify({ minAgentVersion: version })}\n`, 0o600);
  if (!store.floor.present()) store.transaction(() => store.floor.write(Date.now()));
}

function readFloor(stateDir: string): string | null {
  let text: string;
  try {
    text = readFileSync(join(stateDir, FLOOR_FILE), "utf8");
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") return null;
    return "999999.0.0"; // unreadable: only a build that can read it may run
  }
  try {
    const v = (JSON.parse(text) as { minAgentVersion?: unknown }).minAgentVersion;
    if (typeof v === "string" && /^\d+\.\d+\.\d+/.test(v)) return v;
  } catch {
    /* damaged */
  }
  return "999999.0.0";
}

/** Numeric comparison of dotted versions (pre-release tags ignored); "unknown" is below everything. */
export function compareVersions(a: string, b: string): number {
  const parts = (v: string) => (/^\d+(\.\d+)*/.exec(v)?.[0] ?? "0").split(".").map(Number);
  const x = parts(a);
  const y = parts(b);
  for (let i = 0; i < Math.max(x.length, y.length); i++) {
    const d = (x[i] ?? 0) - (y[i] ?? 0);
    if (d !== 0) return d;
  }
  return 0;
}
