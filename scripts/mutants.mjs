#!/usr/bin/env node
// Mutation check of the model-based test: each mutant is one deliberate bug
// applied as a literal text patch to a temporary copy of the compiled dist/
// (src/ is never touched); the model test runs against that copy and must
// fail. Reports, per mutant, caught/missed and which invariant check fired.
// A mutant whose patch no longer matches the compiled code is reported
// "stale" (the code moved; update the patch), never counted as caught.
//
// Usage: npm run build && node scripts/mutants.mjs [name ...]
//   BERTH_MUTANT_RUNS (default 2000) sequences per mutant; BERTH_MODEL_SEED fixes the seed.
import { cpSync, existsSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { spawnSync } from "node:child_process";

const MUTANTS = [
  {
    name: "skip-generation-precondition",
    what: "executor onDone applies a completion whatever generation it carries",
    file: "src/coordinator/executor.js",
    from: "if (m.generation !== op.generation) {",
    to: "if (false) {",
  },
  {
    name: "late-completion-unfenced",
    what: "completions are applied without the attempt, state or generation preconditions (a late reply of an earlier attempt acts on a newer borrow)",
    file: "src/coordinator/executor.js",
    from: `if (!current || current.state !== "running" || current.attempts !== op.attempts)`,
    to: `if (!current)`,
    then: { from: "if (m.generation !== op.generation) {", to: "if (false) {" },
  },
  {
    name: "activate-before-confirmation",
    what: "ack marks the grant active before the provider confirmed the install",
    file: "src/store/grants.js",
    from: `"UPDATE grants SET state = 'installing' WHERE id = ?"`,
    to: `"UPDATE grants SET state = 'active' WHERE id = ?"`,
  },
  {
    name: "ready-without-fence",
    what: "after key removal (portable) or on return (keeper) the machine skips the fence and goes to scrub",
    file: "src/core/machine.js",
    from: `to(m, "fencing", now, [{ kind: "fence" }])`,
    to: `to(m, "scrubbing", now, [{ kind: "scrub" }])`,
    all: true,
  },
  {
    name: "skip-key-removal",
    what: "a returned portable machine is fenced without removing the grant's key",
    file: "src/core/machine.js",
    from: `to(m, "revoking", now, [{ kind: "remove_key" }])`,
    to: `to(m, "fencing", now, [{ kind: "fence" }])`,
  },
  {
    name: "inclusive-expiry",
    what: "a grant counts as expired only after expiresAt, not at it",
    file: "src/core/grant.js",
    from: "return now >= expiresAt;",
    to: "return now > expiresAt;",
  },
  {
    name: "heartbeat-moves-expiry",
    what: "a portable heartbeat pushes expiresAt",
    file: "src/store/grants.js",
    from: `"UPDATE grants SET heartbeat_deadline = ? WHERE id = ?"`,
    to: `"UPDATE grants SET heartbeat_deadline = ?, expires_at = expires_at + 1000 WHERE id = ?"`,
  },
  {
    name: "fresh-op-id-per-attempt",
    what: "a retried operation (after a timeout or lost reply) reaches the provider under a new operation id: a blind second install",
    file: "src/coordinator/executor.js",
    from: "provider.run({ opId: op.id,",
    to: "provider.run({ opId: op.attempts > 1 ? op.id + '-' + op.attempts : op.id,",
  },
  {
    name: "late-heartbeat-revives",
    what: "a keeper borrow past its heartbeat deadline still counts as live",
    file: "src/core/borrow.js",
    from: "if (now >= b.heartbeatDeadline)",
    to: "if (false)",
  },
  {
    name: "capacity-without-claims",
    what: "open fill claims are not counted against maxReady/minReady",
    file: "src/coordinator/actions/capacity.js",
    from: "c.openClaims = await countOpenClaims(tx, org, pool, now);",
    to: "c.openClaims = 0;",
  },
  {
    name: "claim-not-consumed",
    what: "registration leaves its fill claim open",
    file: "src/store/claims.js",
    from: `"UPDATE claims SET state = 'consumed', machine_id = ? WHERE id = ?"`,
    to: `"UPDATE claims SET machine_id = ? WHERE id = ?"`,
  },
  {
    name: "raw-token-stored",
    what: "the portable borrow token is stored raw instead of hashed",
    file: "src/coordinator/actions/grants.js",
    from: `tokenHash: hashToken("borrow", token),`,
    to: `tokenHash: token,`,
  },
  {
    name: "no-lease-recovery",
    what: "an operation left running by a crashed coordinator is never picked up again",
    file: "src/store/operations.js",
    from: `op.state === "running" && now < op.updated_at + OP_LEASE_MS`,
    to: `op.state === "running"`,
  },
  {
    name: "namespace-crossing",
    what: "a portable borrow may take a keeper pool's machine",
    file: "src/coordinator/actions/grants.js",
    from: `if (pool.access !== "portable")`,
    to: `if (false)`,
    then: { from: `takeReadyMachine(tx, pool, "portable", now)`, to: `takeReadyMachine(tx, pool, pool.access, now)` },
  },
];

const root = resolve(".");
const only = process.argv.slice(2);
const runs = process.env.BERTH_MUTANT_RUNS ?? "2000";
const results = [];
for (const m of MUTANTS.filter((x) => only.length === 0 || only.includes(x.name))) {
  const dir = mkdtempSync(join(existsSync("/dev/shm") ? "/dev/shm" : tmpdir(), `berth-mutant-${m.name}-`));
  try {
    cpSync(join(root, "dist"), join(dir, "dist"), { recursive: true });
    symlinkSync(join(root, "node_modules"), join(dir, "node_modules"));
    writeFileSync(join(dir, "package.json"), readFileSync(join(root, "package.json")));
    const target = join(dir, "dist", m.file);
    let text = readFileSync(target, "utf8");
    const patches = [{ from: m.from, to: m.to, all: m.all }, ...(m.then ? [m.then] : [])];
    let stale = false;
    for (const p of patches) {
      if (!text.includes(p.from)) stale = true;
      text = p.all ? text.split(p.from).join(p.to) : text.replace(p.from, p.to);
    }
    if (stale) {
      results.push({ name: m.name, outcome: "stale", check: "-", what: m.what });
      console.log(`${m.name}: STALE (patch does not match ${m.file})`);
      continue;
    }
    writeFileSync(target, text);
    const t0 = Date.now();
    const r = spawnSync(process.execPath, ["--test", join(dir, "dist/test/model/coordinator-model.test.js")], {
      cwd: dir,
      env: { ...process.env, BERTH_MODEL_RUNS: runs, BERTH_MODEL_NO_SHRINK: "1" },
      encoding: "utf8",
      maxBuffer: 64 * 1024 * 1024,
    });
    const out = `${r.stdout}\n${r.stderr}`;
    const failed = r.status !== 0;
    const fired = /model run failed \(seed (-?\d+), path ([^)]*)\): \[([A-Za-z0-9]+)\] ([^\n]*)/.exec(out);
    const check = fired ? fired[3] : failed ? "test failed (see output)" : "-";
    results.push({ name: m.name, outcome: failed ? "caught" : "MISSED", check, what: m.what, seconds: Math.round((Date.now() - t0) / 1000), detail: fired ? fired[4].slice(0, 160) : null, seed: fired?.[1], path: fired?.[2] });
    console.log(`${m.name}: ${failed ? "caught" : "MISSED"} by ${check} in ${Math.round((Date.now() - t0) / 1000)} s${fired ? ` — ${fired[4].slice(0, 140)} (seed ${fired[1]}, path ${fired[2]})` : ""}`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
console.log("\n| mutant | outcome | check | what it breaks |\n| --- | --- | --- | --- |");
for (const r of results) console.log(`| ${r.name} | ${r.outcome} | ${r.check} | ${r.what} |`);
process.exit(results.every((r) => r.outcome === "caught") ? 0 : 1);
