/**
 * Portable grant decisions, arm by arm: the expiry formula fixed at issue,
 * expiry at equality, usability, where an invalidated grant's machine goes,
 * and every check of an acknowledgement in its order.
 */
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import {
  ackDecision,
  afterInvalidation,
  grantExpiresAt,
  grantUsable,
  isExpired,
  MAX_GRANT_MS,
  type AckInput,
  type GrantState,
  type InvalidationReason,
} from "../../src/core/grant.js";

const NOW = 1_000_000_000;
const MIN = 60_000;

describe("grantExpiresAt: min(now + requested, now + 30 min, machine hard TTL, authorization expiry)", () => {
  type Input = Parameters<typeof grantExpiresAt>[0];
  const base: Input = { now: NOW, requestedMs: 10 * MIN, maxMs: MAX_GRANT_MS, machineHardExpiresAt: NOW + 60 * MIN, authorizationExpiresAt: null };
  const cases: Array<{ title: string; input: Partial<Input>; expect: number }> = [
    { title: "[I3] the requested duration binds when it is the smallest", input: {}, expect: NOW + 10 * MIN },
    { title: "[I3] no requested duration: the maximum (30 min)", input: { requestedMs: null }, expect: NOW + MAX_GRANT_MS },
    { title: "[I3] a request over 30 min is cut to 30 min", input: { requestedMs: 2 * 60 * MIN }, expect: NOW + MAX_GRANT_MS },
    { title: "[I3] a pool maximum above 30 min never lifts the 30 min cap", input: { requestedMs: null, maxMs: 4 * 60 * MIN }, expect: NOW + MAX_GRANT_MS },
    { title: "[I3] a pool maximum below the request binds", input: { maxMs: 5 * MIN }, expect: NOW + 5 * MIN },
    { title: "[I3] the machine's hard TTL binds when it comes first", input: { machineHardExpiresAt: NOW + 3 * MIN }, expect: NOW + 3 * MIN },
    { title: "[I3] the principal's authorization expiry binds when it comes first", input: { authorizationExpiresAt: NOW + 2 * MIN }, expect: NOW + 2 * MIN },
    { title: "[I3] an authorization expiring after every other cap changes nothing", input: { authorizationExpiresAt: NOW + 24 * 60 * MIN }, expect: NOW + 10 * MIN },
    { title: "[I3] a zero request expires at issue", input: { requestedMs: 0 }, expect: NOW },
  ];
  for (const c of cases) {
    it(c.title, () => {
      assert.equal(grantExpiresAt({ ...base, ...c.input }), c.expect);
    });
  }
});

describe("isExpired and grantUsable: at now == expiresAt the grant is expired", () => {
  const cases: Array<{ title: string; now: number; expired: boolean }> = [
    { title: "one millisecond before expiresAt: not expired", now: NOW - 1, expired: false },
    { title: "[I3] at now == expiresAt: expired", now: NOW, expired: true },
    { title: "after expiresAt: expired", now: NOW + 1, expired: true },
  ];
  for (const c of cases) {
    it(c.title, () => {
      assert.equal(isExpired(NOW, c.now), c.expired);
      assert.equal(grantUsable({ state: "active", expiresAt: NOW }, c.now), !c.expired);
    });
  }
  const states: GrantState[] = ["pending", "installing", "active", "invalidated", "revoked", "fenced", "closed"];
  for (const state of states) {
    it(`[I2] a ${state} grant before its expiry is ${state === "active" ? "" : "not "}usable`, () => {
      assert.equal(grantUsable({ state, expiresAt: NOW }, NOW - 1), state === "active");
    });
  }
});

describe("afterInvalidation: where the machine of an invalidated grant goes", () => {
  const cases: Array<{ reason: InvalidationReason; to: "cleanup" | "quarantine" | "drain"; tag: string }> = [
    { reason: "returned", to: "cleanup", tag: "[I5]" },
    { reason: "ended_by_operator", to: "cleanup", tag: "[I5]" },
    { reason: "expired", to: "cleanup", tag: "[I5]" },
    { reason: "token_revoked", to: "cleanup", tag: "[I5]" },
    { reason: "drained", to: "drain", tag: "" },
    { reason: "ack_timeout", to: "quarantine", tag: "[I6]" },
    { reason: "heartbeat_missed", to: "quarantine", tag: "[I6]" },
    { reason: "revalidation_failed", to: "quarantine", tag: "[I5]" },
    { reason: "identity_drift", to: "quarantine", tag: "[I5]" },
    { reason: "machine_lost", to: "quarantine", tag: "[I5]" },
  ];
  for (const c of cases) {
    it(`${c.tag ? c.tag + " " : ""}${c.reason} -> ${c.to}`, () => {
      assert.equal(afterInvalidation(c.reason), c.to);
    });
  }
  it("an unknown reason is an error, never a silent default", () => {
    assert.throws(() => afterInvalidation("bogus" as InvalidationReason), /unexpected invalidation reason/);
  });
});

describe("ackDecision: the checks of an acknowledgement, in order", () => {
  const EXP = NOW + 10 * MIN;
  const base = (): AckInput => ({
    grant: { state: "pending", ackDeadline: NOW + MIN, expiresAt: EXP, fingerprint: "SHA256:a", generation: 4, borrower: "tok_1", org: "acme" },
    machine: { state: "reserved", generation: 4 },
    principal: { tokenId: "tok_1", org: "acme", expiresAt: null },
    fingerprint: "SHA256:a",
    now: NOW,
  });
  type Tweak = (i: AckInput) => void;
  const refuse = (code: string) => ({ kind: "refuse", code });
  const cases: Array<{ title: string; tweak: Tweak; expect: { kind: string } & Record<string, unknown> }> = [
    { title: "[I2] a pending grant, in time, the right key and machine: install", tweak: () => {}, expect: { kind: "install" } },
    { title: "another organisation: forbidden", tweak: (i) => (i.principal.org = "other"), expect: refuse("forbidden") },
    { title: "another borrower of the same organisation: forbidden", tweak: (i) => (i.principal.tokenId = "tok_2"), expect: refuse("forbidden") },
    { title: "another public key: key_mismatch", tweak: (i) => (i.fingerprint = "SHA256:b"), expect: refuse("key_mismatch") },
    { title: "a replay of an installing grant: its state", tweak: (i) => (i.grant.state = "installing"), expect: { kind: "replay", state: "installing" } },
    { title: "a replay of an active grant: its state", tweak: (i) => (i.grant.state = "active"), expect: { kind: "replay", state: "active" } },
    {
      title: "[I3] a replay of an active grant at now == expiresAt: grant_expired, never active",
      tweak: (i) => ((i.grant.state = "active"), (i.now = EXP)),
      expect: refuse("grant_expired"),
    },
    {
      title: "[I3] a replay of an installing grant at now == expiresAt: grant_expired",
      tweak: (i) => ((i.grant.state = "installing"), (i.now = EXP)),
      expect: refuse("grant_expired"),
    },
    ...(["invalidated", "revoked", "fenced", "closed"] as const).map((state) => ({
      title: `[I6] a ${state} grant: grant_not_pending`,
      tweak: (i: AckInput) => (i.grant.state = state),
      expect: refuse("grant_not_pending"),
    })),
    {
      title: "[I3] a pending grant at now == expiresAt: grant_expired",
      tweak: (i) => ((i.grant.ackDeadline = EXP + 1), (i.now = EXP)),
      expect: { kind: "refuse", code: "grant_expired", why: "the grant's hard deadline has passed" },
    },
    {
      title: "[I6] a pending grant at now == ackDeadline: grant_expired (acknowledgement deadline)",
      tweak: (i) => (i.now = i.grant.ackDeadline),
      expect: { kind: "refuse", code: "grant_expired", why: "the acknowledgement deadline has passed" },
    },
    { title: "one millisecond before the ack deadline: install", tweak: (i) => (i.now = i.grant.ackDeadline - 1), expect: { kind: "install" } },
    {
      title: "[I2] the borrower's authorization now ends before the grant: forbidden",
      tweak: (i) => (i.principal.expiresAt = EXP - 1),
      expect: refuse("forbidden"),
    },
    { title: "the borrower's authorization ends exactly with the grant: install", tweak: (i) => (i.principal.expiresAt = EXP), expect: { kind: "install" } },
    { title: "[I4] the machine record is gone: generation_mismatch", tweak: (i) => (i.machine = null), expect: refuse("generation_mismatch") },
    { title: "[I4] the machine is no longer reserved: generation_mismatch", tweak: (i) => (i.machine = { state: "revoking", generation: 4 }), expect: refuse("generation_mismatch") },
    { title: "[I4] the machine moved to another generation: generation_mismatch", tweak: (i) => (i.machine = { state: "reserved", generation: 5 }), expect: refuse("generation_mismatch") },
    {
      title: "the borrower check comes before the key check",
      tweak: (i) => ((i.principal.tokenId = "tok_2"), (i.fingerprint = "SHA256:b")),
      expect: refuse("forbidden"),
    },
    {
      title: "the key check comes before the state: a replay with another key is key_mismatch",
      tweak: (i) => ((i.grant.state = "active"), (i.fingerprint = "SHA256:b")),
      expect: refuse("key_mismatch"),
    },
  ];
  for (const c of cases) {
    it(c.title, () => {
      const input = base();
      c.tweak(input);
      const d = ackDecision(input);
      for (const [k, v] of Object.entries(c.expect)) assert.equal((d as Record<string, unknown>)[k], v, `${k} of ${JSON.stringify(d)}`);
    });
  }
});
