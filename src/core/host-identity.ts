/**
 * Host identity, the pure half (docs/host-identity.md): the names of the
 * switch's steps, the proof an agent signs with its Ed25519 identity key,
 * the coordinator's stateless challenges, and the decision on a stopped
 * report. No I/O; time and randomness come in as arguments.
 *
 * A proof is an Ed25519 signature over a domain-separated message naming
 * what it is for (`enroll`, `session`), the host it speaks for and a
 * challenge the coordinator minted a moment ago. A challenge is
 * `bch_<expiresAt>.<nonce>.<mac>`: an HMAC under the coordinator secret, so
 * any coordinator sharing the secret checks it without a row, and the
 * coordinator records each one used so that a proof is never taken twice.
 */
import { createHmac, createHash, createPublicKey, verify, type KeyObject } from "node:crypto";
import { hashToken, sameHash } from "./tokens.js";

/** The agent's durable record steps; `legacy` is no record at all. */
export type SwitchStep = "local" | "cloud" | "active";
export const SWITCH_STEPS: readonly SwitchStep[] = ["local", "cloud", "active"];

/**
 * The coordinator's view of a host's credentials:
 *   legacy     the shared enroll token still admits it (the agent's old way);
 *   preparing  an operator asked for the switch; nothing recorded of the agent yet;
 *   prepared   the agent's identity key is recorded: the coordinator honours its commit;
 *   committed  the floor is recorded: the host's key is its only way in;
 *   active     the agent purged the token and advertises itself active;
 *   awaiting   an operator reset the host's identity (`berth host reset-identity`):
 *              no credential is honoured and no call is made to it until its
 *              agent binds a key again, enrolling with the one-time enroll
 *              token the reset issued.
 * The shared enroll token never admits an existing host, whatever its state.
 */
export type HostIdentityState = "legacy" | "preparing" | "prepared" | "committed" | "active" | "awaiting";
export const HOST_IDENTITY_STATES: readonly HostIdentityState[] = ["legacy", "preparing", "prepared", "committed", "active", "awaiting"];

/** The floor is recorded: the host's identity key is the only way in. */
export function floorRecorded(s: HostIdentityState): boolean {
  return s === "committed" || s === "active";
}

/** Whether new machines may be placed on a host in state `s`. */
export function takesMachines(s: HostIdentityState): boolean {
  return s === "legacy" || s === "active";
}

export type ProofPurpose = "enroll" | "prepare" | "session";

/**
 * The proof of a host's current host-call token (an agent enrolled on the
 * shared token, or one still switching): an HMAC keyed by the token's hash
 * (what the agent keeps; the coordinator derives the token, so it knows the
 * hash too) over the purpose, the host id, the coordinator's challenge and
 * the identity key the proof vouches for. The switch records a key only
 * with this proof (docs/host-identity.md).
 */
export function callProof(tokenHash: string, purpose: "prepare", hostId: string, challenge: string, publicKey: string): string {
  return createHmac("sha256", Buffer.from(tokenHash, "utf8")).update(`berth.host-call-proof.v1\0${purpose}\0${hostId}\0${challenge}\0${publicKey}`).digest("base64url");
}

/** Whether `proof` proves the host-call token `callToken` for this purpose, host, challenge and key. */
export function verifyCallProof(callToken: string, proof: unknown, purpose: "prepare", hostId: string, challenge: string, publicKey: string): boolean {
  if (typeof proof !== "string" || !/^[A-Za-z0-9_-]{43}$/.test(proof)) return false;
  return sameHash(callProof(hashToken("host-call", callToken), purpose, hostId, challenge, publicKey), proof);
}

/** What an identity key signs: purpose, host (its name for `enroll`, its id for `prepare` and `session`), challenge. */
export function proofMessage(purpose: ProofPurpose, host: string, challenge: string): Buffer {
  return Buffer.from(`berth.host-proof.v1\0${purpose}\0${host}\0${challenge}`, "utf8");
}

export const CHALLENGE_TTL_MS = 60_000;

function challengeMac(secret: Uint8Array, body: string): string {
  return createHmac("sha256", secret).update(`host-challenge:${body}`).digest("base64url");
}

/** A fresh challenge, valid for CHALLENGE_TTL_MS. */
export function newChallenge(secret: Uint8Array, now: number, randomBytes: (n: number) => Uint8Array): { challenge: string; expiresAt: number } {
  const expiresAt = now + CHALLENGE_TTL_MS;
  const body = `${expiresAt}.${Buffer.from(randomBytes(18)).toString("base64url")}`;
  return { challenge: `bch_${body}.${challengeMac(secret, body)}`, expiresAt };
}

/** Why a challenge is not acceptable now, or null when it is one this coordinator minted and it has not expired. */
export function challengeProblem(secret: Uint8Array, challenge: string, now: number): string | null {
  const m = /^bch_((\d{1,16})\.([A-Za-z0-9_-]{1,64}))\.([A-Za-z0-9_-]{43})$/.exec(challenge);
  if (m === null) return "it is not a challenge this coordinator issued";
  if (!sameHash(challengeMac(secret, m[1]!), m[4]!)) return "it is not a challenge this coordinator issued";
  if (now >= Number(m[2])) return "it expired; ask for a new one";
  return null;
}

/** The stored name of a used challenge (a domain-separated hash). */
export function challengeDigest(challenge: string): string {
  return createHash("sha256").update("berth.host-challenge.v1\0").update(challenge).digest("hex");
}

/** An identity public key as sent: base64 of its SPKI DER. Null when it is not an Ed25519 key. */
export function parseIdentityKey(spkiBase64: string): KeyObject | null {
  if (!/^[A-Za-z0-9+/=]{40,200}$/.test(spkiBase64)) return null;
  try {
    const key = createPublicKey({ key: Buffer.from(spkiBase64, "base64"), format: "der", type: "spki" });
    return key.asymmetricKeyType === "ed25519" ? key : null;
  } catch {
    return null;
  }
}

/** `SHA256:<base64>` of the key's SPKI bytes: how logs, `berth host ls` and the host-call token name it. */
export function identityFingerprint(spkiBase64: string): string {
  return "SHA256:" + createHash("sha256").update(Buffer.from(spkiBase64, "base64")).digest("base64").replace(/=+$/, "");
}

/** Whether `signature` (base64) is `spkiBase64`'s signature over the proof message. */
export function verifyProof(spkiBase64: string, purpose: ProofPurpose, host: string, challenge: string, signature: string): boolean {
  const key = parseIdentityKey(spkiBase64);
  if (key === null || !/^[A-Za-z0-9+/=]{80,100}$/.test(signature)) return false;
  try {
    return verify(null, proofMessage(purpose, host, challenge), key, Buffer.from(signature, "base64"));
  } catch {
    return false;
  }
}

/** One owed stopped report: the agent's machine (the coordinator's resource id) at its exact generation. */
export interface StoppedReport {
  machineId: string;
  generation: number;
}

/**
 * A stopped report against the coordinator's machine row:
 *   take    the row is at exactly that generation and not destroyed yet: it is destroyed now;
 *   moot    nothing to do, now or later: no row, a newer generation, or already destroyed
 *           (the agent stops sending it);
 *   ignore  the row is at an older generation than the report (it cannot be taken now;
 *           the agent keeps it owed).
 */
export type ReportVerdict = { kind: "take" } | { kind: "moot"; why: string } | { kind: "ignore"; why: string };

export function stoppedReportVerdict(row: { state: string; generation: number } | undefined, report: StoppedReport): ReportVerdict {
  if (row === undefined) return { kind: "moot", why: "no such machine" };
  if (row.state === "destroyed") return { kind: "moot", why: "already destroyed" };
  if (row.generation > report.generation) return { kind: "moot", why: `the machine is at a newer generation ${row.generation}` };
  if (row.generation < report.generation) return { kind: "ignore", why: `the machine is at an older generation ${row.generation}` };
  return { kind: "take" };
}
