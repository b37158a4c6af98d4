/**
 * The forwarding switch (migration 13): whether a pool's machines accept
 * `ssh -L`/`-W` to their own ports (`pools.forwarding`) and what each machine
 * was provisioned with (`machines.forwarding`, set with its row before the
 * provision operation runs). NULL is "on" in both: a provision setting
 * (provision-setting.ts).
 */
import type { Forwarding } from "../core/pool.js";
import type { Migration } from "./migrate.js";
import { provisionSetting } from "./provision-setting.js";

export const FORWARDING_MIGRATION: Migration = {
  version: 13,
  name: "pool forwarding switch",
  sql: `
ALTER TABLE pools ADD COLUMN forwarding TEXT;
ALTER TABLE machines ADD COLUMN forwarding TEXT;
`,
};

const forwarding = provisionSetting<Forwarding, "forwarding">("forwarding", "on", "off");

/** The stored form of the switch: NULL for on. */
export const forwardingColumn = forwarding.column;
/** The switch a provisioning machine is made with. */
export const setMachineForwarding = forwarding.setMachine;
/** The switch a row (machine or pool) holds. */
export const forwardingOf = forwarding.of;
/** Ready machines of a pool made with another switch than `f`. */
export const staleForwardingReadyMachineIds = forwarding.staleReadyMachineIds;
