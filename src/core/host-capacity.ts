/**
 * What a host offers by default (`berth agent` and `berth up` without
 * `--vcpu` / `--memory-mb` / `--disk`): its real vCPUs, memory and disk minus
 * a stated reserve for the host itself (the agent, the SSH gateway, the kernel):
 *   vCPU    every CPU the process may run on (os.availableParallelism);
 *   memory  the total minus max(1 GiB, 10 %), rounded down to a MiB;
 *   disk    the space free now (to an unprivileged writer) on the filesystem
 *           of the agent's volumes directory minus max(2 GiB, 10 % of that
 *           filesystem's size), rounded down to a MiB; at least 0.
 * vCPU is not reserved: the size's CPU quota bounds each sandbox, and the
 * host's own processes are small. Pure: the caller passes what it read.
 */
export const MEMORY_RESERVE_MIN_MIB = 1024;
export const MEMORY_RESERVE_SHARE = 0.1;

export function defaultHostCapacity(cpus: number, totalMemoryBytes: number): { vcpu: number; memoryMib: number } {
  const totalMib = Math.floor(totalMemoryBytes / 2 ** 20);
  const reserve = Math.max(MEMORY_RESERVE_MIN_MIB, Math.ceil(totalMib * MEMORY_RESERVE_SHARE));
  return { vcpu: Math.max(1, Math.floor(cpus)), memoryMib: Math.max(1, totalMib - reserve) };
}

export const DISK_RESERVE_MIN_MIB = 2048;
export const DISK_RESERVE_SHARE = 0.1;

/** The disk a host offers by default, from its volumes filesystem's free and total bytes. */
export function defaultHostDisk(freeBytes: number, totalBytes: number): number {
  const reserve = Math.max(DISK_RESERVE_MIN_MIB, Math.ceil((totalBytes / 2 ** 20) * DISK_RESERVE_SHARE));
  return Math.max(0, Math.floor(freeBytes / 2 ** 20) - reserve);
}
