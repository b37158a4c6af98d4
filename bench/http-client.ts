/**
 * Which HTTP client berth's own calls use (coordinator -> agent, agent ->
 * coordinator, client -> coordinator): one small JSON POST over a keep-alive
 * connection, and what loading each client costs a fresh process.
 *
 * The server is a minimal node:http server in a child process (its own event
 * loop, as an agent or a coordinator would be): it reads the JSON body and
 * answers a small JSON object. It stands in for a real `berth agent` so that
 * the figure is the client's, not the handler's.
 *
 *   keep-alive call    per client, alternating the order round by round:
 *                      warm-up calls, then --calls sequential POSTs each timed;
 *                      p50 / p99 of every call, and the bench process's CPU
 *                      time per call
 *   load + first call  a fresh `node` per sample, alternating clients: the
 *                      time to import the client, and to its first reply
 *                      (fetch loads its undici on the first call)
 *
 * Clients: undici `request` (its global pool), node:http with a keep-alive
 * Agent (bare), global fetch, and berth's HttpClient (src/http/client.ts,
 * node:http underneath).
 *
 *   node dist/bench/http-client.js [--rounds 9] [--calls 300] [--loads 15]
 */
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { Agent, request as httpRequest } from "node:http";
import { loadavg } from "node:os";
import { resolve } from "node:path";
import { request as undiciRequest } from "undici";
import { HttpClient } from "../src/http/client.js";
import { arg, dist, printTable, round, writeResult } from "./lib.js";

const rounds = Number(arg("rounds", "9"));
const calls = Number(arg("calls", "300"));
const loads = Number(arg("loads", "15"));
const BODY = { machineId: "m_0123456789abcdef", op: "install-key", args: { publicKey: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample", borrowId: "b_0123456789abcdef" } };

const SERVER = `
const http = require("node:http");
const s = http.createServer((req, res) => {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    const body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
    const out = JSON.stringify({ ok: true, op: body.op, result: { installed: true } });
    res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(out) });
    res.end(out);
  });
});
s.keepAliveTimeout = 30000;
s.listen(0, "127.0.0.1", () => console.log(s.address().port));
`;

function startServer(): Promise<{ child: ChildProcess; url: string }> {
  const child = spawn(process.execPath, ["-e", SERVER], { stdio: ["ignore", "pipe", "inherit"] });
  return new Promise((res, rej) => {
    child.stdout!.once("data", (d: Buffer) => res({ child, url: `http://127.0.0.1:${d.toString().trim()}/v1/agent/ops` }));
    child.once("exit", (c) => rej(new Error(`server exited ${c}`)));
  });
}

type Call = (url: string) => Promise<unknown>;

function clients(): Record<string, { call: Call; close: () => void }> {
  const agent = new Agent({ keepAlive: true });
  const berth = new HttpClient();
  let origin: URL | null = null;
  const payload = JSON.stringify(BODY);
  return {
    undici: {
      call: async (url) => {
        const r = await undiciRequest(url, { method: "POST", headers: { "content-type": "application/json" }, body: payload });
        return JSON.parse(await r.body.text());
      },
      close: () => undefined,
    },
    "node:http": {
      call: (url) =>
        new Promise((res, rej) => {
          const u = new URL(url);
          const req = httpRequest({ method: "POST", host: u.hostname, port: u.port, path: u.pathname, agent, headers: { "content-type": "application/json", "content-length": Buffer.byteLength(payload) } }, (r) => {
            const chunks: Buffer[] = [];
            r.on("data", (c: Buffer) => chunks.push(c));
            r.on("end", () => res(JSON.parse(Buffer.concat(chunks).toString("utf8"))));
            r.on("error", rej);
          });
          req.on("socket", (s) => s.setNoDelay(true));
          req.on("error", rej);
          req.end(payload);
        }),
      close: () => agent.destroy(),
    },
    fetch: {
      call: async (url) => {
        const r = await fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body: payload });
        return r.json();
      },
      close: () => undefined,
    },
    "berth HttpClient": {
      call: async (url) => (await berth.request("POST", (origin ??= new URL(url)), "/v1/agent/ops", { body: BODY, timeoutMs: 60_000, connectTimeoutMs: 5_000 })).body,
      close: () => berth.close(),
    },
  };
}

/** A fresh process: import the client, make one call; prints {load, first} in ms. */
function loadScript(name: string, url: string): string {
  const client = resolve("dist/src/http/client.js");
  const body = JSON.stringify(JSON.stringify(BODY));
  const t = "const t0 = performance.now();";
  const out = "console.log(JSON.stringify({ load: t1 - t0, first: performance.now() - t0 }));";
  switch (name) {
    case "undici":
      return `${t} const { request } = await import("undici"); const t1 = performance.now(); const r = await request(${JSON.stringify(url)}, { method: "POST", headers: { "content-type": "application/json" }, body: ${body} }); await r.body.text(); ${out}`;
    case "node:http":
      return `${t} const http = await import("node:http"); const t1 = performance.now(); await new Promise((res) => { const q = http.request(${JSON.stringify(url)}, { method: "POST", headers: { "content-type": "application/json" } }, (r) => { r.resume(); r.on("end", res); }); q.end(${body}); }); ${out}`;
    case "fetch":
      return `${t} const t1 = performance.now(); const r = await fetch(${JSON.stringify(url)}, { method: "POST", headers: { "content-type": "application/json" }, body: ${body} }); await r.text(); ${out}`;
    case "berth HttpClient":
      return `${t} const { HttpClient } = await import(${JSON.stringify(client)}); const t1 = performance.now(); const c = new HttpClient(); await c.request("POST", new URL(${JSON.stringify(url)}), "/v1/agent/ops", { body: ${body} }); c.close(); ${out}`;
    default:
      throw new Error(name);
  }
}

async function main(): Promise<void> {
  const load0 = loadavg()[0]!;
  const server = await startServer();
  const cs = clients();
  const names = Object.keys(cs);
  const lat = new Map<string, number[]>(names.map((n) => [n, []]));
  const cpu = new Map<string, number[]>(names.map((n) => [n, []]));
  for (let r = 0; r < rounds; r++) {
    const order = names.map((_, i) => names[(i + r) % names.length]!);
    for (const n of order) {
      const c = cs[n]!;
      for (let i = 0; i < 20; i++) await c.call(server.url);
      const c0 = process.cpuUsage();
      for (let i = 0; i < calls; i++) {
        const s = process.hrtime.bigint();
        await c.call(server.url);
        lat.get(n)!.push(Number(process.hrtime.bigint() - s) / 1e6);
      }
      const d = process.cpuUsage(c0);
      cpu.get(n)!.push((d.user + d.system) / calls);
    }
  }
  for (const c of Object.values(cs)) c.close();
  const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
  const callRows = names.map((n) => {
    const d = dist(lat.get(n)!);
    return { client: n, "p50 ms": d.p50, "p99 ms": d.p99, "client CPU µs/call": round(median(cpu.get(n)!), 1) };
  });
  printTable(`one keep-alive JSON POST, ${rounds} rounds x ${calls} calls, alternating`, callRows);

  const loadSamples = new Map<string, Array<{ load: number; first: number }>>(names.map((n) => [n, []]));
  for (let i = 0; i < loads; i++) {
    for (let k = 0; k < names.length; k++) {
      const n = names[(k + i) % names.length]!;
      const r = spawnSync(process.execPath, ["--input-type=module", "-e", loadScript(n, server.url)], { encoding: "utf8" });
      if (r.status !== 0) throw new Error(`${n}: ${r.stderr}`);
      loadSamples.get(n)!.push(JSON.parse(r.stdout) as { load: number; first: number });
    }
  }
  const loadRows = names.map((n) => ({
    client: n,
    "import p50 ms": round(median(loadSamples.get(n)!.map((s) => s.load)), 1),
    "import + first call p50 ms": round(median(loadSamples.get(n)!.map((s) => s.first)), 1),
  }));
  printTable(`load in a fresh process, medians of ${loads}, alternating`, loadRows);
  server.child.kill();
  const load1 = loadavg()[0]!;
  process.stdout.write(`\nload average ${load0.toFixed(2)} at start, ${load1.toFixed(2)} at end\n`);
  process.stdout.write(`${writeResult("http-client", { rounds, calls, loads, loadavg: [load0, load1], keepAlive: callRows, load: loadRows })}\n`);
}

await main();
