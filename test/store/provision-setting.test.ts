/**
 * The two provision settings (forwarding, files scope) against a real store,
 * on SQLite (a file) and PostgreSQL (a fresh schema; skipped with the reason
 * when BERTH_TEST_PG_URL is unset): a machine written before the column (NULL)
 * reads as the default, the set value is what the row and the pool read back,
 * and only ready machines of the pool holding another value are stale.
 */
import { test, describe } from "node:test";
import assert from "node:assert/strict";
import { insertMachine } from "../../src/store/machines.js";
import { insertPoolIfAbsent, readPool, type PoolSettings } from "../../src/store/pools.js";
import { forwardingOf, setMachineForwarding, staleForwardingReadyMachineIds } from "../../src/store/forwarding.js";
import { filesScopeOf, setMachineFilesScope, staleFilesScopeReadyMachineIds } from "../../src/store/files-scope.js";
import type { Tx } from "../../src/store/store.js";
import { parsePolicy } from "../../src/core/network-policy.js";
import { PG_SKIP, dropSchema, openStore, tempDir, TestClock, type Engine } from "../helpers/env.js";

const ORG = "acme";

function settings(over: Partial<PoolSettings>): PoolSettings {
  return {
    access: "portable", provider: "hosts", compatibilityKey: "k", identity: null, minReady: 0, maxReady: 3, hardTtlMs: 60_000, heartbeatMs: 10_000,
    keeperKey: null, network: parsePolicy(null), image: null, forwarding: "on", files: "machine", ...over,
  };
}

async function machine(tx: Tx, id: string, pool: string, state: "ready" | "provisioning", now: number): Promise<void> {
  await insertMachine(tx, {
    id, org: ORG, pool, access: "portable", provider: "hosts", resourceId: id, hostId: null, state,
    ssh: { host: null, port: null, user: null, hostKey: null }, claimId: `c_${id}`, now, hardExpiresAt: now + 60_000,
  });
}

for (const engine of ["sqlite", "postgres"] as Engine[]) {
  describe(`provision settings on ${engine}`, { skip: engine === "postgres" ? PG_SKIP : false }, () => {
    test("NULL reads as the default; set values read back; only ready machines with another value are stale", async () => {
      const dir = tempDir();
      const store = await openStore(engine, dir.path);
      const now = new TestClock().now();
      try {
        await store.transaction(async (tx) => {
          await insertPoolIfAbsent(tx, ORG, "p", settings({ forwarding: "off", files: "workspace" }), now);
          await insertPoolIfAbsent(tx, ORG, "q", settings({}), now);
          for (const id of ["m_old", "m_off", "m_ws", "m_prov"]) await machine(tx, id, "p", id === "m_prov" ? "provisioning" : "ready", now);
          await machine(tx, "m_other", "q", "ready", now);
          await setMachineForwarding(tx, "m_off", "off");
          await setMachineFilesScope(tx, "m_ws", "workspace");
        });
        const rows = await store.transaction((tx) => tx.all<{ id: string; forwarding?: string | null; files_scope?: string | null }>("SELECT id, forwarding, files_scope FROM machines ORDER BY id"));
        const read = Object.fromEntries(rows.map((r) => [r.id, [forwardingOf(r), filesScopeOf(r)]]));
        assert.deepEqual(read, { m_old: ["on", "machine"], m_off: ["off", "machine"], m_ws: ["on", "workspace"], m_prov: ["on", "machine"], m_other: ["on", "machine"] });
        assert.deepEqual(rows.find((r) => r.id === "m_old"), { id: "m_old", forwarding: null, files_scope: null });

        const pools = await store.transaction(async (tx) => [await readPool(tx, ORG, "p"), await readPool(tx, ORG, "q")]);
        assert.deepEqual(pools.map((p) => [p?.forwarding, p?.files]), [["off", "workspace"], ["on", "machine"]]);

        const stale = await store.transaction(async (tx) => ({
          fwdOff: await staleForwardingReadyMachineIds(tx, ORG, "p", "off"),
          fwdOn: await staleForwardingReadyMachineIds(tx, ORG, "p", "on"),
          filesWs: await staleFilesScopeReadyMachineIds(tx, ORG, "p", "workspace"),
          filesMachine: await staleFilesScopeReadyMachineIds(tx, ORG, "p", "machine"),
        }));
        assert.deepEqual(stale, { fwdOff: ["m_old", "m_ws"], fwdOn: ["m_off"], filesWs: ["m_off", "m_old"], filesMachine: ["m_ws"] });
      } finally {
        await dropSchema(store);
        await store.close();
        dir.cleanup();
      }
    });
  });
}
