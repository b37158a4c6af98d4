/** Every error code maps to one HTTP status; closed unions fail loudly on an unknown arm. */
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { assertNever, BerthError, isBerthError, type ErrorCode } from "../../src/core/errors.js";

// A Record over the union: a new code that is not listed here fails to compile.
const STATUS: Record<ErrorCode, number> = {
  invalid_id: 400,
  invalid_request: 400,
  body_too_large: 413,
  rate_limited: 429,
  too_many_connections: 503,
  request_timeout: 408,
  unauthorized: 401,
  forbidden: 403,
  not_found: 404,
  conflict: 409,
  pool_exhausted: 503,
  not_admitted: 403,
  budget_exhausted: 409,
  no_capacity: 503,
  host_activated: 403,
  host_exists: 409,
  host_awaiting: 401,
  host_busy: 409,
  host_switching: 409,
  host_withdrawn: 409,
  image_invalid: 422,
  network_tampered: 409,
  image_unavailable: 502,
  image_too_large: 413,
  sftp_unavailable: 422,
  transfer_cut: 502,
  disk_full: 507,
  disk_not_enforceable: 409,
  aborted: 499,
  borrow_not_active: 409,
  borrow_expired: 409,
  generation_mismatch: 409,
  claim_consumed: 409,
  claim_expired: 409,
  claim_not_found: 404,
  namespace_conflict: 409,
  portable_unsupported: 400,
  grant_expired: 409,
  grant_not_pending: 409,
  duration_too_long: 400,
  token_mismatch: 403,
  key_mismatch: 403,
  provider_unavailable: 503,
  operation_failed: 502,
  store_busy: 503,
  method_not_allowed: 405,
  invalid_agent_reply: 502,
  internal: 500,
};

describe("BerthError: code -> status", () => {
  for (const [code, status] of Object.entries(STATUS) as Array<[ErrorCode, number]>) {
    it(`${code} -> ${status}`, () => {
      const e = new BerthError(code, `${code}: something happened`);
      assert.equal(e.status, status);
      assert.equal(e.code, code);
      assert.equal(e.name, "BerthError");
      assert.equal(e.message, `${code}: something happened`);
      assert.ok(isBerthError(e));
      assert.ok(e instanceof Error);
    });
  }
});

describe("isBerthError and assertNever", () => {
  const others: Array<[string, unknown]> = [
    ["a plain Error", new Error("x")],
    ["an object shaped like one", { code: "not_found", status: 404, message: "x" }],
    ["null", null],
  ];
  for (const [label, v] of others) {
    it(`${label} is not a BerthError`, () => {
      assert.equal(isBerthError(v), false);
    });
  }
  it("assertNever throws naming what it saw", () => {
    assert.throws(() => assertNever("surprise" as never, "machine event"), /unexpected machine event: "surprise"/);
  });
});
