/**
 * Ed25519 SSH key pairs in the OpenSSH formats that both ssh2 and the system
 * `ssh` read: the CLI's borrow and keeper keys, the gateway's host key.
 * Generation and encoding are ssh2's (`utils.generateKeyPairSync`, the
 * unencrypted "openssh-key-v1" format); parsing accepts any unencrypted
 * OpenSSH Ed25519 private key, including the files earlier berth versions
 * wrote with their own encoder (70-column lines, same format).
 */
import { createPrivateKey, createPublicKey } from "node:crypto";
import ssh2 from "ssh2";
import { fingerprintOf } from "./ssh-public-key.js";

export interface SshKeyPair {
  /** "-----BEGIN OPENSSH PRIVATE KEY-----…" (unencrypted). */
  privateKey: string;
  /** One OpenSSH public key line: "ssh-ed25519 AAAA… comment". */
  publicKey: string;
  /** "SHA256:<base64 without padding>", as `ssh-keygen -l` prints it. */
  fingerprint: string;
}

/**
 * ssh2 1.17's Ed25519 generator strips leading zero bytes from the public key,
 * so about 1 key in 256 comes out with a 31-byte public key that neither ssh2
 * nor OpenSSH reads (mscdex/ssh2#1390, #1513). Such an output is discarded and
 * a new key generated; 8 attempts all failing has probability 256^-8.
 */
const GENERATE_ATTEMPTS = 8;

/** A fresh Ed25519 key pair in OpenSSH formats (always one that parses back). */
export function generateSshKeyPair(comment = "berth"): SshKeyPair {
  let last: unknown = null;
  for (let i = 0; i < GENERATE_ATTEMPTS; i++) {
    const { private: privateKey } = ssh2.utils.generateKeyPairSync("ed25519", { comment });
    try {
      return parseOpenSshEd25519(privateKey);
    } catch (e) {
      last = e;
    }
  }
  throw new Error(`could not generate a readable Ed25519 key: ${last instanceof Error ? last.message : String(last)}`);
}

/**
 * Parse an OpenSSH Ed25519 private key back into a key pair (the host key on
 * restart). Throws on anything else, so a damaged file is reported rather
 * than replaced.
 */
export function parseOpenSshEd25519(text: string): SshKeyPair {
  const parsed = ssh2.utils.parseKey(text);
  if (parsed instanceof Error) throw new Error(`host key file is not a readable OpenSSH key: ${parsed.message}`);
  const key = Array.isArray(parsed) ? parsed[0] : parsed;
  if (!key || key.type !== "ssh-ed25519" || !key.isPrivateKey()) {
    throw new Error("host key file does not hold an Ed25519 private key");
  }
  const blob = key.getPublicSSH();
  const comment = key.comment ?? "";
  // Re-derive the public half through node:crypto to prove the private half matches it.
  const jwk = createPublicKey(createPrivateKey(key.getPrivatePEM())).export({ format: "jwk" });
  const derived = jwk.crv === "Ed25519" && jwk.x ? Buffer.from(jwk.x, "base64url") : Buffer.alloc(0);
  if (derived.length !== 32 || !derived.equals(blob.subarray(blob.length - 32))) {
    throw new Error("host key file is inconsistent: private and public halves differ");
  }
  return {
    privateKey: text,
    publicKey: `ssh-ed25519 ${blob.toString("base64")}${comment ? " " + comment : ""}`,
    fingerprint: fingerprintOf(blob),
  };
}
