/**
 * `berth host rm NAME` ends every state a host can be stuck in (docs/host-identity.md,
 * "Recovery by an operator"), with a real `berth serve`, a real `berth agent` and the
 * CLI: refused `host_busy` while the host lends a machine (nothing changes, the borrow
 * still holds); with `--force` the borrow ends, the host's machines are drained and
 * destroyed by the agent, the host's row goes, and both steps are in the audit.
 *
 * Seen failing before the command existed: `berth host rm` was an unknown command
 * (exit 2), so a host (a stranded one included) could never be removed.
 */
import { after, describe, it } from "node:test";
import assert from "node:assert/strict";
import { generateSshKeyPair } from "../../src/core/ssh-keys.js";
import { Fleet } from "../helpers/identity-fleet.js";

interface HostView {
  name: string;
  id: string;
}

async function hosts(f: Fleet): Promise<HostView[]> {
  return (await f.api.call<{ hosts: HostView[] }>("GET", "/v1/hosts")).hosts;
}

describe("berth host rm (real coordinator, real agent, the CLI)", () => {
  const fleets: Fleet[] = [];
  after(async () => {
    for (const f of fleets) await f.close();
  });

  it("refused while the host lends a machine; --force ends the borrow, drains and destroys its machines, removes the host; audited", { timeout: 240_000 }, async () => {
    const f = new Fleet();
    fleets.push(f);
    await f.start();
    const keeper = generateSshKeyPair("remove-keeper");
    await f.startAgent("h1", { slots: 2 });
    await f.waitFor("h1 active", async () => (await hosts(f)).some((h) => h.name === "h1"), 60_000);
    await f.api.call("POST", "/v1/pools/p/ensure", { minReady: 2, maxReady: 2, compatibilityKey: "rm", provider: "hosts", keeperKey: keeper.publicKey });
    await f.waitFor("2 ready", async () => (await f.api.call<{ counts: { ready: number } }>("GET", "/v1/pools/p")).counts.ready === 2, 90_000);
    const id = (await hosts(f)).find((h) => h.name === "h1")!.id;
    const b = await f.api.call<{ borrowId: string; borrowToken: string; machine: { id: string } }>("POST", "/v1/pools/p/borrow", {});

    const refused = await f.cli(["host", "rm", "h1"]);
    assert.notEqual(refused.status, 0, refused.stdout);
    assert.match(refused.stderr, /host_busy/);
    assert.match(refused.stderr, new RegExp(b.machine.id));
    assert.ok((await hosts(f)).some((h) => h.id === id), "a refused removal leaves the host");
    assert.equal((await f.audit("host_removing")).length, 0, "a refused removal audits nothing");
    const lent = (await f.machines()).find((m) => m.id === b.machine.id)!;
    assert.equal(lent.state, "busy", "the borrow still holds");

    const rm = await f.cli(["host", "rm", "h1", "--force", "--wait"]);
    assert.equal(rm.status, 0, `${rm.stdout}\n${rm.stderr}\n${f.agents.get("h1")!.output().slice(-2000)}`);
    assert.match(rm.stderr, /removed/);
    assert.ok(!(await hosts(f)).some((h) => h.id === id), "the host is gone from host ls");
    const ms = (await f.machines()).filter((m) => m.host_id === id);
    assert.ok(ms.length >= 2);
    for (const m of ms) assert.equal(m.state, "destroyed", `${m.id} destroyed`);
    const borrow = await f.store((st) => st.transaction((tx) => tx.get<{ state: string; reason: string | null }>("SELECT state, reason FROM borrows WHERE id = ?", [b.borrowId])));
    assert.ok(borrow && borrow.state !== "active", `the forced removal ended the borrow: ${JSON.stringify(borrow)}`);
    assert.equal((await f.audit("host_removing")).length, 1);
    assert.equal((await f.audit("host_removed")).length, 1);

    // Removing it again: not found, nothing changes.
    const again = await f.cli(["host", "rm", "h1"]);
    assert.notEqual(again.status, 0);
    assert.match(again.stderr, /not_found/);
  });
});
