/**
 * Images and runtimes (migration 8): the image a pool's machines boot
 * (`pools.image`, part of the pool's compatibility: a change rotates its
 * machines), the image each machine was provisioned for (`machines.image`,
 * set with its row before the provision operation runs) and what each host
 * reports of its runtime (`hosts.runtime_detail`: the runsc release and
 * gVisor platform). Named statements that compose inside the caller's
 * transaction.
 */
import type { Migration } from "./migrate.js";
import type { Tx } from "./store.js";

export const IMAGES_MIGRATION: Migration = {
  version: 8,
  name: "images and runtime detail",
  sql: `
ALTER TABLE pools ADD COLUMN image TEXT;
ALTER TABLE machines ADD COLUMN image TEXT;
ALTER TABLE hosts ADD COLUMN runtime_detail TEXT;
`,
};

/** The image a provisioning machine is made for (null: the host's root). */
export async function setMachineImage(tx: Tx, machineId: string, image: string | null): Promise<void> {
  await tx.run("UPDATE machines SET image = ? WHERE id = ?", [image, machineId]);
}

/** Ready machines of a pool made for another image than `image` (they are rotated out, never changed live). */
export async function staleImageReadyMachineIds(tx: Tx, org: string, pool: string, image: string | null): Promise<string[]> {
  const rows = await tx.all<{ id: string }>("SELECT id FROM machines WHERE org = ? AND pool = ? AND state = 'ready' AND COALESCE(image, '') <> ? ORDER BY id", [org, pool, image ?? ""]);
  return rows.map((r) => r.id);
}
