/**
 * `berth alloc create --wait`: follow the allocation until it is ready (its
 * sandbox runs and its key is installed), printing each step on stderr;
 * stdout keeps only the final answer. Ends with an error when the allocation
 * is released or quarantined instead, or when --wait-timeout passes.
 */
import { BerthError } from "../../core/errors.js";
import type { Api } from "../api.js";
import type { RouteReply } from "../../protocol/api.js";

/** An allocation as the coordinator shows it. */
export type AllocationView = RouteReply<"GET /v1/allocations/{id}">;

export async function waitReady(api: Api, id: string, timeoutMs: number, log: (line: string) => void = (l) => process.stderr.write(l + "\n")): Promise<AllocationView> {
  const started = Date.now();
  let last = "";
  let lastError: string | null = null;
  for (;;) {
    const a = await api.send("GET /v1/allocations/{id}", { id });
    if (a.state !== last) {
      const at = ((Date.now() - started) / 1000).toFixed(1);
      if (a.state === "placed") log(`berth: ${id} placed on ${a.plan.hostName} (${at}s)`);
      else if (a.state === "launching") log(`berth: ${id} launching on ${a.plan.hostName}: volume, sandbox, key (${at}s)`);
      else if (a.state === "ready") log(`berth: ${id} ready (${at}s)`);
      else log(`berth: ${id} ${a.state}${a.reason ? ` (${a.reason})` : ""} (${at}s)`);
      last = a.state;
    }
    const err = a.launch?.error ?? null;
    if (err && err !== lastError) log(`berth: ${id}: ${err} (attempt ${a.launch!.attempts}; retried)`);
    lastError = err;
    if (a.state === "ready") return a;
    if (a.state === "released" || a.state === "quarantined" || a.state === "releasing") {
      throw new BerthError("conflict", `conflict: allocation ${id} did not become ready: it is ${a.state}${a.reason ? ` (${a.reason})` : ""}`);
    }
    if (Date.now() - started > timeoutMs) throw new BerthError("provider_unavailable", `provider_unavailable: allocation ${id} is still ${a.state} after ${Math.round(timeoutMs / 1000)}s; it keeps launching: berth alloc show ${id}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}
