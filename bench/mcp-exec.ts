/**
 * `berth mcp` over stdio vs the client library's exec, on the same machine:
 * tool call → command output for `true`.
 *
 * A real `berth up` (process runtime, or gvisor with --runtime gvisor) in a
 * temp directory. `berth mcp` is started by the MCP SDK's own stdio client
 * (as an MCP client application starts it) and borrows a machine M; each MCP
 * sample is one `run_command {command: ["true"]}` call, timed from the call
 * to its answer (the exit status and output in the result). Each library
 * sample is one `BerthClient.exec(M, ["true"])` with output collected, on its
 * own SSH connection to M: the keeper key reaches every machine of a keeper
 * pool, so the library's borrow of another machine gives the gateway endpoint
 * and M's id names the SSH user. The two alternate sample by sample, after a
 * warm-up of each; medians and the ratio are printed and written as JSON.
 *
 * Usage: node dist/bench/mcp-exec.js [--samples 200] [--warmup 20] [--runtime process|gvisor]
 */
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { BerthClient } from "../src/client/client.js";
import { Borrow } from "../src/client/borrow.js";
import { arg, BIN, dist, ms, printTable, round, writeResult } from "./lib.js";

const samples = Number(arg("samples", "200"));
const warmup = Number(arg("warmup", "20"));
const runtime = arg("runtime", "process");

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), "berth-bench-mcp-"));
  const state = join(dir, ".berth");
  const up = spawn(process.execPath, [BIN, "up", "--state-dir", state, "--listen", "127.0.0.1:0", "--runtime", runtime], { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, BERTH_LOG_LEVEL: "warn", BERTH_PG_URL: "" } });
  let upOut = "";
  up.stdout!.on("data", (d: Buffer) => (upOut += d.toString()));
  up.stderr!.on("data", (d: Buffer) => (upOut += d.toString()));
  await new Promise<void>((resolve, reject) => {
    const t = setInterval(() => {
      if (/berth is up/.test(upOut)) {
        clearInterval(t);
        resolve();
      }
    }, 50);
    up.once("exit", (c) => reject(new Error(`berth up exited ${c}:\n${upOut}`)));
  });
  const config = join(state, "client.json");
  const transport = new StdioClientTransport({ command: process.execPath, args: [BIN, "mcp", "--config", config], stderr: "ignore" });
  const mcp = new Client({ name: "bench", version: "1" });
  const lib = BerthClient.fromConfig({ config });
  try {
    await mcp.connect(transport);
    const text = async (name: string, args: Record<string, unknown>) => {
      const r = (await mcp.callTool({ name, arguments: args })) as { isError?: boolean; content: { text: string }[] };
      if (r.isError) throw new Error(`${name}: ${r.content[0]!.text}`);
      return JSON.parse(r.content[0]!.text) as Record<string, unknown>;
    };
    let borrowed: Record<string, unknown> | null = null;
    for (let i = 0; i < 100 && !borrowed; i++) {
      borrowed = await text("borrow_machine", { wait_seconds: 30 }).catch(() => null);
    }
    if (!borrowed) throw new Error("berth mcp could not borrow a machine");
    const handle = borrowed.handle as string;
    const machine = borrowed.machine as string;
    const own = await lib.borrow({ pool: "default", waitMs: 30_000 });
    const hb = setInterval(() => void lib.heartbeat(own).catch(() => undefined), Math.max(1000, Math.floor(own.heartbeatMs / 3)));
    // The same machine M through the library: the endpoint of the library's own borrow, M as the SSH user.
    const onM = new Borrow({ ...own.receipt, machine: { ...own.receipt.machine, id: machine, ssh: { ...own.receipt.machine.ssh, user: machine } } }, null);

    const viaMcp = async () => {
      const t0 = process.hrtime.bigint();
      const r = await text("run_command", { handle, command: ["true"] });
      const d = ms(t0);
      if (r.exit_status !== 0) throw new Error(`true exited ${String(r.exit_status)}`);
      return d;
    };
    const viaLib = async () => {
      const t0 = process.hrtime.bigint();
      const r = await lib.exec(onM, ["true"]);
      const d = ms(t0);
      if (r.status !== 0) throw new Error(`true exited ${r.status}`);
      return d;
    };
    for (let i = 0; i < warmup; i++) {
      await viaMcp();
      await viaLib();
    }
    const m: number[] = [];
    const l: number[] = [];
    for (let i = 0; i < samples; i++) {
      // Alternating, starting with each side half the time.
      if (i % 2 === 0) {
        m.push(await viaMcp());
        l.push(await viaLib());
      } else {
        l.push(await viaLib());
        m.push(await viaMcp());
      }
    }
    const dm = dist(m);
    const dl = dist(l);
    const ratio = round(dm.p50 / dl.p50, 2);
    printTable(`tool call -> output of \`true\` on one machine (${runtime} runtime), ${samples} alternating samples each (ms)`, [
      { path: "berth mcp (stdio, SDK client)", p50: dm.p50, p99: dm.p99, mean: dm.mean },
      { path: "client library exec", p50: dl.p50, p99: dl.p99, mean: dl.mean },
    ]);
    process.stdout.write(`\nratio of medians (mcp / library): ${ratio} (aim <= 1.5)\n`);
    const path = writeResult("mcp-exec", { runtime, samples, warmup, mcp: dm, library: dl, ratio });
    process.stdout.write(`wrote ${path}\n`);
    await text("return_machine", { handle });
    clearInterval(hb);
    await lib.return(own);
  } finally {
    await mcp.close().catch(() => undefined);
    await lib.close();
    up.kill("SIGINT");
    await new Promise((r) => up.once("exit", r));
    rmSync(dir, { recursive: true, force: true });
  }
}

main().catch((e: unknown) => {
  process.stderr.write(`${(e as Error).stack ?? String(e)}\n`);
  process.exit(1);
});
