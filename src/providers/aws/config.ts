/**
 * AWS provider configuration: which account-side resources each pool uses.
 * Credentials are NOT part of it: the SDK's standard provider chain supplies
 * them (environment, shared config/SSO, instance or task role) and berth never
 * stores them. The file names, per pool, the region, subnet, security groups,
 * instance type and the pinned AMI (the pool's provider-scoped image identity).
 */
import { readFileSync } from "node:fs";
import { z } from "zod";
import { BerthError } from "../../core/errors.js";
import { parseImageRef } from "../../core/image-ref.js";

/** EC2's instance type names: family (with options after a dash, m7i-flex, u-6tb1) dot size. */
const instanceType = z.string().regex(/^[a-z][a-z0-9]*(-[a-z0-9]+)*\.[a-z0-9]+$/, "an EC2 instance type such as t3.micro or m7i-flex.large");
const subnetId = z.string().regex(/^subnet-[0-9a-f]+$/);

const poolSchema = z
  .object({
    region: z.string().regex(/^[a-z]{2}(-[a-z]+)+-\d+$/, "an AWS region such as eu-west-1"),
    subnetId: subnetId,
    securityGroupIds: z.array(z.string().regex(/^sg-[0-9a-f]+$/)).min(1),
    instanceType: instanceType,
    /**
     * Tried in order when a launch is refused for capacity or a limit
     * (InsufficientInstanceCapacity, InstanceLimitExceeded, VcpuLimitExceeded,
     * Unsupported): every subnet (`subnetId`, then these; another subnet is
     * another availability zone) with `instanceType`, then every subnet with
     * each fallback type. Each attempt is its own launch record and ClientToken.
     */
    fallbackSubnetIds: z.array(subnetId).max(8).default([]),
    fallbackInstanceTypes: z.array(instanceType).max(8).default([]),
    imageId: z.string().regex(/^ami-[0-9a-f]+$/),
    /** Instance profile that lets the SSM agent register (AmazonSSMManagedInstanceCore). */
    instanceProfile: z.string().min(1),
    /** Which address clients use for SSH. */
    sshAddress: z.enum(["private", "public"]).default("private"),
    sshPort: z.number().int().min(1).max(65535).default(22),
  })
  .strict();

const fileSchema = z
  .object({
    /** Tag value that marks this deployment's instances (the sweep only ever touches these). */
    deployment: z.string().regex(/^[A-Za-z0-9_.-]{1,64}$/),
    /** Endpoint override (an emulator, a VPC endpoint); absent means the SDK's default endpoints. */
    endpoint: z.string().url().optional(),
    /** Longest one operation call waits before answering ambiguous (kept under the executor's 30 s lease). */
    stepBudgetMs: z.number().int().min(500).max(28_000).optional(),
    /** Pools by name (`pool`) or by `org/pool`. */
    pools: z.record(z.string(), poolSchema),
  })
  .strict();

export type AwsPoolConfig = z.infer<typeof poolSchema>;
export type AwsConfig = z.infer<typeof fileSchema>;

export function parseAwsConfig(value: unknown, where = "AWS configuration"): AwsConfig {
  const r = fileSchema.safeParse(value);
  if (!r.success) {
    const first = r.error.issues[0]!;
    throw new BerthError("invalid_request", `invalid_request: ${where}: ${first.path.join(".") || "(root)"}: ${first.message}`);
  }
  return r.data;
}

export function loadAwsConfig(file: string): AwsConfig {
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(file, "utf8"));
  } catch (e) {
    throw new BerthError("invalid_request", `invalid_request: cannot read AWS configuration ${file}: ${e instanceof Error ? e.message : String(e)}`);
  }
  return parseAwsConfig(raw, file);
}

export function poolConfig(c: AwsConfig, org: string, pool: string): AwsPoolConfig | undefined {
  return c.pools[`${org}/${pool}`] ?? c.pools[pool];
}

/**
 * The pool's configuration with the AMI its image names (`berth pool ensure
 * --image ami:ami-…`, carried in the provision's arguments) in place of the
 * file's `imageId`; without one, the file's. Anything but an AMI is refused.
 */
export function withImage(pc: AwsPoolConfig, image: unknown): AwsPoolConfig {
  if (image === undefined || image === null) return pc;
  const ref = typeof image === "string" ? parseImageRef(image) : null;
  if (ref === null || ref.kind !== "ami") {
    throw new BerthError("invalid_request", `invalid_request: the aws provider boots AMIs only (ami:ami-…), not ${JSON.stringify(image).slice(0, 120)}`);
  }
  return { ...pc, imageId: ref.amiId };
}

/** The (instance type, subnet) pairs a provision tries, in order: the configured pair first. */
export function launchCandidates(pc: AwsPoolConfig): Array<{ instanceType: string; subnetId: string }> {
  const out: Array<{ instanceType: string; subnetId: string }> = [];
  for (const instanceType of [pc.instanceType, ...pc.fallbackInstanceTypes]) {
    for (const subnetId of [pc.subnetId, ...pc.fallbackSubnetIds]) out.push({ instanceType, subnetId });
  }
  return out;
}
