/**
 * The `aws` provider: machines are EC2 instances; keys, fencing and scrub go
 * through SSM Run Command (see guest.ts for the guest contract).
 *
 * Every operation is bounded by `stepBudgetMs` (kept under the executor's
 * operation lease). Work that has been requested but not yet observed done
 * (an instance still booting, a command still queued, a reboot whose boot
 * change is not seen yet, a termination still in progress) is reported
 * `ambiguous`; the executor retries with the same operation id, and each step
 * here resumes from what it can observe instead of acting blindly again:
 *
 *   provision   look the op id up as RunInstances ClientToken; launch only if
 *               absent; wait for running and for the SSM agent; enroll.
 *   install_key resolve the instance by its tags; run install_key (guest
 *               timer, then key, generation checked, result recorded).
 *   remove_key  same, remove_key (seals the generation: no late install).
 *   fence       fence_prepare removes every grant key and records the boot id
 *               once; RebootInstances; done only when SSM reads a different
 *               boot id. An accepted reboot alone is never reported fenced.
 *   scrub       kill the user's processes, empty its home.
 *   destroy     terminate every instance bound to the machine; done only when
 *               each is observed `terminated`.
 *
 * Credentials come from the SDK's default provider chain; berth never sees
 * or stores them.
 */
import { EC2Client, type EC2ClientConfig, type Instance } from "@aws-sdk/client-ec2";
import { SSMClient, DescribeInstanceInformationCommand } from "@aws-sdk/client-ssm";
import type { OperationOutcome, OperationRequest, Provider, ProviderCapabilities } from "../provider.js";
import { parsePublicKey } from "../../core/ssh-public-key.js";
import { poolConfig, withImage, type AwsConfig, type AwsPoolConfig } from "./config.js";
import { boundInstances, byClientToken, byId, boundTo, launch, reboot, stateOf, terminate, type Binding } from "./ec2.js";
import { errorName, errorText, runGuest, type Clock, type GuestOutcome } from "./ssm.js";
import type { GuestStep } from "./guest.js";

export interface AwsClients {
  ec2: EC2Client;
  ssm: SSMClient;
}

export interface AwsProviderDeps {
  config: AwsConfig;
  /** Builds the SDK clients for a region (default: endpoint from the config, credentials from the default chain). */
  clients?: (region: string) => AwsClients;
  /** Static credentials, for an emulator only; production leaves this unset. */
  credentials?: EC2ClientConfig["credentials"];
  /** Longest a single operation call waits before answering `ambiguous` (default 25 s). */
  stepBudgetMs?: number;
  /** Poll interval for instance state, SSM invocations and boot ids (default 2 s). */
  pollMs?: number;
  now?: () => number;
  sleep?: (ms: number) => Promise<void>;
}

const CAPABILITIES: ProviderCapabilities = { provision: true, installKey: true, revokeKey: true, fence: true, scrub: true, destroy: true, observeIdentity: true };

/** Errors after which AWS is known to have changed nothing. */
const DEFINITE_REFUSALS = new Set(["InvalidParameterValue", "InvalidParameterCombination", "InvalidAMIID.NotFound", "InvalidAMIID.Malformed", "InvalidSubnetID.NotFound", "InvalidGroup.NotFound", "UnauthorizedOperation", "AccessDeniedException", "InvalidInstanceId", "InvalidDocument", "ValidationException"]);

type Ctx = { op: OperationRequest; pc: AwsPoolConfig; c: AwsClients; b: Binding; deadline: number };

export class AwsProvider implements Provider {
  readonly name = "aws";
  readonly selfPlaced = true;
  readonly capabilities = CAPABILITIES;
  readonly #clients = new Map<string, AwsClients>();
  readonly #clock: Clock;
  readonly #budget: number;

  constructor(private readonly deps: AwsProviderDeps) {
    this.#budget = deps.stepBudgetMs ?? deps.config.stepBudgetMs ?? 25_000;
    this.#clock = { now: deps.now ?? Date.now, sleep: deps.sleep ?? ((ms) => new Promise((r) => setTimeout(r, ms))), pollMs: deps.pollMs ?? 2_000 };
  }

  get deployment(): string {
    return this.deps.config.deployment;
  }

  clientsFor(region: string): AwsClients {
    let c = this.#clients.get(region);
    if (!c) {
      const base = { region, endpoint: this.deps.config.endpoint, credentials: this.deps.credentials };
      c = this.deps.clients?.(region) ?? { ec2: new EC2Client(base), ssm: new SSMClient(base) };
      this.#clients.set(region, c);
    }
    return c;
  }

  regions(): string[] {
    return [...new Set(Object.values(this.deps.config.pools).map((p) => p.region))];
  }

  async run(op: OperationRequest): Promise<OperationOutcome> {
    const m = op.machine;
    const pc = poolConfig(this.deps.config, m.org, m.pool);
    if (!pc) return { kind: "failed", error: `aws_unconfigured: pool ${m.pool} has no entry in the AWS configuration`, retryable: false };
    const x: Ctx = { op, pc, c: this.clientsFor(pc.region), b: { deployment: this.deployment, org: m.org, pool: m.pool, machineId: m.id }, deadline: this.#clock.now() + this.#budget };
    try {
      switch (op.kind) {
        case "provision":
          return await this.#provision(x);
        case "destroy":
          return await this.#destroy(x);
        case "install_key":
        case "remove_key":
        case "fence":
        case "scrub":
          return await this.#onInstance(x);
      }
    } catch (e) {
      if (DEFINITE_REFUSALS.has(errorName(e))) return { kind: "failed", error: `aws refused ${op.kind}: ${errorText(e)}`, retryable: false };
      // Throttling, transport errors, lost replies: the request may or may not have taken effect.
      return { kind: "ambiguous", error: `aws ${op.kind}: ${errorText(e)}` };
    }
  }

  async #provision(x: Ctx): Promise<OperationOutcome> {
    const { ec2 } = x.c;
    // A retry (or a lost reply) is resolved by looking the token up first, never by a blind second launch.
    let inst = await byClientToken(ec2, x.op.opId);
    if (!inst) inst = await launch(ec2, withImage(x.pc, x.op.args.image), x.b, x.op.opId);
    if (!boundTo(inst, x.b)) return { kind: "failed", error: `instance ${inst.InstanceId} launched under op ${x.op.opId} is not tagged for machine ${x.b.machineId}`, retryable: false };
    const id = inst.InstanceId!;
    const running = await this.#waitFor(async () => {
      const now = await byId(ec2, id);
      if (now && ["shutting-down", "terminated", "stopping", "stopped"].includes(stateOf(now))) throw new Error(`instance ${id} is ${stateOf(now)}`);
      return now && stateOf(now) === "running" ? now : null;
    }, x.deadline);
    if (!running) return { kind: "ambiguous", error: `instance ${id} launched, not running yet` };
    const online = await this.#waitFor(async () => {
      const r = await x.c.ssm.send(new DescribeInstanceInformationCommand({ Filters: [{ Key: "InstanceIds", Values: [id] }] }));
      return r.InstanceInformationList?.find((i) => i.InstanceId === id && i.PingStatus === "Online") ?? null;
    }, x.deadline);
    if (!online) return { kind: "ambiguous", error: `instance ${id} running; its SSM agent is not online yet (is the instance profile ${x.pc.instanceProfile} attached with AmazonSSMManagedInstanceCore?)` };
    const keeperKey = typeof x.op.args.keeperKey === "string" ? x.op.args.keeperKey : null;
    const g = await this.#guest(x, id, { kind: "enroll", keeperKey });
    if (g.kind !== "result") return this.#fromGuest(g, "enroll");
    const host = x.pc.sshAddress === "public" ? running.PublicIpAddress : running.PrivateIpAddress;
    if (!host) return { kind: "ambiguous", error: `instance ${id} has no ${x.pc.sshAddress} address yet` };
    return { kind: "done", result: { instanceId: id, incarnation: String(g.value.incarnation), sshHost: host, sshPort: x.pc.sshPort, hostKey: String(g.value.hostKey) } };
  }

  /** The one instance bound to the machine, running; or why there is none. */
  async #bound(x: Ctx): Promise<{ inst: Instance } | { outcome: OperationOutcome }> {
    const found = await boundInstances(x.c.ec2, x.b);
    if (found.length === 0) return { outcome: { kind: "failed", error: `no live instance is bound to machine ${x.b.machineId}`, retryable: false } };
    if (found.length > 1) return { outcome: { kind: "failed", error: `${found.length} instances are bound to machine ${x.b.machineId}; refusing to act on any`, retryable: false } };
    const inst = found[0]!;
    if (stateOf(inst) !== "running") return { outcome: { kind: "ambiguous", error: `instance ${inst.InstanceId} is ${stateOf(inst)}` } };
    return { inst };
  }

  async #onInstance(x: Ctx): Promise<OperationOutcome> {
    const r = await this.#bound(x);
    if ("outcome" in r) return r.outcome;
    const id = r.inst.InstanceId!;
    const a = x.op.args;
    switch (x.op.kind) {
      case "install_key": {
        if (a.mode !== "grant" || typeof a.expiresAt !== "number" || typeof a.grantId !== "string") {
          return { kind: "failed", error: "install_key on aws takes a grant key with an expiry (mode grant, grantId, expiresAt)", retryable: false };
        }
        const key = parsePublicKey(a.publicKey);
        const g = await this.#guest(x, id, { kind: "install_key", publicKey: key.line, grantId: a.grantId, expiresAt: a.expiresAt });
        if (g.kind !== "result") return this.#fromGuest(g, "install_key");
        return { kind: "done", result: { instanceId: id, fingerprint: key.fingerprint, grantId: a.grantId, expiresAt: a.expiresAt, generation: x.op.generation } };
      }
      case "remove_key": {
        const g = await this.#guest(x, id, { kind: "remove_key", grantId: typeof a.grantId === "string" ? a.grantId : null });
        if (g.kind !== "result") return this.#fromGuest(g, "remove_key");
        return { kind: "done", result: { instanceId: id, removed: g.value.removed, keysRemaining: g.value.keysRemaining } };
      }
      case "fence":
        return this.#fence(x, id);
      case "scrub": {
        const g = await this.#guest(x, id, { kind: "scrub" });
        if (g.kind !== "result") return this.#fromGuest(g, "scrub");
        return { kind: "done", result: { instanceId: id, scrubbed: true, incarnation: String(g.value.incarnation) } };
      }
      default:
        return { kind: "failed", error: `aws: ${x.op.kind} is not an instance operation`, retryable: false };
    }
  }

  async #fence(x: Ctx, id: string): Promise<OperationOutcome> {
    const prep = await this.#guest(x, id, { kind: "fence_prepare" });
    if (prep.kind !== "result") return this.#fromGuest(prep, "fence");
    const before = String(prep.value.bootBefore);
    const proven = (boot: string): OperationOutcome => ({
      kind: "done",
      result: { instanceId: id, incarnationBefore: before, incarnation: boot, keysRemaining: prep.value.keysRemaining, evidence: `boot id changed from ${before} to ${boot} after the grant keys were removed` },
    });
    // A retry after the reboot already happened: the boot id recorded before it differs from the current one.
    if (String(prep.value.boot) !== before) return proven(String(prep.value.boot));
    await reboot(x.c.ec2, id);
    for (;;) {
      await this.#clock.sleep(this.#clock.pollMs);
      if (this.#clock.now() >= x.deadline) break;
      const seen = await this.#guest(x, id, { kind: "boot_id" });
      if (seen.kind === "result" && String(seen.value.boot) !== before) return proven(String(seen.value.boot));
      if (seen.kind === "refused") return this.#fromGuest(seen, "fence");
    }
    // Requested is not proven: the executor retries (re-requesting the reboot if it never happened), then quarantines.
    return { kind: "ambiguous", error: `reboot of ${id} requested; no new boot id observed yet (still ${before})` };
  }

  async #destroy(x: Ctx): Promise<OperationOutcome> {
    const live = await boundInstances(x.c.ec2, x.b);
    if (live.length === 0) return { kind: "done", result: { existed: false, terminated: [] } };
    const ids = live.map((i) => i.InstanceId!);
    await terminate(x.c.ec2, ids.filter((_, k) => stateOf(live[k]!) !== "shutting-down"));
    const gone = await this.#waitFor(async () => ((await boundInstances(x.c.ec2, x.b)).length === 0 ? true : null), x.deadline);
    if (!gone) return { kind: "ambiguous", error: `termination of ${ids.join(", ")} requested; not yet observed terminated` };
    return { kind: "done", result: { existed: true, terminated: ids, evidence: "instances observed terminated" } };
  }

  #guest(x: Ctx, instanceId: string, step: GuestStep): Promise<GuestOutcome> {
    return runGuest(x.c.ssm, { opId: x.op.opId, instanceId, machineId: x.b.machineId, pool: x.b.pool, generation: x.op.generation }, step, x.deadline, this.#clock);
  }

  #fromGuest(g: Exclude<GuestOutcome, { kind: "result" }>, what: string): OperationOutcome {
    if (g.kind === "refused") return { kind: "failed", error: `${g.code}: the guest refused ${what}: ${g.message}`, retryable: false };
    return { kind: "ambiguous", error: `${what}: ${g.why}` };
  }

  async #waitFor<T>(probe: () => Promise<T | null>, deadline: number): Promise<T | null> {
    for (;;) {
      const v = await probe();
      if (v) return v;
      if (this.#clock.now() >= deadline) return null;
      await this.#clock.sleep(this.#clock.pollMs);
    }
  }
}
