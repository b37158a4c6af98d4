/**
 * The files scope (migration 16): where a pool's machines let SFTP reach —
 * `machine` (the machine's whole view, as before) or `workspace` (the SFTP
 * server runs chrooted into the workspace: docs/files.md). `pools.files_scope`
 * is part of the pool's compatibility (a change rotates its machines);
 * `machines.files_scope` is what each machine was provisioned with. NULL is
 * `machine` in both, so rows written before this migration read as they
 * behaved. Named statements that compose inside the caller's transaction.
 */
import type { FilesScope } from "../core/pool.js";
import type { Migration } from "./migrate.js";
import type { Tx } from "./store.js";

export const FILES_SCOPE_MIGRATION: Migration = {
  version: 16,
  name: "pool files scope",
  sql: `
ALTER TABLE pools ADD COLUMN files_scope TEXT;
ALTER TABLE machines ADD COLUMN files_scope TEXT;
`,
};

/** The stored form: NULL for `machine`. */
export function filesScopeColumn(f: FilesScope | undefined): string | null {
  return f === "workspace" ? "workspace" : null;
}

/** The scope a provisioning machine is made with. */
export async function setMachineFilesScope(tx: Tx, machineId: string, f: FilesScope): Promise<void> {
  await tx.run("UPDATE machines SET files_scope = ? WHERE id = ?", [filesScopeColumn(f), machineId]);
}

/** The scope a machine (its row) was provisioned with. */
export function filesScopeOf(m: { files_scope?: string | null }): FilesScope {
  return m.files_scope === "workspace" ? "workspace" : "machine";
}

/** Ready machines of a pool made with another scope than `f` (rotated out, never changed live). */
export async function staleFilesScopeReadyMachineIds(tx: Tx, org: string, pool: string, f: FilesScope): Promise<string[]> {
  const rows = await tx.all<{ id: string }>("SELECT id FROM machines WHERE org = ? AND pool = ? AND state = 'ready' AND COALESCE(files_scope, 'machine') <> ? ORDER BY id", [org, pool, f]);
  return rows.map((r) => r.id);
}
