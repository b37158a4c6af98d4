/**
 * The aws configuration as the provider uses it, against the EC2/SSM
 * emulator with the provider's own SDK clients (clients.ts: no test-built
 * clients): EC2 and SSM each at their own endpoint; every HTTP attempt
 * bounded by `requestTimeoutMs` with `maxAttempts` attempts (a call the
 * endpoint never answers ends, and is retried once); a public IPv4 address
 * requested on the primary network interface where `sshAddress` is
 * `public`; the root volume's size and encryption and a launch template on
 * RunInstances. And the parser's refusals of bad values, each with the
 * field named.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";
import { AwsEmulator } from "../helpers/aws-emulator/emulator.js";
import { FAKE_CREDENTIALS, done, machine, op, untilSettled } from "../helpers/aws.js";
import { tempDir } from "../helpers/env.js";
import { AwsProvider } from "../../src/providers/aws/aws-provider.js";
import { parseAwsConfig } from "../../src/providers/aws/config.js";
import { storeLaunchRecords } from "../../src/store/aws-launches.js";
import { SqliteStore } from "../../src/store/sqlite/sqlite-store.js";
import { BerthError } from "../../src/core/errors.js";

const POOL = { region: "eu-west-1", subnetId: "subnet-0abc", securityGroupIds: ["sg-0abc"], instanceType: "t3.micro", imageId: "ami-0abc1234", instanceProfile: "berth-ssm" };

async function world(file: (emu: AwsEmulator) => Promise<Record<string, unknown>>) {
  const dir = tempDir("berth-aws-config-");
  const emu = await new AwsEmulator(dir.path).start();
  const store = new SqliteStore({ path: join(dir.path, "berth.db") });
  const config = parseAwsConfig(await file(emu));
  // No `clients`: the provider builds its SDK clients from the configuration, as `berth serve` does.
  const provider = new AwsProvider({ config, records: storeLaunchRecords(store), credentials: FAKE_CREDENTIALS, stepBudgetMs: 8_000, pollMs: 50 });
  return {
    emu,
    provider,
    async close() {
      await emu.stop();
      await store.close();
      dir.cleanup();
    },
  };
}

test("EC2 and SSM calls go to their own endpoints", { timeout: 60_000 }, async () => {
  let ssmUrl = "";
  const w = await world(async (emu) => {
    ssmUrl = await emu.listen();
    return { deployment: "t", endpoints: { ec2: emu.url, ssm: ssmUrl }, pools: { ci: { ...POOL, sshPort: emu.sshPort } } };
  });
  try {
    const r = await untilSettled(w.provider, op("provision", machine("m_ep"), 0));
    done(r.outcome);
    const ec2Port = new URL(w.emu.url).port;
    const ssmPort = new URL(ssmUrl).port;
    const ssmActions = new Set(["SendCommand", "GetCommandInvocation", "ListCommands", "DescribeInstanceInformation"]);
    const calls = w.emu.portCalls.map((c) => c.split(" ") as [string, string]);
    assert.ok(calls.some(([, a]) => ssmActions.has(a)) && calls.some(([, a]) => a === "RunInstances"));
    for (const [port, action] of calls) assert.equal(port, ssmActions.has(action) ? ssmPort : ec2Port, `${action} went to the ${ssmActions.has(action) ? "SSM" : "EC2"} endpoint`);
  } finally {
    await w.close();
  }
});

test("a call the endpoint never answers ends after requestTimeoutMs, retried maxAttempts times; the operation answers ambiguous and a retry goes on", { timeout: 60_000 }, async () => {
  const w = await world(async (emu) => ({ deployment: "t", endpoint: emu.url, requestTimeoutMs: 1_000, connectTimeoutMs: 500, maxAttempts: 2, pools: { ci: { ...POOL, sshPort: emu.sshPort } } }));
  try {
    // The provision's first call (DescribeInstances by client token) is held, then held again on the SDK's retry.
    w.emu.faults.hold.set("DescribeInstances", 2);
    const req = op("provision", machine("m_held"), 0);
    const o = await w.provider.run(req);
    assert.equal(o.kind, "ambiguous", JSON.stringify(o));
    assert.match(o.kind === "ambiguous" ? o.error : "", /TimeoutError/);
    assert.equal(w.emu.calls.filter((c) => c === "DescribeInstances").length, 2, "one attempt and one SDK retry");
    assert.equal(w.emu.calls.filter((c) => c === "RunInstances").length, 0, "nothing launched on an unknown lookup");
    done((await untilSettled(w.provider, req)).outcome);
  } finally {
    await w.close();
  }
});

test("sshAddress public asks for a public IPv4 address on the primary network interface; root volume and launch template are on RunInstances", { timeout: 60_000 }, async () => {
  const w = await world(async (emu) => ({
    deployment: "t",
    endpoint: emu.url,
    pools: {
      pub: { ...POOL, sshPort: emu.sshPort, sshAddress: "public", rootVolume: { deviceName: "/dev/xvda", sizeGiB: 30, encrypted: true, kmsKeyId: "alias/berth" }, launchTemplate: { name: "berth-ci", version: "3" } },
      priv: { ...POOL, sshPort: emu.sshPort, launchTemplate: { id: "lt-0123456789abcdef0" } },
    },
  }));
  try {
    const pub = done((await untilSettled(w.provider, op("provision", machine("m_pub", "pub"), 0))).outcome);
    const i = w.emu.instances.get(String(pub.instanceId))!;
    assert.equal(pub.sshHost, i.ip, "the public address is the SSH host");
    const p = i.launchParams;
    assert.equal(p["NetworkInterface.1.DeviceIndex"], "0");
    assert.equal(p["NetworkInterface.1.AssociatePublicIpAddress"], "true");
    assert.equal(p["NetworkInterface.1.SubnetId"], "subnet-0abc");
    assert.equal(p["NetworkInterface.1.SecurityGroupId.1"], "sg-0abc");
    assert.equal(p["SubnetId"], undefined, "the subnet is on the interface only");
    assert.deepEqual(
      Object.fromEntries(Object.entries(p).filter(([k]) => k.startsWith("BlockDeviceMapping.") || k.startsWith("LaunchTemplate."))),
      {
        "BlockDeviceMapping.1.DeviceName": "/dev/xvda",
        "BlockDeviceMapping.1.Ebs.VolumeSize": "30",
        "BlockDeviceMapping.1.Ebs.VolumeType": "gp3",
        "BlockDeviceMapping.1.Ebs.Encrypted": "true",
        "BlockDeviceMapping.1.Ebs.KmsKeyId": "alias/berth",
        "BlockDeviceMapping.1.Ebs.DeleteOnTermination": "true",
        "LaunchTemplate.LaunchTemplateName": "berth-ci",
        "LaunchTemplate.Version": "3",
      },
    );
    const priv = done((await untilSettled(w.provider, op("provision", machine("m_priv", "priv"), 0))).outcome);
    const q = w.emu.instances.get(String(priv.instanceId))!.launchParams;
    assert.equal(q["SubnetId"], "subnet-0abc");
    assert.equal(q["SecurityGroupId.1"], "sg-0abc");
    assert.equal(Object.keys(q).some((k) => k.startsWith("NetworkInterface.") || k.startsWith("BlockDeviceMapping.")), false, "a private pool gets no public address and keeps the AMI's root volume");
    assert.equal(q["LaunchTemplate.LaunchTemplateId"], "lt-0123456789abcdef0");
    assert.equal(q["LaunchTemplate.Version"], "$Default");
  } finally {
    await w.close();
  }
});

test("the parser refuses bad values, naming the field", () => {
  const ok = { deployment: "t", pools: { ci: POOL } };
  assert.doesNotThrow(() => parseAwsConfig(ok));
  const bad: Array<[string, Record<string, unknown>, RegExp]> = [
    ["endpoint not a URL", { ...ok, endpoints: { ec2: "vpce-123" } }, /endpoints\.ec2: Invalid URL/],
    ["unknown service", { ...ok, endpoints: { s3: "https://s3.example" } }, /endpoints: Unrecognized key: "s3"/],
    ["request timeout too short", { ...ok, requestTimeoutMs: 100 }, /requestTimeoutMs: Too small: expected number to be >=500/],
    ["too many attempts", { ...ok, maxAttempts: 5 }, /maxAttempts: Too big: expected number to be <=3/],
    ["connect longer than request", { ...ok, requestTimeoutMs: 1_000, connectTimeoutMs: 2_000 }, /connectTimeoutMs \(2000\) is longer than requestTimeoutMs \(1000\)/],
    ["over the lease", { ...ok, stepBudgetMs: 25_000, requestTimeoutMs: 4_000 }, /stepBudgetMs 25000 \+ maxAttempts 2 × requestTimeoutMs 4000 .* is 33500 ms, over the 30000 ms/],
    ["volume device", { ...ok, pools: { ci: { ...POOL, rootVolume: { deviceName: "xvda", sizeGiB: 8 } } } }, /pools\.ci\.rootVolume\.deviceName: the AMI's root device name/],
    ["volume size", { ...ok, pools: { ci: { ...POOL, rootVolume: { deviceName: "/dev/xvda", sizeGiB: 0 } } } }, /pools\.ci\.rootVolume\.sizeGiB: Too small: expected number to be >=1/],
    ["kms key without encryption", { ...ok, pools: { ci: { ...POOL, rootVolume: { deviceName: "/dev/xvda", sizeGiB: 8, kmsKeyId: "alias/berth" } } } }, /pools\.ci\.rootVolume\.kmsKeyId: kmsKeyId needs encrypted: true/],
    ["kms key malformed", { ...ok, pools: { ci: { ...POOL, rootVolume: { deviceName: "/dev/xvda", sizeGiB: 8, encrypted: true, kmsKeyId: "berth" } } } }, /kmsKeyId: a KMS key id/],
    ["template id and name", { ...ok, pools: { ci: { ...POOL, launchTemplate: { id: "lt-0123456789abcdef0", name: "x-y-z" } } } }, /pools\.ci\.launchTemplate: give exactly one of id and name/],
    ["template neither", { ...ok, pools: { ci: { ...POOL, launchTemplate: { version: "1" } } } }, /launchTemplate: give exactly one of id and name/],
    ["template version", { ...ok, pools: { ci: { ...POOL, launchTemplate: { name: "berth-ci", version: "latest" } } } }, /launchTemplate\.version: a version number, \$Latest or \$Default/],
    ["template id", { ...ok, pools: { ci: { ...POOL, launchTemplate: { id: "lt-123" } } } }, /launchTemplate\.id: a launch template id/],
    ["spot price not a price", { ...ok, pools: { ci: { ...POOL, spot: { maxPrice: "cheap" } } } }, /pools\.ci\.spot\.maxPrice: a price in USD per instance-hour, such as "0\.05"/],
    ["spot price zero", { ...ok, pools: { ci: { ...POOL, spot: { maxPrice: "0" } } } }, /pools\.ci\.spot\.maxPrice: a price above 0/],
    ["spot request type", { ...ok, pools: { ci: { ...POOL, spot: { type: "persistent" } } } }, /pools\.ci\.spot: Unrecognized key: "type"/],
    ["spot fallback", { ...ok, pools: { ci: { ...POOL, spot: { fallbackOnDemand: "yes" } } } }, /pools\.ci\.spot\.fallbackOnDemand: Invalid input: expected boolean/],
    ["spot as a word", { ...ok, pools: { ci: { ...POOL, spot: true } } }, /pools\.ci\.spot: Invalid input: expected object/],
  ];
  // A price given as a number is the same price.
  assert.deepEqual(parseAwsConfig({ ...ok, pools: { ci: { ...POOL, spot: { maxPrice: 0.05 } } } }).pools.ci!.spot, { maxPrice: "0.05", fallbackOnDemand: false });
  for (const [what, value, message] of bad) {
    assert.throws(
      () => parseAwsConfig(value),
      (e: unknown) => e instanceof BerthError && e.code === "invalid_request" && message.test(e.message),
      what,
    );
  }
});
