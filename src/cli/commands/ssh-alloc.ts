/**
 * `berth ssh ALLOCATION`: where a ready allocation is reached. The
 * coordinator names the host's gateway, the SSH user (the allocation's
 * sandbox) and the gateway's host key, which is pinned; the private key is
 * the one `berth alloc create` wrote for this allocation (alloc-keys.ts).
 */
import { existsSync } from "node:fs";
import { BerthError } from "../../core/errors.js";
import { parseId } from "../../core/ids.js";
import { clientFrom } from "../common.js";
import type { ConfigFlags } from "../config.js";
import { allocationKeyDir, allocationKeyFile } from "../alloc-keys.js";

export interface AllocSshPlan {
  host: string;
  port: number;
  user: string;
  hostKey: string;
  keyFile: string;
  /** The known_hosts file is written next to it (`<receiptPath>.known_hosts`). */
  receiptPath: string;
}

export async function planFromAllocation(rawId: string, flags: ConfigFlags & { keyDir?: string }): Promise<AllocSshPlan> {
  const id = parseId(rawId, "allocation id");
  const keyFile = allocationKeyFile(allocationKeyDir(flags.keyDir), id);
  if (!existsSync(keyFile)) {
    throw new BerthError("not_found", `not_found: no key for allocation ${id} in ${keyFile}; the key is written by berth alloc create on the machine that created it (use --key-dir or BERTH_KEY_DIR if it is elsewhere)`);
  }
  const { api } = clientFrom(flags);
  try {
    const a = await api.send("GET /v1/allocations/{id}", { id });
    if (a.state !== "ready" || !a.access) {
      throw new BerthError("conflict", `conflict: allocation ${id} is ${a.state}, not ready; ${nextStep(id, a.state)}`);
    }
    return { ...a.access, keyFile, receiptPath: keyFile };
  } finally {
    await api.close();
  }
}

/** What to do about an allocation that is not ready, by its state. */
function nextStep(id: string, state: string): string {
  if (state === "placed" || state === "launching") return `wait for it: berth alloc show ${id}`;
  if (state === "failed") return `its sandbox ended (berth alloc show ${id} says why): berth alloc restart ${id} starts it again on its volume, or berth alloc release ${id}`;
  if (state === "quarantined") return `an operator ends the quarantine: berth alloc resolve ${id}`;
  return "create a new one";
}
