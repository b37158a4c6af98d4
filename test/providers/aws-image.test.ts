/**
 * An AWS pool's image: `--image ami:ami-…` is the AMI its instances launch
 * from (in place of the configuration file's), through a real coordinator
 * and the EC2 emulator; images of other kinds are refused for aws pools, and
 * AMIs for agent pools, at ensure.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { startTestCoordinator } from "../helpers/env.js";
import { awsWorld } from "../helpers/aws.js";

test("aws pools boot the AMI their image names; other kinds are refused at ensure", { timeout: 120_000 }, async () => {
  const w = await awsWorld({ stepBudgetMs: 10_000, pollMs: 50 });
  const t = await startTestCoordinator({ providers: [w.provider], config: { portable: true } });
  try {
    const admin = await t.api("admin");
    const ami = "ami-0123456789abcdef0";
    await admin.call("POST", "/v1/pools/ci/ensure", { minReady: 1, maxReady: 1, compatibilityKey: "aws-img", access: "portable", provider: "aws", image: `ami:${ami}` });
    const deadline = Date.now() + 60_000;
    while (w.emu.live().length === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
    const [inst] = w.emu.live();
    assert.ok(inst, "an instance was launched");
    assert.equal(inst.tags["emu:image"], ami);
    await assert.rejects(admin.call("POST", "/v1/pools/x/ensure", { minReady: 0, maxReady: 1, compatibilityKey: "x", access: "portable", provider: "aws", image: "oci:/srv/base" }), /provider aws boots AMIs only/);
    await assert.rejects(admin.call("POST", "/v1/pools/y/ensure", { minReady: 0, maxReady: 1, compatibilityKey: "y", provider: "hosts", image: `ami:${ami}` }), /is an AMI, which only --provider aws boots/);
    await assert.rejects(admin.call("POST", "/v1/pools/z/ensure", { minReady: 0, maxReady: 1, compatibilityKey: "z", provider: "external", image: "dir:/srv" }), /registered as they are/);
    await admin.call("POST", "/v1/pools/ci/drain", { force: true });
  } finally {
    await t.close();
    await w.close();
  }
});
