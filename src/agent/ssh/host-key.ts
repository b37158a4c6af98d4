/**
 * The gateway's persistent host key (Ed25519, OpenSSH format).
 *
 * The file is written whole (temp file, fsync, rename, fsync of the
 * directory) and only then used, so a crash while creating it leaves either
 * no key or a complete key, never a truncated one that a restart would
 * silently replace (which would break every pinned known_hosts line). An
 * existing file that cannot be parsed is an error, not a reason to make a
 * new key.
 */
import { readFileSync } from "node:fs";
import { generateSshKeyPair, parseOpenSshEd25519, type SshKeyPair } from "../../core/ssh-keys.js";
import { writeFileDurable } from "../../io/durable-file.js";

/**
 * Read the host key if the file exists, otherwise create it durably. Reusing
 * it across restarts keeps every pinned known_hosts line valid.
 */
export function loadOrCreateHostKey(path: string): SshKeyPair {
  let text: string | null = null;
  try {
    text = readFileSync(path, "utf8");
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== "ENOENT") throw e;
  }
  if (text !== null) return parseOpenSshEd25519(text);
  const pair = generateSshKeyPair("berth-host");
  writeFileDurable(path, pair.privateKey, 0o600);
  return pair;
}
