/** The one id constructor: one path segment of [A-Za-z0-9_-]{1,128}, for requests and stored records alike. */
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { isId, newId, parseId } from "../../src/core/ids.js";
import { BerthError } from "../../src/core/errors.js";

describe("parseId", () => {
  const valid = ["a", "b_0123456789abcdefghij", "Pool-1_x", "-", "_", "x".repeat(128)];
  for (const s of valid) {
    it(`${JSON.stringify(s.length > 20 ? s.slice(0, 10) + "…" : s)} (${s.length} chars) is an id`, () => {
      assert.equal(isId(s), true);
      assert.equal(parseId(s), s);
    });
  }
  const invalid: Array<[string, unknown, string]> = [
    ["empty", "", '""'],
    ["129 characters", "x".repeat(129), JSON.stringify("x".repeat(40) + "…")],
    ["a slash", "a/b", '"a/b"'],
    ["a dot segment", "..", '".."'],
    ["a dot", "a.b", '"a.b"'],
    ["a space", "a b", '"a b"'],
    ["percent-encoding", "a%2Fb", '"a%2Fb"'],
    ["non-ASCII letters", "é", '"é"'],
    ["a trailing newline", "abc\n", '"abc\\n"'],
    ["a number", 12, "number"],
    ["null", null, "object"],
    ["undefined", undefined, "undefined"],
  ];
  for (const [label, s, shown] of invalid) {
    it(`${label} is refused with 400 invalid_id naming the field and showing at most 40 characters`, () => {
      assert.equal(isId(s), false);
      assert.throws(
        () => parseId(s, "machineId"),
        (e: unknown) => e instanceof BerthError && e.code === "invalid_id" && e.status === 400 && e.message.includes(`machineId ${shown} is not a valid id`),
      );
    });
  }
});

describe("newId", () => {
  it("is prefix + '_' + 20 base36 characters drawn from the given bytes", () => {
    const bytes = Uint8Array.from({ length: 20 }, (_, i) => i * 13);
    const id = newId("g", (n) => (assert.equal(n, 20), bytes));
    assert.equal(id, "g_" + [...bytes].map((b) => "abcdefghijklmnopqrstuvwxyz0123456789"[b % 36]).join(""));
    assert.match(id, /^g_[a-z0-9]{20}$/);
  });
  it("the same bytes give the same id (randomness is an argument)", () => {
    const r = () => new Uint8Array(20).fill(255);
    assert.equal(newId("m", r), newId("m", r));
  });
  it("a prefix that would make an invalid id is refused", () => {
    assert.throws(() => newId("a/b", () => new Uint8Array(20)), (e: unknown) => e instanceof BerthError && e.code === "invalid_id");
  });
});
