/**
 * Statements sent to PostgreSQL per keeper borrow + return cycle (each one a
 * network round trip): counted at the driver (every `pg` client query of the
 * in-process coordinator), over `--cycles` cycles after three warm-ups, with
 * the statements listed by how often each was sent. A figure that does not
 * move with load: what the store's round-trip work costs per cycle.
 *
 *   BERTH_PG_URL=postgres://… node dist/bench/pg-round-trips.js [--cycles 20]
 */
import pg from "pg";
import { Api } from "../src/client/http.js";
import { arg, keeperPool, pgSkipReason, printTable, round, startBenchCoordinator, writeResult } from "./lib.js";

const cycles = Number(arg("cycles", "20"));

async function main(): Promise<void> {
  const skip = pgSkipReason();
  if (skip) {
    console.log(skip);
    return;
  }
  const counts = new Map<string, number>();
  let counting = false;
  const query = pg.Client.prototype.query as (...a: unknown[]) => unknown;
  pg.Client.prototype.query = function (this: pg.Client, ...a: unknown[]) {
    if (counting) {
      const q = a[0] as string | { text: string };
      const text = (typeof q === "string" ? q : q.text).replace(/\s+/g, " ").slice(0, 100);
      counts.set(text, (counts.get(text) ?? 0) + 1);
    }
    return query.apply(this, a);
  } as typeof pg.Client.prototype.query;

  const c = await startBenchCoordinator({ engine: "postgres", mode: "inproc", reconcile: false });
  const admin = new Api(c.url, await c.token("admin", "bench"));
  const member = new Api(c.url, await c.token("member", "bench"));
  try {
    await keeperPool(admin, "p", 4);
    const cycle = async () => {
      const b = await member.call<{ borrowId: string; borrowToken: string }>("POST", "/v1/pools/p/borrow", {});
      await member.call("POST", `/v1/borrows/${b.borrowId}/return`, { token: b.borrowToken });
    };
    for (let i = 0; i < 3; i++) await cycle();
    counting = true;
    for (let i = 0; i < cycles; i++) await cycle();
    counting = false;
  } finally {
    await Promise.all([admin.close(), member.close()]);
    await c.close();
    pg.Client.prototype.query = query as typeof pg.Client.prototype.query;
  }
  const rows = [...counts].sort((a, b) => b[1] - a[1]).map(([statement, n]) => ({ "per cycle": round(n / cycles, 2), statement }));
  const total = round([...counts.values()].reduce((a, b) => a + b, 0) / cycles, 2);
  printTable(`PostgreSQL statements per keeper borrow + return (${cycles} cycles): ${total}`, rows);
  console.log("results:", writeResult("pg-round-trips", { cycles, perCycle: total, statements: rows }));
}

await main();
