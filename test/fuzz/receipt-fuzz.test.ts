/**
 * Fuzzing of the CLI's receipt parsing (src/cli/receipt.ts readReceipt): a
 * receipt is the client's only record of a borrow's tokens, so whatever the
 * file holds (random bytes, invalid UTF-8, broken or oversized JSON, a
 * valid receipt with one field broken, wrong permissions, a directory, no
 * file at all) reading it either returns a well-formed receipt or throws a
 * BerthError with code invalid_request — never anything else, and never a
 * message that repeats a token found in the file.
 *
 *   BERTH_FUZZ_RUNS (default 1500), BERTH_FUZZ_SEED to replay.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { chmodSync, mkdirSync, writeFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import fc from "fast-check";
import { readReceipt, writeReceipt, type Receipt } from "../../src/cli/receipt.js";
import { BerthError } from "../../src/core/errors.js";
import { tempDir } from "../helpers/env.js";

const RUNS = Number(process.env.BERTH_FUZZ_RUNS ?? 1500);
const SEED = process.env.BERTH_FUZZ_SEED !== undefined ? Number(process.env.BERTH_FUZZ_SEED) : (Date.now() ^ (Math.random() * 0x7fffffff)) | 0;

const token = (prefix: string) => fc.stringMatching(/^[A-Za-z0-9_-]{43}$/).map((s) => `${prefix}_${s}`);

const valid: fc.Arbitrary<Receipt> = fc.record({
  version: fc.constant(1 as const),
  url: fc.constantFrom("http://127.0.0.1:7420", "https://berth.example.com"),
  access: fc.constantFrom("keeper" as const, "portable" as const),
  pool: fc.stringMatching(/^[A-Za-z0-9_-]{1,20}$/),
  borrowId: fc.stringMatching(/^[bg]_[a-z0-9]{20}$/),
  borrowToken: token("bbt"),
  grantToken: fc.option(token("bgt"), { nil: null }),
  keyFile: fc.option(fc.constant("/tmp/key"), { nil: null }),
  publicKey: fc.option(fc.constant("ssh-ed25519 AAAA"), { nil: null }),
  machine: fc.record({
    id: fc.stringMatching(/^m_[a-z0-9]{10}$/),
    generation: fc.nat(),
    ssh: fc.record({ host: fc.option(fc.constant("127.0.0.1"), { nil: null }), port: fc.option(fc.integer({ min: 1, max: 65535 }), { nil: null }), user: fc.option(fc.constant("m"), { nil: null }), hostKey: fc.option(fc.constant("ssh-ed25519 AAAA"), { nil: null }) }),
  }),
  state: fc.constantFrom("pending" as const, "active" as const, "returned" as const, "expired" as const),
  heartbeatMs: fc.nat(),
  expiresAt: fc.nat(),
  createdAt: fc.nat(),
});

/** One field of a valid receipt replaced, removed, or an unknown one added. */
const broken = fc.tuple(valid, fc.constantFrom("version", "url", "access", "pool", "borrowId", "borrowToken", "grantToken", "machine", "state", "expiresAt", "extra"), fc.jsonValue({ maxDepth: 2 }), token("bbt"), fc.nat(3)).map(([r, field, value, tok, how]) => {
  const o: Record<string, unknown> = { ...r };
  if (how === 0) delete o[field];
  else if (how === 1) o[field] = value;
  // A token where an id or a URL belongs: the refusal must not repeat it.
  else if (how === 2) o[field] = tok;
  else o[field] = `${tok}/${"x".repeat(300)}`;
  return JSON.stringify(o);
});

const content = fc.oneof(
  valid.map((r) => Buffer.from(JSON.stringify(r))),
  broken.map((s) => Buffer.from(s)),
  fc.jsonValue({ maxDepth: 3 }).map((v) => Buffer.from(JSON.stringify(v))),
  fc.uint8Array({ maxLength: 400 }).map((a) => Buffer.from(a)),
  valid.map((r) => Buffer.from(JSON.stringify(r).slice(0, -7))),
  valid.map((r) => Buffer.concat([Buffer.from(JSON.stringify(r)), Buffer.from([0xff, 0xfe])])),
  fc.constantFrom(Buffer.alloc(0), Buffer.from("null"), Buffer.from("[]"), Buffer.from('{"__proto__":{"version":1}}'), Buffer.from("\uFEFF{}")),
  fc.integer({ min: 100_000, max: 400_000 }).map((n) => Buffer.from(JSON.stringify({ version: 1, borrowToken: "bbt_" + "A".repeat(n) }))),
);

const shape = fc.constantFrom("file", "file", "file", "file", "readable-by-others", "directory", "missing");

function tokensIn(b: Buffer): string[] {
  return b.toString("latin1").match(/b[bgca][tg]_[A-Za-z0-9_-]{20,}/g) ?? [];
}

test(`[I8] receipt parsing fuzz: ${RUNS} files only ever yield a receipt or invalid_request, never echo a token (seed ${SEED})`, async () => {
  const tmp = tempDir("berth-receipt-fuzz-");
  let n = 0;
  const outcomes = { ok: 0, refused: 0 };
  try {
    const out = await fc.check(
      fc.property(content, shape, (bytes, kind) => {
        const path = join(tmp.path, `r${n++}.json`);
        if (kind === "directory") mkdirSync(path);
        else if (kind !== "missing") {
          writeFileSync(path, bytes, { mode: 0o600 });
          chmodSync(path, kind === "readable-by-others" ? 0o644 : 0o600);
        }
        try {
          const r = readReceipt(path);
          outcomes.ok++;
          // Whatever parses is a whole receipt that writes back the same way.
          assert.equal(kind, "file");
          writeReceipt(`${path}.again`, r);
          assert.deepEqual(readReceipt(`${path}.again`), r);
        } catch (e) {
          assert.ok(e instanceof BerthError, `readReceipt threw a non-BerthError: ${String(e)}`);
          assert.equal(e.code, "invalid_request", e.message);
          for (const t of tokensIn(bytes)) assert.ok(!e.message.includes(t) && !e.message.includes(t.slice(0, 24)), `the refusal repeats a token: ${e.message.slice(0, 200)}`);
          assert.ok(e.message.length < 1_000, "the refusal is short");
          outcomes.refused++;
        } finally {
          rmSync(path, { recursive: true, force: true });
          rmSync(`${path}.again`, { force: true });
        }
      }),
      { numRuns: RUNS, seed: SEED },
    );
    if (out.failed) {
      const why = out.errorInstance instanceof Error ? out.errorInstance.message : String(out.errorInstance);
      throw new Error(`${why}\n${fc.defaultReportMessage(out) ?? ""}\nreplay: BERTH_FUZZ_SEED=${out.seed} node scripts/run-tests.mjs receipt-fuzz`);
    }
    assert.ok(outcomes.ok > 0 && outcomes.refused > 0, `both arms exercised: ${JSON.stringify(outcomes)}`);
    console.log(`receipt fuzz: ${JSON.stringify(outcomes)}`);
  } finally {
    tmp.cleanup();
  }
});
