/**
 * Every instance berth launches is on record (store table aws_launches) and
 * found again from that record, whatever the configuration says later:
 * renaming `deployment`, moving a pool to another region or removing it
 * leaves no instance running once the machine is destroyed or swept; a lost
 * RunInstances answer is recorded by its ClientToken before the launch and
 * resolved from it. Against the EC2/SSM emulator, whose regions are separate
 * namespaces (the SigV4 credential scope picks one), with a real SQLite store.
 */
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { sweepOrphans } from "../../src/providers/aws/sweep.js";
import { awsWorld, done, machine, op, untilSettled } from "../helpers/aws.js";

describe("aws launch records (emulator)", { timeout: 120_000 }, () => {
  test("a provision is recorded before RunInstances and completed with the instance id, region, account and deployment", async () => {
    const w = await awsWorld();
    try {
      const m = machine("m_rec1");
      const req = op("provision", m, 0);
      const r = done((await untilSettled(w.provider, req)).outcome);
      const rec = await w.provider.records.byToken(req.opId);
      assert.ok(rec, "the launch is on record");
      assert.deepEqual(
        { instanceId: rec.instanceId, region: rec.region, deployment: rec.deployment, machineId: rec.machineId, account: rec.account, endedAt: rec.endedAt },
        { instanceId: r.instanceId, region: "eu-west-1", deployment: "test", machineId: m.id, account: "000000000000", endedAt: null },
      );
      assert.equal(w.emu.instances.get(String(r.instanceId))!.region, "eu-west-1");
    } finally {
      await w.close();
    }
  });

  test("deployment renamed and region changed: destroy from the record terminates the instance where it was launched", async () => {
    const w = await awsWorld();
    try {
      const m = machine("m_moved");
      const r = done((await untilSettled(w.provider, op("provision", m, 0))).outcome);
      const edited = w.providerWith({ deployment: "renamed", region: "us-west-2" });
      const d = done((await untilSettled(edited, op("destroy", m, 1))).outcome);
      assert.equal(d.existed, true, JSON.stringify(d));
      assert.deepEqual(d.terminated, [r.instanceId]);
      assert.deepEqual(w.emu.live().map((i) => `${i.id}:${i.state}`), [], "no instance left running");
      const rec = await w.provider.records.byToken(op("provision", m, 0).opId);
      assert.equal(rec?.endReason, "observed terminated");
      assert.deepEqual(await edited.records.openFor(m.id), []);
    } finally {
      await w.close();
    }
  });

  test("a pool removed from the configuration: destroy still ends its recorded instance", async () => {
    const w = await awsWorld();
    try {
      const m = machine("m_gonepool");
      done((await untilSettled(w.provider, op("provision", m, 0))).outcome);
      const edited = w.providerWith({ pools: ["other"] });
      const d = done((await untilSettled(edited, op("destroy", m, 1))).outcome);
      assert.equal(d.existed, true);
      assert.deepEqual(w.emu.live(), []);
    } finally {
      await w.close();
    }
  });

  test("the sweep looks in every region and deployment a record names: an orphan under the old names is terminated", async () => {
    const w = await awsWorld();
    try {
      const m = machine("m_sweepold");
      const r = done((await untilSettled(w.provider, op("provision", m, 0))).outcome);
      const edited = w.providerWith({ deployment: "renamed", region: "us-west-2" });
      // The machine record is gone (pruned, or another database): nothing is live.
      const report = await sweepOrphans(edited, async () => new Set());
      assert.deepEqual(report.terminated, [r.instanceId]);
      assert.deepEqual(
        report.scopes.map((s) => `${s.region}/${s.deployment}`),
        ["us-west-2/renamed", "eu-west-1/test"],
      );
      assert.equal(report.instances[0]?.recorded, true);
      assert.deepEqual(w.emu.live().filter((i) => i.state !== "shutting-down"), []);
    } finally {
      await w.close();
    }
  });

  test("a lost RunInstances answer never retried by provision: destroy finds the instance by the recorded ClientToken", async () => {
    const w = await awsWorld();
    try {
      w.emu.faults.lose.set("RunInstances", 1);
      const m = machine("m_lostanswer");
      const req = op("provision", m, 0);
      assert.equal((await w.provider.run(req)).kind, "ambiguous");
      const rec = await w.provider.records.byToken(req.opId);
      assert.equal(rec?.instanceId, null, "recorded before the launch, no id known yet");
      assert.equal(w.emu.live().length, 1, "the launch happened");
      const edited = w.providerWith({ deployment: "renamed", region: "us-west-2" });
      const d = done((await untilSettled(edited, op("destroy", m, 1))).outcome);
      assert.equal(d.existed, true);
      assert.deepEqual(w.emu.live(), [], "no instance left running");
      assert.equal((await w.provider.records.byToken(req.opId))?.instanceId, [...w.emu.instances.keys()][0]);
    } finally {
      await w.close();
    }
  });

  test("a provision retried after the configuration changed keeps the recorded region and deployment, and launches nothing new", async () => {
    const w = await awsWorld();
    try {
      w.emu.faults.lose.set("RunInstances", 1);
      const m = machine("m_retrymoved");
      const req = op("provision", m, 0);
      assert.equal((await w.provider.run(req)).kind, "ambiguous");
      const edited = w.providerWith({ deployment: "renamed", region: "us-west-2" });
      const r = done((await untilSettled(edited, req)).outcome);
      assert.equal(w.emu.instances.size, 1, "no second launch in the new region");
      assert.equal(w.emu.instances.get(String(r.instanceId))!.region, "eu-west-1");
    } finally {
      await w.close();
    }
  });
});
