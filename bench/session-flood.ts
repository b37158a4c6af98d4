/**
 * Session flood: memory of the agent while 50 MB flow through one session to a
 * slowly reading client, and how long a second session's resize takes to be
 * answered meanwhile.
 *
 * The gateway runs in a child process (so its memory is measured alone, not
 * mixed with the client's); it reports process.memoryUsage() every 50 ms.
 * Usage: node dist/bench/session-flood.js [process|gvisor] [MB]
 * Prints a summary and writes bench/results/session-flood-<runtime>.json.
 */
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { generateSshKeyPair } from "../src/core/ssh-keys.js";
import { connect, run, Term } from "../test/helpers/ssh-testkit.js";

const kind = process.argv[2] === "gvisor" ? "gvisor" : "process";
const mb = Number(process.argv[3] ?? 50);
const bytes = mb * 1048576;
const dir = mkdtempSync(join(tmpdir(), "berth-flood-"));
const dist = resolve("dist/src/agent");
const helpers = resolve("dist/test/helpers");
const pair = generateSshKeyPair();
const machine = "m_flood";
const script = join(dir, "agent.mjs");
writeFileSync(
  script,
  `import { startGateway } from "${dist}/ssh/gateway.js";
import { createRuntime } from "${dist}/runtime/index.js";
import { MemoryKeys } from "${helpers}/ssh-testkit.js";
const runtime = createRuntime(${JSON.stringify(kind)}, ${JSON.stringify(join(dir, "rt"))});
const m = await runtime.create(${JSON.stringify(machine)});
const keys = new MemoryKeys();
keys.install({ machineId: ${JSON.stringify(machine)}, fingerprint: ${JSON.stringify(pair.fingerprint)}, grantId: "g_flood", expiresAt: null });
const gw = await startGateway({ hostKeyPath: ${JSON.stringify(join(dir, "host_key"))}, listen: { host: "127.0.0.1", port: 0 }, keys, runtime, log: { info() {}, warn() {}, error() {} } });
console.log(JSON.stringify({ port: gw.port, workspace: m.workspace }));
setInterval(() => { const u = process.memoryUsage(); console.log(JSON.stringify({ rss: u.rss, heap: u.heapUsed, ext: u.external + u.arrayBuffers })); }, 50);
process.on("SIGTERM", async () => { await gw.close(); await runtime.destroy(${JSON.stringify(machine)}); process.exit(0); });
`,
);
const agent = spawn(process.execPath, [script], { stdio: ["ignore", "pipe", "inherit"] });
let first: { port: number; workspace: string } | null = null;
const samples: { rss: number; heap: number; ext: number }[] = [];
let buf = "";
agent.stdout.on("data", (b: Buffer) => {
  buf += b.toString();
  let i;
  while ((i = buf.indexOf("\n")) >= 0) {
    const line = JSON.parse(buf.slice(0, i));
    buf = buf.slice(i + 1);
    if ("port" in line) first = line;
    else samples.push(line);
  }
});
while (!first) await new Promise((r) => setTimeout(r, 20));
const { port } = first as { port: number; workspace: string };
const c = await connect({ port, username: machine, privateKey: pair.privateKey });
await run(c, `head -c ${bytes} /dev/urandom > flood.bin`);
const expected = (await run(c, "sha256sum flood.bin")).stdout.toString().split(" ")[0];
const second = await Term.open(await connect({ port, username: machine, privateKey: pair.privateKey }), { rows: 24, cols: 80, term: "xterm" } as never);
await new Promise((r) => setTimeout(r, 500));
const base = samples[samples.length - 1]!;
const startIdx = samples.length;

const flood = await Term.open(c, false, "cat flood.bin");
flood.ch.removeAllListeners("data");
const hash = createHash("sha256");
let received = 0;
const t0 = Date.now();
const closed = new Promise<void>((r) => flood.ch.on("close", () => r()));
flood.ch.on("data", (b: Buffer) => {
  hash.update(b);
  received += b.length;
  flood.ch.pause();
  setTimeout(() => flood.ch.resume(), 1);
});
const resizeMs: number[] = [];
for (let i = 0; received < bytes && i < 200; i++) {
  const rows = 30 + (i % 20);
  const from = second.text.length;
  const s = Date.now();
  second.ch.setWindow(rows, 100, 0, 0);
  second.write(`echo "sz $(stty size)"\n`);
  await second.waitFor(new RegExp(`sz ${rows} 100`), from);
  resizeMs.push(Date.now() - s);
  await new Promise((r) => setTimeout(r, 50));
}
await closed;
const seconds = (Date.now() - t0) / 1000;
const during = samples.slice(startIdx);
const peak = (k: "rss" | "heap" | "ext") => Math.max(...during.map((s) => s[k])) - base[k];
const sorted = [...resizeMs].sort((a, b) => a - b);
const q = (p: number) => sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))] ?? NaN;
const result = {
  runtime: kind,
  megabytes: mb,
  complete: received === bytes && hash.digest("hex") === expected,
  seconds,
  throughputMBps: mb / seconds,
  agentPeakGrowthMB: { rss: peak("rss") / 1048576, heap: peak("heap") / 1048576, buffers: peak("ext") / 1048576 },
  resizeAnsweredMs: { n: resizeMs.length, p50: q(0.5), p99: q(0.99), max: sorted[sorted.length - 1] },
};
console.log(JSON.stringify(result, null, 2));
mkdirSync("bench/results", { recursive: true });
writeFileSync(`bench/results/session-flood-${kind}.json`, JSON.stringify(result, null, 2) + "\n");
c.end();
agent.kill("SIGTERM");
await new Promise((r) => agent.once("exit", r));
rmSync(dir, { recursive: true, force: true });
process.exit(result.complete ? 0 : 1);
