/**
 * The files scope (migration 16): where a pool's machines let SFTP reach —
 * `machine` (the machine's whole view, as before) or `workspace` (the SFTP
 * server runs chrooted into the workspace: docs/files.md). `pools.files_scope`
 * is the pool's, `machines.files_scope` what each machine was provisioned
 * with. NULL is `machine` in both: a provision setting (provision-setting.ts).
 */
import type { FilesScope } from "../core/pool.js";
import type { Migration } from "./migrate.js";
import { provisionSetting } from "./provision-setting.js";

export const FILES_SCOPE_MIGRATION: Migration = {
  version: 16,
  name: "pool files scope",
  sql: `
ALTER TABLE pools ADD COLUMN files_scope TEXT;
ALTER TABLE machines ADD COLUMN files_scope TEXT;
`,
};

const filesScope = provisionSetting<FilesScope, "files_scope">("files_scope", "machine", "workspace");

/** The stored form: NULL for `machine`. */
export const filesScopeColumn = filesScope.column;
/** The scope a provisioning machine is made with. */
export const setMachineFilesScope = filesScope.setMachine;
/** The scope a row (machine or pool) holds. */
export const filesScopeOf = filesScope.of;
/** Ready machines of a pool made with another scope than `f`. */
export const staleFilesScopeReadyMachineIds = filesScope.staleReadyMachineIds;
