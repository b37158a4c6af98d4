/** Bearer secrets: shown once, stored only as domain-separated hashes (invariant 8). */
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { hashToken, newToken, sameHash, type TokenDomain } from "../../src/core/tokens.js";

const DOMAINS: Array<[TokenDomain, string]> = [
  ["api", "bat"],
  ["borrow", "bbt"],
  ["grant", "bgt"],
  ["claim", "bct"],
  ["agent", "bag"],
  ["enroll", "ben"],
  ["host-call", "bhc"],
  ["session", "bss"],
  ["csrf", "bcs"],
];
const fixed = (n: number) => new Uint8Array(n).fill(7);

describe("newToken", () => {
  for (const [domain, prefix] of DOMAINS) {
    it(`${domain}: '${prefix}_' + 32 bytes in base64url`, () => {
      const t = newToken(domain, fixed);
      assert.equal(t, `${prefix}_${Buffer.from(fixed(32)).toString("base64url")}`);
      assert.match(t, /^[a-z]{3}_[A-Za-z0-9_-]{43}$/);
    });
  }
});

describe("hashToken", () => {
  const raw = newToken("borrow", fixed);
  it("[I8] the hash is hex SHA-256 and never contains the raw value", () => {
    const h = hashToken("borrow", raw);
    assert.match(h, /^[0-9a-f]{64}$/);
    assert.ok(!h.includes(raw.slice(4)));
  });
  it("is deterministic for one domain", () => {
    assert.equal(hashToken("api", raw), hashToken("api", raw));
  });
  for (const [a] of DOMAINS) {
    it(`[I8] ${a}: its hash of a value differs from every other domain's`, () => {
      for (const [b] of DOMAINS) if (a !== b) assert.notEqual(hashToken(a, raw), hashToken(b, raw), `${a} vs ${b}`);
    });
  }
  it("[I8] the domain is separated from the value: no (domain, value) split collides", () => {
    // "host-call" + "x" must not hash like "host" + "-call..." or similar concatenations.
    assert.notEqual(hashToken("api", "x"), hashToken("api", "x\0"));
    assert.notEqual(hashToken("agent", "x"), hashToken("api", "gent.v1\0x"));
  });
});

describe("sameHash", () => {
  const h = hashToken("api", "bat_x");
  const cases: Array<[string, string, string, boolean]> = [
    ["equal hashes", h, h.slice(), true],
    ["one differing character", h, h.slice(0, -1) + (h.endsWith("0") ? "1" : "0"), false],
    ["different lengths", h, h.slice(0, -2), false],
    ["empty against a hash", "", h, false],
  ];
  for (const [label, a, b, same] of cases) {
    it(`${label}: ${same}`, () => {
      assert.equal(sameHash(a, b), same);
    });
  }
});

describe("hashToken keeps the stored hashes", () => {
  it("is SHA-256 of 'berth.<domain>.v1', a NUL and the raw token, in hex (a known vector; every stored token hash depends on it)", () => {
    assert.equal(hashToken("api", "bat_x"), "312c4b969cac41b05e21864a3c4744c8334493d13ac10fee26d01659324f0474");
    for (const [domain] of DOMAINS) {
      for (const raw of ["", "bat_AAAA", "é∂ 😀", "x".repeat(600)]) {
        assert.equal(hashToken(domain, raw), createHash("sha256").update(`berth.${domain}.v1\0`).update(raw).digest("hex"), `${domain} ${raw.slice(0, 8)}`);
      }
    }
  });
});
