/**
 * What a host offers by default (`berth agent` and `berth up` without
 * `--vcpu` / `--memory-mb`): its real vCPUs and memory minus a stated
 * reserve for the host itself (the agent, the SSH gateway, the kernel):
 *   vCPU    every CPU the process may run on (os.availableParallelism);
 *   memory  the total minus max(1 GiB, 10 %), rounded down to a MiB.
 * vCPU is not reserved: the size's CPU quota bounds each sandbox, and the
 * host's own processes are small. Pure: the caller passes what it read.
 */
export const MEMORY_RESERVE_MIN_MIB = 1024;
export const MEMORY_RESERVE_SHARE = 0.1;

export function defaultHostCapacity(cpus: number, totalMemoryBytes: number): { vcpu: number; memoryMb: number } {
  const totalMib = Math.floor(totalMemoryBytes / 2 ** 20);
  const reserve = Math.max(MEMORY_RESERVE_MIN_MIB, Math.ceil(totalMib * MEMORY_RESERVE_SHARE));
  return { vcpu: Math.max(1, Math.floor(cpus)), memoryMb: Math.max(1, totalMib - reserve) };
}
