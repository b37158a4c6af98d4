/**
 * The agent's identity key: an Ed25519 key pair generated on first start in
 * the state directory (`identity_ed25519`, PKCS#8 PEM, mode 0600, written
 * whole). The private key never leaves the host: the agent only sends its
 * public key (base64 SPKI DER) and signatures over the coordinator's
 * challenges (src/core/host-identity.ts).
 */
import { createPrivateKey, createPublicKey, generateKeyPairSync, sign, type KeyObject } from "node:crypto";
import { chmodSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { identityFingerprint, proofMessage, type ProofPurpose } from "../../core/host-identity.js";
import { writeFileDurable } from "../../io/durable-file.js";

export const IDENTITY_KEY_FILE = "identity_ed25519";

export interface IdentityKey {
  /** base64 of the SPKI DER public key: what the coordinator records. */
  publicKey: string;
  fingerprint: string;
  /** base64 signature over the proof message. */
  prove(purpose: ProofPurpose, host: string, challenge: string): string;
}

export function loadOrCreateIdentityKey(stateDir: string): IdentityKey {
  const path = join(stateDir, IDENTITY_KEY_FILE);
  let priv: KeyObject;
  let pem: string | null = null;
  try {
    pem = readFileSync(path, "utf8");
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== "ENOENT") throw new Error(`cannot read the identity key ${path} (${(e as NodeJS.ErrnoException).code ?? "error"})`);
  }
  if (pem === null) {
    const pair = generateKeyPairSync("ed25519");
    writeFileDurable(path, pair.privateKey.export({ format: "pem", type: "pkcs8" }).toString(), 0o600);
    priv = pair.privateKey;
  } else {
    try {
      priv = createPrivateKey(pem);
    } catch {
      throw new Error(`the identity key ${path} is damaged; it is this host's identity at the coordinator, so it is never replaced by itself: restore it from a backup, or ask the operator to re-create the host`);
    }
    if (priv.asymmetricKeyType !== "ed25519") throw new Error(`the identity key ${path} is not an Ed25519 key`);
    if ((statSync(path).mode & 0o077) !== 0) chmodSync(path, 0o600);
  }
  const publicKey = createPublicKey(priv).export({ format: "der", type: "spki" }).toString("base64");
  return {
    publicKey,
    fingerprint: identityFingerprint(publicKey),
    prove: (purpose, host, challenge) => sign(null, proofMessage(purpose, host, challenge), priv).toString("base64"),
  };
}
