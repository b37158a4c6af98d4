/**
 * Picks the sandbox runtime for a host agent.
 *   process — plain child processes in a directory; no isolation.
 *   gvisor  — one runsc sandbox per machine; needs runsc and root.
 *   auto    — gvisor when runsc is installed and the agent runs as root, else process.
 */
import { BerthError } from "../../core/errors.js";
import { GvisorRuntime, findRunsc } from "./gvisor.js";
import { ProcessRuntime } from "./process.js";
import type { Runtime, RuntimeKind } from "./types.js";

export type RuntimeChoice = RuntimeKind | "auto";

/** Whether this host can run the gvisor runtime, and if not, why (for --help, logs and test skips). */
export function gvisorAvailability(): { ok: true } | { ok: false; why: string } {
  if (process.platform !== "linux") return { ok: false, why: "gvisor needs Linux" };
  if (!findRunsc()) return { ok: false, why: "runsc is not installed (Debian/Ubuntu package `runsc`)" };
  if (process.getuid?.() !== 0) return { ok: false, why: "gvisor needs the agent to run as root" };
  return { ok: true };
}

export function resolveRuntimeKind(kind: RuntimeChoice): RuntimeKind {
  if (kind !== "auto") return kind;
  return gvisorAvailability().ok ? "gvisor" : "process";
}

export function createRuntime(kind: RuntimeChoice, stateDir: string): Runtime {
  const k = resolveRuntimeKind(kind);
  switch (k) {
    case "process":
      return new ProcessRuntime({ stateDir });
    case "gvisor": {
      const a = gvisorAvailability();
      if (!a.ok) throw new BerthError("provider_unavailable", `provider_unavailable: runtime gvisor is unavailable: ${a.why}; use --runtime process`);
      return new GvisorRuntime({ stateDir });
    }
  }
}

export { GvisorRuntime, ProcessRuntime };
export type * from "./types.js";
