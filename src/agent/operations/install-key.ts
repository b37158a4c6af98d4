/**
 * install_key: a borrow's key (or a keeper pool's long-lived one) lets its
 * holder into the machine, until its expiry.
 *
 * One local transaction: the key, the machine record and the result (the
 * dispatcher writes the operation's row in it too), so a crash before the
 * commit leaves nothing installed and nothing recorded, and a retry runs it
 * afresh. An expired key, or one removed at this generation (a delayed
 * install after the removal), is refused and never installed. Keys of older
 * generations are superseded by the install.
 */
import { BerthError } from "../../core/errors.js";
import type { InstallKeyResult } from "../../protocol/operations.js";
import { supersededAt } from "../keys.js";
import type { StoredKey } from "../store/keys.js";
import { attachIfNeeded, commit, machineOf, networkOf, type ArgsOf, type OpCall } from "./context.js";
import { tampered } from "../network/live-rules.js";

export async function installKey(op: OpCall, a: ArgsOf<"install_key">): Promise<void> {
  const { deps } = op;
  const { store, keys } = deps;
  const now = deps.now();
  if (a.expiresAt !== null && now >= a.expiresAt) {
    throw new BerthError("grant_expired", `grant_expired: the key for grant ${a.grantId} expired at ${new Date(a.expiresAt).toISOString()}; it was not installed; borrow again`);
  }
  if (store.removedKeys.wasRemoved(op.machineId, op.generation, a.grantId, a.fingerprint)) {
    throw new BerthError(
      "conflict",
      `conflict: the key of grant ${a.grantId} was already removed from machine ${op.machineId} at generation ${op.generation}; a removed key is never installed again`,
    );
  }
  // A portable grant is lent here: the machine's rules must be the recorded ones (network/guard.ts).
  if (a.mode === "grant" && deps.lendCheck && networkOf(deps, op.machineId)) {
    const c = await deps.lendCheck(op.machineId);
    if (!c.ok) throw tampered(op.machineId, c);
  }
  attachIfNeeded(deps, op.machineId);
  const m = machineOf(deps, op.machineId);
  const key: StoredKey = {
    machineId: op.machineId, fingerprint: a.fingerprint, publicKey: a.publicKey, generation: op.generation,
    mode: a.mode, grantId: a.grantId, expiresAt: a.expiresAt, installedAt: now,
  };
  const superseded = store.keys.list(op.machineId).filter((k) => supersededAt(k, op.generation));
  const result: InstallKeyResult = {
    fingerprint: a.fingerprint, grantId: a.grantId, mode: a.mode, expiresAt: a.expiresAt, superseded: superseded.map((k) => k.fingerprint),
  };
  keys.install(key, commit(op, m, result));
}
