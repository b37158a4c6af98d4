/**
 * OpenSSH public key lines (`<type> <base64 blob> [comment]`): validated and
 * fingerprinted the way `ssh-keygen -lf` prints them ("SHA256:<base64, no
 * padding>"), so the fingerprint the coordinator records, the one the agent
 * indexes and the one the SSH gateway computes from a client's key agree.
 */
import { createHash } from "node:crypto";
import { BerthError } from "./errors.js";

const KEY_TYPES = new Set([
  "ssh-ed25519",
  "ecdsa-sha2-nistp256",
  "ecdsa-sha2-nistp384",
  "ecdsa-sha2-nistp521",
  "ssh-rsa",
  "sk-ssh-ed25519@openssh.com",
  "sk-ecdsa-sha2-nistp256@openssh.com",
]);

export interface ParsedPublicKey {
  type: string;
  /** The key blob (SSH wire format). */
  blob: Buffer;
  fingerprint: string;
  /** The canonical line, without the comment. */
  line: string;
}

/** SHA256 fingerprint of a key blob, as OpenSSH prints it. */
export function fingerprintOf(blob: Uint8Array): string {
  return "SHA256:" + createHash("sha256").update(blob).digest("base64").replace(/=+$/, "");
}

export function parsePublicKey(line: unknown): ParsedPublicKey {
  const bad = (why: string): never => {
    throw new BerthError("invalid_request", `invalid_request: publicKey ${why}; send one OpenSSH public key line, e.g. "ssh-ed25519 AAAA… comment"`);
  };
  if (typeof line !== "string") return bad("is not a string");
  if (line.length > 16_384) return bad("is too long");
  const parts = line.trim().split(/\s+/);
  const type = parts[0] ?? "";
  const b64 = parts[1] ?? "";
  if (!KEY_TYPES.has(type)) return bad(`has an unsupported key type ${JSON.stringify(type.slice(0, 40))}`);
  if (!/^[A-Za-z0-9+/]+={0,2}$/.test(b64)) return bad("has no base64 key blob");
  const blob = Buffer.from(b64, "base64");
  // The blob starts with its own type string; it must agree with the line's.
  if (blob.length < 4) return bad("has a truncated key blob");
  const n = blob.readUInt32BE(0);
  if (n > blob.length - 4 || blob.subarray(4, 4 + n).toString("latin1") !== type) {
    return bad("has a key blob whose type does not match the line");
  }
  return { type, blob, fingerprint: fingerprintOf(blob), line: `${type} ${blob.toString("base64")}` };
}
