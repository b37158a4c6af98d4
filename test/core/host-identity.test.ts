/** The pure half of host identity: challenges, proofs, the stopped report's verdict. */
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { generateKeyPairSync, randomBytes, sign } from "node:crypto";
import {
  CHALLENGE_TTL_MS,
  challengeProblem,
  newChallenge,
  proofMessage,
  stoppedReportVerdict,
  takesMachines,
  floorRecorded,
  verifyProof,
} from "../../src/core/host-identity.js";

const secret = randomBytes(32);

describe("challenges", () => {
  it("is accepted until its expiry, and expired at equality", () => {
    const { challenge, expiresAt } = newChallenge(secret, 1_000, randomBytes);
    assert.equal(expiresAt, 1_000 + CHALLENGE_TTL_MS);
    assert.equal(challengeProblem(secret, challenge, expiresAt - 1), null);
    assert.match(challengeProblem(secret, challenge, expiresAt)!, /expired/);
  });
  it("refuses another coordinator's, a tampered one, and garbage", () => {
    const { challenge } = newChallenge(secret, 1_000, randomBytes);
    assert.match(challengeProblem(randomBytes(32), challenge, 1_001)!, /not a challenge/);
    const later = challenge.replace(/^bch_\d+/, "bch_9999999999999");
    assert.match(challengeProblem(secret, later, 1_001)!, /not a challenge/);
    assert.match(challengeProblem(secret, "bch_garbage", 1_001)!, /not a challenge/);
  });
});

describe("proofs", () => {
  const pair = generateKeyPairSync("ed25519");
  const pub = pair.publicKey.export({ format: "der", type: "spki" }).toString("base64");
  const sig = (purpose: "enroll" | "session" | "prepare", host: string, c: string) => sign(null, proofMessage(purpose, host, c), pair.privateKey).toString("base64");
  it("verifies exactly the purpose, host and challenge signed", () => {
    assert.equal(verifyProof(pub, "session", "h_1", "c1", sig("session", "h_1", "c1")), true);
    assert.equal(verifyProof(pub, "enroll", "h_1", "c1", sig("session", "h_1", "c1")), false, "a session proof is not an enrollment proof");
    assert.equal(verifyProof(pub, "session", "h_2", "c1", sig("session", "h_1", "c1")), false);
    assert.equal(verifyProof(pub, "session", "h_1", "c2", sig("session", "h_1", "c1")), false);
  });
  it("refuses another key, a non-Ed25519 key and garbage", () => {
    const other = generateKeyPairSync("ed25519").publicKey.export({ format: "der", type: "spki" }).toString("base64");
    assert.equal(verifyProof(other, "session", "h_1", "c1", sig("session", "h_1", "c1")), false);
    const rsa = generateKeyPairSync("rsa", { modulusLength: 1024 }).publicKey.export({ format: "der", type: "spki" }).toString("base64");
    assert.equal(verifyProof(rsa, "session", "h_1", "c1", sig("session", "h_1", "c1")), false);
    assert.equal(verifyProof("not-a-key", "session", "h_1", "c1", "x"), false);
  });
});

describe("stopped report verdict", () => {
  it("takes a report at exactly the row's generation; anything else is moot or ignored", () => {
    assert.deepEqual(stoppedReportVerdict({ state: "ready", generation: 3 }, { machineId: "m", generation: 3 }), { kind: "take" });
    assert.equal(stoppedReportVerdict({ state: "ready", generation: 4 }, { machineId: "m", generation: 3 }).kind, "moot", "a newer generation");
    assert.equal(stoppedReportVerdict(undefined, { machineId: "m", generation: 3 }).kind, "moot", "the row is gone");
    assert.equal(stoppedReportVerdict({ state: "destroyed", generation: 3 }, { machineId: "m", generation: 3 }).kind, "moot", "taken already");
    assert.equal(stoppedReportVerdict({ state: "ready", generation: 2 }, { machineId: "m", generation: 3 }).kind, "ignore", "a report ahead of the row stays owed");
  });
  it("only legacy and active hosts take machines; the floor is committed or active", () => {
    assert.deepEqual(["legacy", "preparing", "prepared", "committed", "active"].map((s) => takesMachines(s as never)), [true, false, false, false, true]);
    assert.deepEqual(["legacy", "preparing", "prepared", "committed", "active"].map((s) => floorRecorded(s as never)), [false, false, false, true, true]);
  });
});
