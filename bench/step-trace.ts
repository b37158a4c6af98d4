/**
 * Step timestamps of a berth process, for bench/portable-steps: loaded with
 * `node --import` into `berth serve` or `berth agent` (BENCH_SERVE_NODE_ARGS /
 * BENCH_AGENT_NODE_ARGS), it records, in memory, when
 *   - an HTTP request arrives (node:http's `http.server.request.start`, after
 *     its headers were parsed) and when its reply is finished;
 *   - an outgoing node:http request starts (berth's one HTTP client,
 *     src/http/client.ts), its reply's headers arrive and its body ends (the
 *     coordinator's agent call);
 *   - a SQLite COMMIT statement starts and returns (the coordinator's group
 *     commit), and a better-sqlite3 `transaction().immediate()` starts and
 *     returns (the agent's transactions: body + commit);
 * and writes them as JSON lines to <BERTH_STEP_TRACE>/<command>-<pid>.jsonl
 * when the process exits (<command>: `serve`, `agent`).
 * Times are wall-clock milliseconds with microsecond resolution
 * (performance.timeOrigin + performance.now()), comparable across the
 * processes of one machine. Nothing is written while requests are served.
 */
import { subscribe } from "node:diagnostics_channel";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import Database from "better-sqlite3";

const traceDir = process.env.BERTH_STEP_TRACE;
const who = process.argv[2] ?? "node";
const file = traceDir ? join(traceDir, `${who}-${process.pid}.jsonl`) : null;
const events: string[] = [];
const at = () => performance.timeOrigin + performance.now();
const note = (ev: string, what = "") => events.push(JSON.stringify({ t: at(), who, ev, what }));

if (file) {
  process.on("exit", () => writeFileSync(file, events.join("\n") + "\n"));

  subscribe("http.server.request.start", (m) => {
    const { request, response } = m as { request: { method?: string; url?: string }; response: { once(e: string, f: () => void): void } };
    const what = `${request.method} ${request.url}`;
    note("req", what);
    response.once("finish", () => note("res", what));
  });

  subscribe("http.client.request.start", (m) => {
    const { request } = m as { request: { method: string; path: string } };
    note("call", `${request.method} ${request.path}`);
  });
  subscribe("http.client.response.finish", (m) => {
    const { request, response } = m as { request: { method: string; path: string }; response: { once(e: string, f: () => void): void } };
    const what = `${request.method} ${request.path}`;
    note("call-headers", what);
    response.once("end", () => note("call-done", what));
  });

  const probe = new Database(":memory:");
  const stmtProto = Object.getPrototypeOf(probe.prepare("SELECT 1")) as { run: (...a: unknown[]) => unknown };
  const dbProto = Object.getPrototypeOf(probe) as { transaction: (fn: (...a: unknown[]) => unknown) => unknown };
  probe.close();
  const run = stmtProto.run;
  stmtProto.run = function (this: { source: string }, ...a: unknown[]) {
    if (this.source !== "COMMIT") return run.apply(this, a);
    note("commit");
    try {
      return run.apply(this, a);
    } finally {
      note("commit-done");
    }
  };
  const transaction = dbProto.transaction;
  // The function better-sqlite3 returns has read-only variants: a lookalike with a timed `immediate`.
  dbProto.transaction = function (this: unknown, fn: (...a: unknown[]) => unknown) {
    const t = transaction.call(this, fn) as unknown as ((...a: unknown[]) => unknown) & Record<string, (...a: unknown[]) => unknown>;
    const f = Object.assign((...a: unknown[]) => t(...a), { default: t.default, deferred: t.deferred, exclusive: t.exclusive, database: t.database });
    return Object.assign(f, {
      immediate: (...a: unknown[]) => {
        note("tx");
        try {
          return t.immediate!(...a);
        } finally {
          note("tx-done");
        }
      },
    });
  };
}
