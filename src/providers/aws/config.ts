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

/**
 * The root EBS volume (RunInstances BlockDeviceMappings). `deviceName` must
 * be the AMI's root device (`RootDeviceName`: /dev/xvda on Amazon Linux,
 * /dev/sda1 on Ubuntu); another name would add a second volume instead.
 * The volume is always deleted with the instance.
 */
const rootVolumeSchema = z
  .object({
    deviceName: z.string().regex(/^\/dev\/(sd[a-z][0-9]*|xvd[a-z]+|nvme[0-9]+n[0-9]+)$/, "the AMI's root device name, such as /dev/xvda or /dev/sda1"),
    sizeGiB: z.number().int().min(1).max(16_384),
    volumeType: z.enum(["gp3", "gp2"]).default("gp3"),
    encrypted: z.boolean().default(false),
    /** A KMS key id, ARN or alias for the encryption (absent: the account's default EBS key). Only with `encrypted: true`. */
    kmsKeyId: z.string().regex(/^(arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:(key|alias)\/[A-Za-z0-9/_+=,.@-]+|alias\/[A-Za-z0-9/_+=,.@-]+|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|mrk-[0-9a-f]{32})$/, "a KMS key id, key ARN, alias/NAME or alias ARN").optional(),
  })
  .strict()
  .refine((v) => v.kmsKeyId === undefined || v.encrypted, { message: "kmsKeyId needs encrypted: true", path: ["kmsKeyId"] });

/** A launch template by id or by name (exactly one), at a version (a number, $Latest or $Default; default $Default). */
const launchTemplateSchema = z
  .object({
    id: z.string().regex(/^lt-[0-9a-f]{17}$/, "a launch template id such as lt-0123456789abcdef0").optional(),
    name: z.string().regex(/^[A-Za-z0-9().\/_-]{3,128}$/, "a launch template name (3–128 of letters, digits, ( ) . / _ -)").optional(),
    version: z.string().regex(/^([1-9][0-9]{0,17}|\$Latest|\$Default)$/, "a version number, $Latest or $Default").default("$Default"),
  })
  .strict()
  .refine((v) => (v.id === undefined) !== (v.name === undefined), { message: "give exactly one of id and name" });

const endpoint = z.string().url();

/**
 * Spot: RunInstances asks for a one-time spot instance, terminated on
 * interruption (InstanceMarketOptions). `maxPrice` is the most paid per
 * instance-hour in USD (absent: up to the on-demand price, AWS's default);
 * `fallbackOnDemand` launches on demand once every spot placement was
 * refused for capacity, price or a spot limit.
 */
const spotSchema = z
  .object({
    maxPrice: z
      .union([z.string(), z.number()])
      .transform((v) => String(v))
      .pipe(z.string().regex(/^(0|[1-9][0-9]{0,3})(\.[0-9]{1,6})?$/, "a price in USD per instance-hour, such as \"0.05\"").refine((v) => Number(v) > 0, "a price above 0"))
      .optional(),
    fallbackOnDemand: z.boolean().default(false),
  })
  .strict();

export type Market = "spot" | "on-demand";

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
    /** Root EBS volume size and encryption (absent: the AMI's own root volume, as the AMI defines it). */
    rootVolume: rootVolumeSchema.optional(),
    /** A launch template for what berth does not set itself (user data, key pair, placement…); berth's own parameters take precedence. */
    launchTemplate: launchTemplateSchema.optional(),
    /** Launch spot instances (one-time, terminated on interruption) instead of on-demand ones. */
    spot: spotSchema.optional(),
  })
  .strict();

const fileSchema = z
  .object({
    /** Tag value that marks this deployment's instances (the sweep only ever touches these). */
    deployment: z.string().regex(/^[A-Za-z0-9_.-]{1,64}$/),
    /** Endpoint override for both EC2 and SSM (an emulator); absent means the SDK's default endpoints. */
    endpoint: endpoint.optional(),
    /** Per-service endpoint overrides (VPC interface endpoints are one per service); each takes precedence over `endpoint`. */
    endpoints: z.object({ ec2: endpoint.optional(), ssm: endpoint.optional() }).strict().optional(),
    /** Longest one operation call keeps starting AWS calls before answering ambiguous (default 20 s). */
    stepBudgetMs: z.number().int().min(500).max(28_000).optional(),
    /** One HTTP attempt of an AWS call with no complete answer by then is abandoned (SDK requestTimeout; default 4 s). */
    requestTimeoutMs: z.number().int().min(500).max(20_000).optional(),
    /** Connecting to the endpoint is abandoned after this (SDK connectionTimeout; default 2 s). */
    connectTimeoutMs: z.number().int().min(100).max(10_000).optional(),
    /** Attempts per AWS call, the first included (SDK standard retry mode; default 2). */
    maxAttempts: z.number().int().min(1).max(3).optional(),
    /** Pools by name (`pool`) or by `org/pool`. */
    pools: z.record(z.string(), poolSchema),
  })
  .strict();

export type AwsPoolConfig = z.infer<typeof poolSchema>;
export type AwsConfig = z.infer<typeof fileSchema>;

/** How long the executor leases an operation (store/operations.ts OP_LEASE_MS): one provider call must end within it. */
const LEASE_MS = 30_000;

const SDK_DEFAULTS = { stepBudgetMs: 20_000, requestTimeoutMs: 4_000, connectTimeoutMs: 2_000, maxAttempts: 2 } as const;

/** The SDK settings in force, defaults filled in. */
export function sdkSettings(c: AwsConfig): { stepBudgetMs: number; requestTimeoutMs: number; connectTimeoutMs: number; maxAttempts: number } {
  return {
    stepBudgetMs: c.stepBudgetMs ?? SDK_DEFAULTS.stepBudgetMs,
    requestTimeoutMs: c.requestTimeoutMs ?? SDK_DEFAULTS.requestTimeoutMs,
    connectTimeoutMs: c.connectTimeoutMs ?? SDK_DEFAULTS.connectTimeoutMs,
    maxAttempts: c.maxAttempts ?? SDK_DEFAULTS.maxAttempts,
  };
}

/**
 * The longest one AWS call can take: each attempt at most `requestTimeoutMs`,
 * and the SDK's standard retry waits at most 0.5 s × 2^i before retry i+1.
 */
function worstCallMs(s: { requestTimeoutMs: number; maxAttempts: number }): number {
  let backoff = 0;
  for (let i = 0; i < s.maxAttempts - 1; i++) backoff += 500 * 2 ** i;
  return s.maxAttempts * s.requestTimeoutMs + backoff;
}

export function parseAwsConfig(value: unknown, where = "AWS configuration"): AwsConfig {
  const r = fileSchema.safeParse(value);
  if (!r.success) {
    const first = r.error.issues[0]!;
    throw new BerthError("invalid_request", `invalid_request: ${where}: ${first.path.join(".") || "(root)"}: ${first.message}`);
  }
  // A call started just before the step budget runs out must still end within the operation's lease.
  const s = sdkSettings(r.data);
  if (s.connectTimeoutMs > s.requestTimeoutMs) {
    throw new BerthError("invalid_request", `invalid_request: ${where}: connectTimeoutMs (${s.connectTimeoutMs}) is longer than requestTimeoutMs (${s.requestTimeoutMs}), which already bounds the whole attempt`);
  }
  if (s.stepBudgetMs + worstCallMs(s) > LEASE_MS) {
    throw new BerthError(
      "invalid_request",
      `invalid_request: ${where}: stepBudgetMs ${s.stepBudgetMs} + maxAttempts ${s.maxAttempts} × requestTimeoutMs ${s.requestTimeoutMs} (+ ${worstCallMs(s) - s.maxAttempts * s.requestTimeoutMs} ms of SDK retry backoff) is ${s.stepBudgetMs + worstCallMs(s)} ms, over the ${LEASE_MS} ms an operation is leased for; lower one of them`,
    );
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

export interface LaunchCandidate {
  instanceType: string;
  subnetId: string;
  market: Market;
}

/**
 * The (instance type, subnet, market) a provision tries, in order: the
 * configured pair first, then every subnet with each fallback type; in a
 * spot pool all of them on the spot market, then, with `fallbackOnDemand`,
 * all of them again on demand.
 */
export function launchCandidates(pc: AwsPoolConfig): LaunchCandidate[] {
  const markets: Market[] = pc.spot ? (pc.spot.fallbackOnDemand ? ["spot", "on-demand"] : ["spot"]) : ["on-demand"];
  const out: LaunchCandidate[] = [];
  for (const market of markets) {
    for (const instanceType of [pc.instanceType, ...pc.fallbackInstanceTypes]) {
      for (const subnetId of [pc.subnetId, ...pc.fallbackSubnetIds]) out.push({ instanceType, subnetId, market });
    }
  }
  return out;
}
