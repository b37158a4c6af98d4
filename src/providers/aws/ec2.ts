/**
 * EC2 calls of the AWS provider: launching with an idempotency token, finding
 * the instance bound to a berth machine by its tags, rebooting, terminating.
 *
 * Tags bind instance <-> machine <-> pool <-> deployment. They are set in the
 * RunInstances call itself (TagSpecifications), so an instance never exists
 * untagged; the ClientToken is the provision operation id, so a retried launch
 * returns the first instance, and a lost reply is resolved by looking the
 * token up before any second launch is attempted.
 */
import {
  DescribeInstanceStatusCommand,
  DescribeInstancesCommand,
  RebootInstancesCommand,
  RunInstancesCommand,
  TerminateInstancesCommand,
  type EC2Client,
  type Filter,
  type Instance,
  type InstanceStatus,
  type RunInstancesCommandInput,
} from "@aws-sdk/client-ec2";
import type { AwsPoolConfig, Market } from "./config.js";

export const TAG = { managed: "berth:deployment", machine: "berth:machine", pool: "berth:pool", org: "berth:org", op: "berth:op" } as const;
const LIVE_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"];

export interface Binding {
  deployment: string;
  org: string;
  pool: string;
  machineId: string;
}

export function tagOf(i: Instance, key: string): string | undefined {
  return i.Tags?.find((t) => t.Key === key)?.Value;
}

export function stateOf(i: Instance): string {
  return i.State?.Name ?? "unknown";
}

/** Does this instance carry exactly this binding? */
export function boundTo(i: Instance, b: Binding): boolean {
  return tagOf(i, TAG.managed) === b.deployment && tagOf(i, TAG.machine) === b.machineId && tagOf(i, TAG.pool) === b.pool && tagOf(i, TAG.org) === b.org;
}

export async function describe(ec2: EC2Client, filters: Filter[]): Promise<Instance[]> {
  const out: Instance[] = [];
  let token: string | undefined;
  do {
    const r = await ec2.send(new DescribeInstancesCommand({ Filters: filters, NextToken: token, MaxResults: 100 }));
    for (const res of r.Reservations ?? []) out.push(...(res.Instances ?? []));
    token = r.NextToken;
  } while (token);
  return out;
}

/** The instance launched with this client token, whatever its state (terminated included). */
export async function byClientToken(ec2: EC2Client, token: string): Promise<Instance | undefined> {
  const found = await describe(ec2, [{ Name: "client-token", Values: [token] }]);
  return found[0];
}

/** Instances bound to the machine that are not yet terminated. */
export async function boundInstances(ec2: EC2Client, b: Binding): Promise<Instance[]> {
  const found = await describe(ec2, [
    { Name: `tag:${TAG.managed}`, Values: [b.deployment] },
    { Name: `tag:${TAG.machine}`, Values: [b.machineId] },
    { Name: "instance-state-name", Values: LIVE_STATES },
  ]);
  return found.filter((i) => boundTo(i, b));
}

/** The instance with this id, by filter (an id AWS no longer lists is absent, not an error). */
export async function byInstanceId(ec2: EC2Client, instanceId: string): Promise<Instance | undefined> {
  return (await describe(ec2, [{ Name: "instance-id", Values: [instanceId] }]))[0];
}

export async function byId(ec2: EC2Client, instanceId: string): Promise<Instance | undefined> {
  const r = await ec2.send(new DescribeInstancesCommand({ InstanceIds: [instanceId] }));
  return r.Reservations?.[0]?.Instances?.[0];
}

/**
 * What RunInstances is asked for, tags and token aside: the image, type,
 * instance profile, IMDSv2, shutdown = terminate; the subnet and security
 * groups on the call, or, where clients reach the instance at its public
 * address (`sshAddress: public`), on its primary network interface with a
 * public IPv4 address requested (EC2 takes either form, not both); the
 * root volume's size and encryption (deleted with the instance); the launch
 * template (what the call sets takes precedence over it); on the spot
 * market, a one-time spot request whose instance is terminated when AWS
 * reclaims it (a persistent request could relaunch an instance berth
 * believes ended; `stop` and `hibernate` would keep billing its volumes),
 * at most `maxPrice` where the pool sets one.
 */
function runParams(pc: AwsPoolConfig, market: Market): Omit<RunInstancesCommandInput, "ClientToken" | "TagSpecifications"> {
  const placed: Partial<RunInstancesCommandInput> =
    pc.sshAddress === "public"
      ? { NetworkInterfaces: [{ DeviceIndex: 0, SubnetId: pc.subnetId, Groups: pc.securityGroupIds, AssociatePublicIpAddress: true, DeleteOnTermination: true }] }
      : { SubnetId: pc.subnetId, SecurityGroupIds: pc.securityGroupIds };
  const v = pc.rootVolume;
  const lt = pc.launchTemplate;
  return {
    ImageId: pc.imageId,
    InstanceType: pc.instanceType as RunInstancesCommandInput["InstanceType"],
    MinCount: 1,
    MaxCount: 1,
    ...placed,
    IamInstanceProfile: { Name: pc.instanceProfile },
    MetadataOptions: { HttpTokens: "required" },
    InstanceInitiatedShutdownBehavior: "terminate",
    ...(v
      ? { BlockDeviceMappings: [{ DeviceName: v.deviceName, Ebs: { VolumeSize: v.sizeGiB, VolumeType: v.volumeType, Encrypted: v.encrypted, ...(v.kmsKeyId ? { KmsKeyId: v.kmsKeyId } : {}), DeleteOnTermination: true } }] }
      : {}),
    ...(lt ? { LaunchTemplate: { ...(lt.id ? { LaunchTemplateId: lt.id } : { LaunchTemplateName: lt.name }), Version: lt.version } } : {}),
    ...(market === "spot"
      ? { InstanceMarketOptions: { MarketType: "spot", SpotOptions: { SpotInstanceType: "one-time", InstanceInterruptionBehavior: "terminate", ...(pc.spot?.maxPrice ? { MaxPrice: pc.spot.maxPrice } : {}) } } }
      : {}),
  };
}

/** RunInstances for the machine on `market`, tagged with the operation id; `clientToken` is the op id itself, or a fallback attempt's own token. */
export async function launch(ec2: EC2Client, pc: AwsPoolConfig, market: Market, b: Binding, opId: string, clientToken = opId): Promise<{ instance: Instance; account: string | null }> {
  const tags = [
    { Key: TAG.managed, Value: b.deployment },
    { Key: TAG.org, Value: b.org },
    { Key: TAG.pool, Value: b.pool },
    { Key: TAG.machine, Value: b.machineId },
    { Key: TAG.op, Value: opId },
    { Key: "Name", Value: `berth ${b.pool} ${b.machineId}` },
  ];
  const r = await ec2.send(new RunInstancesCommand({ ...runParams(pc, market), ClientToken: clientToken, TagSpecifications: [{ ResourceType: "instance", Tags: tags }, { ResourceType: "volume", Tags: tags }] }));
  const i = r.Instances?.[0];
  if (!i?.InstanceId) throw new Error("RunInstances answered without an instance");
  return { instance: i, account: r.OwnerId ?? null };
}

export async function reboot(ec2: EC2Client, instanceId: string): Promise<void> {
  await ec2.send(new RebootInstancesCommand({ InstanceIds: [instanceId] }));
}

export async function terminate(ec2: EC2Client, instanceIds: string[]): Promise<void> {
  if (instanceIds.length > 0) await ec2.send(new TerminateInstancesCommand({ InstanceIds: instanceIds }));
}

/**
 * The status of every instance of the region that is not terminated
 * (DescribeInstanceStatus with IncludeAllInstances, page by page): its state
 * and its system and instance status checks. Terminated instances and ones
 * too new to be listed yet are absent.
 */
export async function instanceStatuses(ec2: EC2Client): Promise<Map<string, InstanceStatus>> {
  const out = new Map<string, InstanceStatus>();
  let token: string | undefined;
  do {
    const r = await ec2.send(new DescribeInstanceStatusCommand({ IncludeAllInstances: true, MaxResults: 1000, NextToken: token }));
    for (const s of r.InstanceStatuses ?? []) if (s.InstanceId) out.set(s.InstanceId, s);
    token = r.NextToken;
  } while (token);
  return out;
}
