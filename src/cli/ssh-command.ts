/**
 * The system `ssh` command line for a borrowed machine or an allocation, with
 * its host key pinned: a known_hosts file holding exactly the key the
 * coordinator reported is written next to the receipt (or key), and ssh is
 * told to use only it, strictly. What `berth borrow` and `berth ack` print and
 * what `berth ssh --print` prints; it works as printed.
 */
import { writeFileDurable } from "../io/durable-file.js";
import { shellQuote } from "../client/ssh.js";

export interface SystemSshTarget {
  host: string;
  port: number;
  user: string;
  /** "ssh-ed25519 AAAA…" (type and key). */
  hostKey: string;
  keyFile: string;
  /** The known_hosts file is written at `<receiptPath>.known_hosts`. */
  receiptPath: string;
}

/** One known_hosts line pinning the gateway's host key (OpenSSH writes "[host]:port" for a port other than 22). */
export function knownHostsLine(host: string, port: number, hostKey: string): string {
  return `${port === 22 ? host : `[${host}]:${port}`} ${hostKey.trim().split(/\s+/).slice(0, 2).join(" ")}`;
}

/** Write the known_hosts file next to the receipt (0600, whole) and return the ssh argv that uses it. */
export function systemSshCommand(t: SystemSshTarget, command: string[]): string[] {
  const knownHosts = `${t.receiptPath}.known_hosts`;
  writeFileDurable(knownHosts, knownHostsLine(t.host, t.port, t.hostKey) + "\n", 0o600);
  return [
    "ssh",
    "-i", t.keyFile,
    "-p", String(t.port),
    "-o", `UserKnownHostsFile=${knownHosts}`,
    "-o", "StrictHostKeyChecking=yes",
    "-o", "IdentitiesOnly=yes",
    ...(command.length > 0 ? ["-t"] : []),
    `${t.user}@${t.host}`,
    ...(command.length > 0 ? [shellQuote(command)] : []),
  ];
}
