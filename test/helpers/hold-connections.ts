/**
 * Holds many incomplete HTTP connections against a server, as an attacker
 * without a token would (the slow-client hold of test/coordinator/holds).
 * Run as its own process (`node hold-connections.js PORT COUNT ADDR,ADDR,…`)
 * so its open-files limit can be raised apart from the test runner's; it
 * prints one JSON line when every connection is open (`{"held":n}`) and one
 * when every connection has ended or 60 s passed:
 * `{"closedByServer":n,"refused":n,"answered408":n,"stillOpen":n,"maxClosedAfterMs":ms}`.
 *
 * The connections come in three kinds, in turn: nothing sent at all; headers
 * begun and never finished; `POST /v1/hosts/challenge` (no token needed)
 * with `Content-Length: 10` and one byte of body.
 */
import { connect, type Socket } from "node:net";
import { fileURLToPath } from "node:url";

const KINDS = ["", "POST /v1/hosts/challenge HTTP/1.1\r\nHost: x\r\nX-Slow: ", "POST /v1/hosts/challenge HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\n{"];

export interface HoldReport {
  closedByServer: number;
  refused: number;
  answered408: number;
  stillOpen: number;
  maxClosedAfterMs: number;
}

async function main(): Promise<void> {
  const [portArg, countArg, addrArg] = process.argv.slice(2);
  const port = Number(portArg);
  const count = Number(countArg);
  const addresses = (addrArg ?? "127.0.0.1").split(",");
  const sockets: Socket[] = [];
  let closedByServer = 0;
  let refused = 0;
  let answered408 = 0;
  let maxClosedAfterMs = 0;
  let ended = 0;
  let allDone: () => void = () => undefined;
  const done = new Promise<void>((r) => (allDone = r));
  const open = (i: number) =>
    new Promise<void>((resolve, reject) => {
      const s = connect({ port, host: "127.0.0.1", localAddress: addresses[i % addresses.length]! });
      let got = "";
      let openedAt = 0;
      s.on("data", (d: Buffer) => (got += d.toString("latin1")));
      s.once("connect", () => {
        openedAt = Date.now();
        const kind = KINDS[i % KINDS.length]!;
        if (kind !== "") s.write(kind);
        resolve();
      });
      s.on("error", (e) => {
        if (openedAt === 0) reject(e);
      });
      s.once("close", () => {
        ended++;
        if (got.startsWith("HTTP/1.1 503")) refused++;
        else {
          closedByServer++;
          if (got.startsWith("HTTP/1.1 408")) answered408++;
          maxClosedAfterMs = Math.max(maxClosedAfterMs, Date.now() - openedAt);
        }
        if (ended === count) allDone();
      });
      sockets.push(s);
    });
  const t0 = Date.now();
  // In batches: a burst of thousands of SYNs at once overflows the listen backlog.
  for (let i = 0; i < count; i += 200) {
    await Promise.all(Array.from({ length: Math.min(200, count - i) }, (_, j) => open(i + j)));
  }
  process.stdout.write(`${JSON.stringify({ held: sockets.length, afterMs: Date.now() - t0 })}\n`);
  await Promise.race([done, new Promise((r) => setTimeout(r, 60_000))]);
  const report: HoldReport = { closedByServer, refused, answered408, stillOpen: count - ended, maxClosedAfterMs };
  process.stdout.write(`${JSON.stringify(report)}\n`);
  for (const s of sockets) s.destroy();
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  main().catch((e: unknown) => {
    process.stderr.write(`hold-connections: ${e instanceof Error ? e.message : String(e)}\n`);
    process.exit(1);
  });
}
