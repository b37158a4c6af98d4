/**
 * Picks the sandbox runtime for a host agent.
 *   process — plain child processes in a directory; no isolation.
 *   gvisor  — one runsc sandbox per machine; needs runsc and root.
 *   auto    — gvisor when runsc is installed and the agent runs as root, else process.
 */
import { existsSync } from "node:fs";
import { BerthError } from "../../core/errors.js";
import type { PlatformChoice } from "./gvisor-platform.js";
import { GvisorRuntime, findRunsc } from "./gvisor.js";
import { ProcessRuntime } from "./process.js";
import type { Runtime, RuntimeKind } from "./types.js";

export type RuntimeChoice = RuntimeKind | "auto";

/** How the gvisor runtime is set up on this agent (`berth agent --runsc`, `--runsc-platform`). */
export interface GvisorChoice {
  /** The runsc binary; default: found on PATH. */
  runsc?: string;
  platform?: PlatformChoice;
}

/** Whether this host can run the gvisor runtime, and if not, why (for --help, logs and test skips). */
export function gvisorAvailability(runsc?: string): { ok: true } | { ok: false; why: string } {
  if (process.platform !== "linux") return { ok: false, why: "gvisor needs Linux" };
  if (runsc !== undefined ? !existsSync(runsc) : !findRunsc()) {
    return { ok: false, why: runsc !== undefined ? `${runsc} does not exist` : "runsc is not installed (Debian/Ubuntu package `runsc`, ≥ 0.0~20240729: docs/runtimes.md)" };
  }
  if (process.getuid?.() !== 0) return { ok: false, why: "gvisor needs the agent to run as root" };
  return { ok: true };
}

export function resolveRuntimeKind(kind: RuntimeChoice, runsc?: string): RuntimeKind {
  if (kind !== "auto") return kind;
  return gvisorAvailability(runsc).ok ? "gvisor" : "process";
}

export function createRuntime(kind: RuntimeChoice, stateDir: string, gvisor: GvisorChoice = {}): Runtime {
  const k = resolveRuntimeKind(kind, gvisor.runsc);
  switch (k) {
    case "process":
      return new ProcessRuntime({ stateDir });
    case "gvisor": {
      const a = gvisorAvailability(gvisor.runsc);
      if (!a.ok) throw new BerthError("provider_unavailable", `provider_unavailable: runtime gvisor is unavailable: ${a.why}; use --runtime process`);
      return new GvisorRuntime({ stateDir, ...gvisor });
    }
  }
}

export { GvisorRuntime, ProcessRuntime };
export type * from "./types.js";
