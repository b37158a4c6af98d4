/**
 * What a runtime enforces of an allocation's size (reported in the launch
 * result and shown by `berth alloc show`). Said plainly where nothing is
 * enforced: capacity is then a matter of placement (host accounts), not of
 * kernel limits.
 */
import type { Runtime } from "./types.js";

export function enforcementOf(runtime: Pick<Runtime, "kind">, vcpu: number, memoryMib: number): string {
  switch (runtime.kind) {
    case "process":
      return `not enforced: the process runtime runs plain child processes; ${vcpu} vCPU / ${memoryMib} MiB is accounted by placement only`;
    case "gvisor":
      return `not enforced: the gvisor runtime runs with --ignore-cgroups; ${vcpu} vCPU / ${memoryMib} MiB is accounted by placement only`;
  }
}
