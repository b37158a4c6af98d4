/**
 * What a runtime enforces of an allocation's size (reported in the launch
 * result and shown by `berth alloc show`), said plainly.
 *
 *   gvisor  — enforced: the sandbox runs under a cgroup with a CFS quota of
 *             `vcpu` CPUs and a hard memory limit, and runsc sizes the
 *             sandbox from them (`--cpu-num-from-quota`: nproc inside is the
 *             quota, but never below 2 — a gVisor floor; MemTotal inside is
 *             the limit). Allocating past it fails inside the sandbox.
 *   process — not enforced: plain child processes; the size is accounted by
 *             placement only.
 */
import type { Runtime } from "./types.js";

export function enforcementOf(runtime: Pick<Runtime, "kind">, vcpu: number, memoryMib: number): string {
  switch (runtime.kind) {
    case "process":
      return `not enforced: the process runtime runs plain child processes; ${vcpu} vCPU / ${memoryMib} MiB is accounted by placement only`;
    case "gvisor":
      return `enforced: cgroup CPU quota ${vcpu} (nproc inside ${Math.max(vcpu, 2)}), memory limit ${memoryMib} MiB (MemTotal inside)`;
  }
}
