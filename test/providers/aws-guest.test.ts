/**
 * The guest's enrollment checks that sshd really takes berth's key file,
 * against the emulator (its `systemctl` and `sshd` shims answer as a guest
 * whose reload fails, or whose sshd_config includes no drop-ins, would): a
 * failed `systemctl reload` and an effective AuthorizedKeysFile (`sshd -T`)
 * other than /etc/berth/keys/%u each fail the provision with their own
 * code, instead of a machine whose borrowers' keys sshd never reads. A key
 * install reads the key file back and reports the line it found. A grant's
 * expiry survives a reboot of the instance (the boot-time service sets its
 * timer again, or ends it at once if it passed meanwhile).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { awsWorld, done, guestKeys, machine, op, untilSettled } from "../helpers/aws.js";
import { generateSshKeyPair } from "../../src/core/ssh-keys.js";
import { until } from "../helpers/portable-e2e.js";

test("a failed sshd reload, or an sshd that reads another key file, fails the enrollment", { timeout: 60_000 }, async () => {
  const w = await awsWorld();
  try {
    w.emu.faults.sshdReloadFails = true;
    const a = await untilSettled(w.provider, op("provision", machine("m_reload"), 0));
    assert.equal(a.outcome.kind, "failed", JSON.stringify(a.outcome));
    assert.match(a.outcome.kind === "failed" ? a.outcome.error : "", /^sshd_reload_failed: /);

    w.emu.faults.sshdReloadFails = false;
    w.emu.faults.sshdIgnoresDropIns = true;
    const b = await untilSettled(w.provider, op("provision", machine("m_dropins"), 0));
    assert.equal(b.outcome.kind, "failed", JSON.stringify(b.outcome));
    assert.match(b.outcome.kind === "failed" ? b.outcome.error : "", /^sshd_keys_file: .*sshd reads '\.ssh\/authorized_keys \.ssh\/authorized_keys2'/);

    // A guest whose sshd takes the drop-in enrolls, and an install reports the key line it read back.
    w.emu.faults.sshdIgnoresDropIns = false;
    const m = machine("m_fine");
    const p = done((await untilSettled(w.provider, op("provision", m, 0))).outcome);
    const key = generateSshKeyPair("alice").publicKey;
    const lent = { ...m, state: "installing" as const, generation: 1 };
    done((await untilSettled(w.provider, op("install_key", lent, 1, { mode: "grant", publicKey: key, grantId: "g_1", expiresAt: Date.now() + 600_000 }))).outcome);
    const lines = guestKeys(w.emu, String(p.instanceId), "m_fine");
    assert.equal(lines.length, 1);
    assert.match(lines[0]!, / berth:g1:g_1$/);
  } finally {
    await w.close();
  }
});

test("a grant's guest-side expiry survives a reboot of the instance", { timeout: 90_000 }, async () => {
  const w = await awsWorld();
  try {
    const m = machine("m_boot");
    const p = done((await untilSettled(w.provider, op("provision", m, 0))).outcome);
    const id = String(p.instanceId);
    const key = generateSshKeyPair("bob").publicKey;
    done((await untilSettled(w.provider, op("install_key", { ...m, generation: 1 }, 1, { mode: "grant", publicKey: key, grantId: "g_b", expiresAt: Date.now() + 8_000 }))).outcome);
    assert.equal(guestKeys(w.emu, id, "m_boot").length, 1);
    // An unplanned reboot (not a fence: the key stays) kills the transient timer with every other process.
    const inst = w.emu.instances.get(id)!;
    await w.emu.reboot(inst);
    await until("the instance booted again", async () => inst.ssmOnline, 30_000);
    // The guest still removes the key at the grant's expiry (on the old code it stayed in the file for good).
    await until("the expired grant's key removed by the guest", async () => guestKeys(w.emu, id, "m_boot").length === 0, 60_000);
  } finally {
    await w.close();
  }
});
