/**
 * SSH key material: Ed25519 key pairs in the OpenSSH formats that both ssh2
 * and the system `ssh` read, with SHA256 fingerprints exactly as OpenSSH
 * prints them. Used by the CLI (ephemeral borrow keys, keeper keys) and the
 * agent (the gateway's host key, src/agent/ssh-keys.ts). No file I/O here.
 */
import { createPrivateKey, generateKeyPairSync, randomBytes, type KeyObject } from "node:crypto";
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

function sshString(b: Buffer | string): Buffer {
  const data = typeof b === "string" ? Buffer.from(b, "utf8") : b;
  const len = Buffer.alloc(4);
  len.writeUInt32BE(data.length, 0);
  return Buffer.concat([len, data]);
}

function uint32(n: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n >>> 0, 0);
  return b;
}

/** The raw 32-byte seed and 32-byte public point of an Ed25519 private key object. */
function ed25519Raw(priv: KeyObject): { seed: Buffer; pub: Buffer } {
  const jwk = priv.export({ format: "jwk" });
  if (jwk.kty !== "OKP" || jwk.crv !== "Ed25519" || !jwk.d || !jwk.x) {
    throw new Error("not an Ed25519 private key");
  }
  return { seed: Buffer.from(jwk.d, "base64url"), pub: Buffer.from(jwk.x, "base64url") };
}

/** The SSH wire blob of an Ed25519 public key: string "ssh-ed25519", string pub. */
export function ed25519PublicBlob(pub: Buffer): Buffer {
  return Buffer.concat([sshString("ssh-ed25519"), sshString(pub)]);
}


/** Encode an Ed25519 private key in the "openssh-key-v1" format, unencrypted. */
export function toOpenSshPrivateKey(priv: KeyObject, comment = ""): string {
  const { seed, pub } = ed25519Raw(priv);
  const pubBlob = ed25519PublicBlob(pub);
  const check = randomBytes(4).readUInt32BE(0);
  let section = Buffer.concat([
    uint32(check),
    uint32(check),
    sshString("ssh-ed25519"),
    sshString(pub),
    sshString(Buffer.concat([seed, pub])),
    sshString(comment),
  ]);
  const pad: number[] = [];
  for (let i = 1; (section.length + pad.length) % 8 !== 0; i++) pad.push(i);
  section = Buffer.concat([section, Buffer.from(pad)]);
  const body = Buffer.concat([
    Buffer.from("openssh-key-v1\0", "latin1"),
    sshString("none"),
    sshString("none"),
    sshString(""),
    uint32(1),
    sshString(pubBlob),
    sshString(section),
  ]);
  const b64 = body.toString("base64").replace(/(.{70})/g, "$1\n").replace(/\n$/, "");
  return `-----BEGIN OPENSSH PRIVATE KEY-----\n${b64}\n-----END OPENSSH PRIVATE KEY-----\n`;
}

/** A fresh Ed25519 key pair in OpenSSH formats. */
export function generateSshKeyPair(comment = "berth"): SshKeyPair {
  const { privateKey } = generateKeyPairSync("ed25519");
  return keyPairFromPrivate(privateKey, comment);
}

function keyPairFromPrivate(priv: KeyObject, comment: string): SshKeyPair {
  const { pub } = ed25519Raw(priv);
  const blob = ed25519PublicBlob(pub);
  return {
    privateKey: toOpenSshPrivateKey(priv, comment),
    publicKey: `ssh-ed25519 ${blob.toString("base64")}${comment ? " " + comment : ""}`,
    fingerprint: fingerprintOf(blob),
  };
}

/**
 * Parse an OpenSSH Ed25519 private key file back into a key pair (used to reuse
 * the host key on restart). Throws on anything else, so a damaged file is
 * reported rather than replaced.
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
  // Re-derive through node:crypto to prove the private half matches the public half.
  const pem = key.getPrivatePEM();
  const priv = createPrivateKey(pem);
  const derived = ed25519PublicBlob(ed25519Raw(priv).pub);
  if (!derived.equals(blob)) throw new Error("host key file is inconsistent: private and public halves differ");
  return {
    privateKey: text,
    publicKey: `ssh-ed25519 ${blob.toString("base64")}${comment ? " " + comment : ""}`,
    fingerprint: fingerprintOf(blob),
  };
}
