/**
 * The provider contract (contract.ts) for the hosts provider: real `berth
 * serve` and `berth agent` processes (process runtime), and the hosts
 * provider called from the test with the coordinator's own secret and host
 * record, as the coordinator's executor calls it.
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { providerContract, settle } from "./contract.js";
import { Cluster } from "../helpers/cluster.js";
import { HostsProvider } from "../../src/providers/hosts/hosts-provider.js";
import { SqliteStore } from "../../src/store/sqlite/sqlite-store.js";
import type { HostRow } from "../../src/store/hosts.js";
import type { MachineRow } from "../../src/store/machines.js";

providerContract("hosts (real agent, process runtime)", async () => {
  const c = await new Cluster({ runtime: "process" }).start();
  const store = new SqliteStore({ path: join(c.coordDir, "berth.db") });
  const host = await store.transaction((tx) => tx.get<HostRow>("SELECT * FROM hosts LIMIT 1"));
  if (!host) throw new Error("the agent did not enroll");
  const secret = Buffer.from(readFileSync(join(c.coordDir, "coordinator.secret"), "utf8").trim(), "base64");
  const provider = new HostsProvider({ secret, host: async (id) => (id === host.id ? host : undefined) });
  const machine = (id: string): MachineRow => ({
    id, org: host.org, pool: "contract", access: "portable", provider: "hosts", resource_id: id, host_id: host.id, state: "provisioning", generation: 0, incarnation: null,
    ssh_host: null, ssh_port: null, ssh_user: null, host_key: null, claim_id: null, lent_to: null, created_at: 0, state_since: 0, ready_since: null, hard_expires_at: 0, reason: null,
  });
  return {
    provider,
    machine,
    userOf: (m) => m.resource_id,
    // A machine the agent no longer has cannot be fenced.
    gone: async (m) => (await settle(provider, { opId: `op_gone_${Date.now()}`, kind: "fence", machine: { ...m, generation: 3 }, generation: 3, args: {} })).kind === "failed",
    close: async () => {
      await store.close();
      await c.close();
    },
  };
});
