/**
 * The client's per-allocation SSH keys. `berth alloc create` generates an
 * Ed25519 key pair for the allocation, writes the private half (0600, whole
 * file, fsync) BEFORE it asks the coordinator, and sends only the public
 * half; `berth ssh ALLOCATION` uses it with the host key the coordinator
 * names (pinned: strict checking, a known_hosts file holding only that key).
 *
 * Where: --key-dir, else BERTH_KEY_DIR, else $XDG_STATE_HOME/berth/allocations
 * (default ~/.local/state/berth/allocations): `<id>` (private key) and
 * `<id>.known_hosts`. A create retried with the same --id reuses the key
 * already there, so the retry is the same request.
 */
import { existsSync, mkdirSync, readFileSync } from "node:fs";
import { homedir } from "node:os";
import { join, resolve } from "node:path";
import { BerthError } from "../core/errors.js";
import { parseId } from "../core/ids.js";
import { generateSshKeyPair, parseOpenSshEd25519, type SshKeyPair } from "../core/ssh-keys.js";
import { writeFileDurable } from "../io/durable-file.js";

export function allocationKeyDir(flag?: string): string {
  if (flag) return resolve(flag);
  if (process.env.BERTH_KEY_DIR) return resolve(process.env.BERTH_KEY_DIR);
  return join(process.env.XDG_STATE_HOME ?? join(homedir(), ".local", "state"), "berth", "allocations");
}

export function allocationKeyFile(dir: string, id: string): string {
  return join(dir, parseId(id, "allocation id"));
}

/** The allocation's key pair: the one already on disk for this id, or a new one written durably first. */
export function allocationKey(dir: string, id: string): { pair: SshKeyPair; file: string; reused: boolean } {
  const file = allocationKeyFile(dir, id);
  if (existsSync(file)) {
    try {
      return { pair: parseOpenSshEd25519(readFileSync(file, "utf8")), file, reused: true };
    } catch (e) {
      throw new BerthError("invalid_request", `invalid_request: the key file ${file} for allocation ${id} is not a readable Ed25519 key (${(e as Error).message}); move it away or choose another --id`);
    }
  }
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const pair = generateSshKeyPair(`berth-allocation-${id}`);
  writeFileDurable(file, pair.privateKey, 0o600);
  return { pair, file, reused: false };
}
