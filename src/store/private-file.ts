/**
 * Database files are owner-only (0600): the coordinator's SQLite file and the
 * agent's store hold hashes, addresses and histories that are nobody else's
 * business. SQLite creates a database's `-wal`, `-shm` and `-journal` files
 * with the permissions of the database file itself, so the file is created
 * 0600 (whatever the umask) before SQLite first opens it; files of an older
 * run (created under another mode) are set to 0600 too.
 */
import { chmodSync, closeSync, openSync } from "node:fs";

const COMPANIONS = ["", "-wal", "-shm", "-journal"];

/** Creates `path` 0600 if it is missing and sets it and its companions that exist to 0600. */
export function privateDatabaseFile(path: string): void {
  closeSync(openSync(path, "a", 0o600));
  for (const suffix of COMPANIONS) {
    try {
      chmodSync(path + suffix, 0o600);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== "ENOENT") throw e;
    }
  }
}
