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
 *   provision   record the launch (op id = ClientToken, region, deployment,
 *               market, machine) in the store first; look the op id up as
 *               RunInstances ClientToken in the recorded region; launch only
 *               if absent; record the instance id the answer (or the lookup)
 *               names; wait for running and for the SSM agent; enroll.
 *   install_key resolve the instance from the machine's launch records
 *               (src/store/aws-launches.ts), in the region it was launched in; instances of
 *               today's deployment tag with no record count too; run install_key (guest
 *               timer, then key, generation checked, result recorded).
 *   remove_key  same, remove_key (seals the generation: no late install).
 *   fence       fence_prepare removes every grant key and records the boot id
 *               once; RebootInstances; done only when SSM reads a different
 *               boot id. An accepted reboot alone is never reported fenced.
 *   scrub       kill the user's processes, empty its home.
 *   destroy     terminate every instance the machine's launch records name
 *               (in their own region, whatever the configuration says now)
 *               and every instance tagged for it under today's deployment;
 *               done only when each is observed `terminated`, and never
 *               while a launch on record may exist unlisted (an instance
 *               RunInstances named that EC2 does not list yet; a lost
 *               RunInstances reply within TOKEN_LISTING_LAG_MS).
 *
 * Credentials come from the SDK's default provider chain; berth never sees
 * or stores them.
 */
import type { EC2ClientConfig, Instance } from "@aws-sdk/client-ec2";
import { DescribeInstanceInformationCommand } from "@aws-sdk/client-ssm";
import type { MachineLoss, OperationOutcome, OperationRequest, Placement, Provider, ProviderCapabilities } from "../provider.js";
import type { MachineRow } from "../../store/machines.js";
import type { OpRowArgs } from "../../protocol/operations.js";
import { parsePublicKey } from "../../core/ssh-public-key.js";
import { launchCandidates, poolConfig, sdkSettings, withImage, type AwsConfig, type AwsPoolConfig, type LaunchCandidate } from "./config.js";
import { sdkClients, type AwsClients } from "./clients.js";
import { boundInstances, byClientToken, byId, byInstanceId, boundTo, instanceStatuses, launch, reboot, stateOf, terminate, type Binding } from "./ec2.js";
import type { LaunchRecord, LaunchRecords } from "../../store/aws-launches.js";
import { errorName, errorText, runGuest, type Clock, type GuestOutcome } from "./ssm.js";
import type { GuestStep } from "./guest.js";

export type { AwsClients } from "./clients.js";

export interface AwsProviderDeps {
  config: AwsConfig;
  /** The durable launch records (storeLaunchRecords(store)): written before RunInstances, read by destroy and the sweep. */
  records: LaunchRecords;
  /** Builds the SDK clients for a region (default: clients.ts, from the config; credentials from the default chain). */
  clients?: (region: string) => AwsClients;
  /** Static credentials, for an emulator only; production leaves this unset. */
  credentials?: EC2ClientConfig["credentials"];
  /** Longest a single operation call keeps starting AWS calls before answering `ambiguous` (default: the config's, else 20 s). */
  stepBudgetMs?: number;
  /** Poll interval for instance state, SSM invocations and boot ids (default 2 s). */
  pollMs?: number;
  now?: () => number;
  sleep?: (ms: number) => Promise<void>;
}

const CAPABILITIES: ProviderCapabilities = { provision: true, installKey: true, revokeKey: true, fence: true, scrub: true, destroy: true, observeIdentity: true };

/** Errors after which AWS is known to have changed nothing. */
const DEFINITE_REFUSALS = new Set(["InsufficientInstanceCapacity", "InstanceLimitExceeded", "VcpuLimitExceeded", "Unsupported", "SpotMaxPriceTooLow", "MaxSpotInstanceCountExceeded", "InvalidParameterValue", "InvalidParameterCombination", "InvalidAMIID.NotFound", "InvalidAMIID.Malformed", "InvalidSubnetID.NotFound", "InvalidGroup.NotFound", "UnauthorizedOperation", "AccessDeniedException", "InvalidInstanceId", "InvalidDocument", "ValidationException"]);

/**
 * Refusals after which another instance type, availability zone or market
 * may launch: the provision moves to the next configured candidate. On the
 * spot market: no spot capacity (InsufficientInstanceCapacity), a spot price
 * above the pool's maxPrice (SpotMaxPriceTooLow), the account's spot limit
 * (MaxSpotInstanceCountExceeded).
 */
const CAPACITY_REFUSALS = new Set(["InsufficientInstanceCapacity", "InstanceLimitExceeded", "VcpuLimitExceeded", "Unsupported", "SpotMaxPriceTooLow", "MaxSpotInstanceCountExceeded"]);

/** StateReason codes of an instance AWS reclaimed from the spot market. */
const SPOT_RECLAIMED = new Set(["Server.SpotInstanceTermination", "Server.SpotInstanceShutdown"]);

/** Why an instance left running, as AWS says it (StateReason), and whether it was a spot interruption. */
function stateWhy(inst: Instance | undefined): string {
  const r = inst?.StateReason;
  if (!r?.Message && !r?.Code) return "";
  const spot = r.Code && SPOT_RECLAIMED.has(r.Code) ? ": reclaimed by AWS (a spot interruption)" : "";
  return ` (${r.Message ?? r.Code}${spot})`;
}

/** The ClientToken of the launch attempt an error came from (a fallback attempt's own token). */
function tokenOf(e: unknown): string | undefined {
  const t = (e as { clientToken?: unknown } | null)?.clientToken;
  return typeof t === "string" ? t : undefined;
}

/** Error codes AWS answers when a caller exceeds its request rate. */
const THROTTLING = /\b(RequestLimitExceeded|ThrottlingException|Throttling|TooManyRequestsException|RequestThrottled)\b/;

/** An ambiguous outcome whose last error was throttling is marked so (the executor does not count it as a failed attempt). */
function markThrottled(o: OperationOutcome): OperationOutcome {
  return o.kind === "ambiguous" && THROTTLING.test(o.error) ? { ...o, throttled: true } : o;
}

/** The placement of an aws launch: region/instance type/subnet (the key of its placement breaker). */
function placementKey(region: string, cand: { instanceType: string; subnetId: string }): string {
  return `${region}/${cand.instanceType}/${cand.subnetId}`;
}

/** A provision's outcome with the placement its instance was launched on: on the failure (for the breakers), or as `result.placement`. */
function withPlacement(o: OperationOutcome, placement: Placement | undefined): OperationOutcome {
  if (!placement) return o;
  return o.kind === "done" ? { ...o, result: { ...o.result, placement: placement.key } } : { ...o, placement };
}

/** `where`: the placement a provision's instance was launched on, once known. `tagScope`: where instances tagged for the machine under today's deployment are looked for (null: the pool is no longer configured). */
type Ctx = { op: OperationRequest; pc: AwsPoolConfig; c: AwsClients; b: Binding; deadline: number; tagScope: AwsClients | null; where: { placement?: Placement } };

/** A launch record with no instance found for it this long after it was written launched nothing (EC2 lists a new instance well within it). */
const LAUNCH_SETTLE_MS = 10 * 60_000;

/**
 * How long after a launch record is written a lookup by its ClientToken that
 * finds nothing is not taken as "nothing launched" by destroy (EC2 lists a
 * new instance within seconds, rarely longer). Longer than any listing lag
 * seen; short, because a record whose RunInstances was never sent (a crash,
 * a throttled call) holds its destroy this long.
 */
const TOKEN_LISTING_LAG_MS = 2 * 60_000;

/** A provision's arguments (none for another kind). */
function provisionArgs(op: OperationRequest): OpRowArgs["provision"] {
  return op.kind === "provision" ? op.args : {};
}

type Located = { inst: Instance; c: AwsClients; rec: LaunchRecord | null };

export class AwsProvider implements Provider {
  readonly name = "aws";
  readonly selfPlaced = true;
  readonly capabilities = CAPABILITIES;
  readonly #clients = new Map<string, AwsClients>();
  readonly #clock: Clock;
  readonly #budget: number;

  constructor(private readonly deps: AwsProviderDeps) {
    this.#budget = deps.stepBudgetMs ?? sdkSettings(deps.config).stepBudgetMs;
    this.#clock = { now: deps.now ?? Date.now, sleep: deps.sleep ?? ((ms) => new Promise((r) => setTimeout(r, ms))), pollMs: deps.pollMs ?? 2_000 };
  }

  get deployment(): string {
    return this.deps.config.deployment;
  }

  get records(): LaunchRecords {
    return this.deps.records;
  }

  get now(): number {
    return this.#clock.now();
  }

  clientsFor(region: string): AwsClients {
    let c = this.#clients.get(region);
    if (!c) {
      c = this.deps.clients?.(region) ?? sdkClients(this.deps.config, region, this.deps.credentials);
      this.#clients.set(region, c);
    }
    return c;
  }

  regions(): string[] {
    return [...new Set(Object.values(this.deps.config.pools).map((p) => p.region))];
  }

  async run(op: OperationRequest): Promise<OperationOutcome> {
    const where: { placement?: Placement } = {};
    return withPlacement(markThrottled(await this.#run(op, where)), where.placement);
  }

  async #run(op: OperationRequest, where: { placement?: Placement }): Promise<OperationOutcome> {
    const m = op.machine;
    const pc = poolConfig(this.deps.config, m.org, m.pool);
    const b: Binding = { deployment: this.deployment, org: m.org, pool: m.pool, machineId: m.id };
    const deadline = this.#clock.now() + this.#budget;
    if (!pc) {
      // A pool removed from the configuration still has its launches on record: destroy ends them.
      if (op.kind !== "destroy") return { kind: "failed", error: `aws_unconfigured: pool ${m.pool} has no entry in the AWS configuration`, retryable: false };
      try {
        return await this.#destroy({ op, pc: null as unknown as AwsPoolConfig, c: null as unknown as AwsClients, b, deadline, tagScope: null, where: {} });
      } catch (e) {
        return { kind: "ambiguous", error: `aws destroy: ${errorText(e)}` };
      }
    }
    const c = this.clientsFor(pc.region);
    const x: Ctx = { op, pc, c, b, deadline, tagScope: c, where };
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
      if (DEFINITE_REFUSALS.has(errorName(e))) {
        // Refused before anything was launched (the token was looked up first in this same call): the launch record is closed.
        if (op.kind === "provision") await this.deps.records.ended(tokenOf(e) ?? op.opId, this.#clock.now(), `refused: ${errorName(e)}`).catch(() => undefined);
        return { kind: "failed", error: `aws refused ${op.kind}: ${errorText(e)}`, retryable: false };
      }
      // Throttling, transport errors, lost replies: the request may or may not have taken effect.
      return { kind: "ambiguous", error: `aws ${op.kind}: ${errorText(e)}` };
    }
  }

  /**
   * The ready-instance check (the coordinator runs it on an interval over
   * ready and lent machines): per region, one paged DescribeInstanceStatus
   * for the instance ids the machines' launch records name. An instance
   * listed stopping/stopped or shutting-down, or not listed and then found
   * terminated (or no longer listed at all) by DescribeInstances, is gone;
   * a running one whose system or instance status check is `impaired` is
   * impaired. An instance not listed yet but running (a fresh one, eventual
   * consistency) and a machine with no instance on record are left alone.
   */
  async checkMachines(machines: MachineRow[]): Promise<MachineLoss[]> {
    const byRegion = new Map<string, Array<{ machineId: string; instanceId: string; requestedAt: number }>>();
    for (const m of machines) {
      const rec = (await this.deps.records.openFor(m.id)).filter((r) => r.instanceId).at(-1);
      if (!rec) continue;
      byRegion.set(rec.region, [...(byRegion.get(rec.region) ?? []), { machineId: m.id, instanceId: rec.instanceId!, requestedAt: rec.requestedAt }]);
    }
    const out: MachineLoss[] = [];
    for (const [region, list] of byRegion) {
      const { ec2 } = this.clientsFor(region);
      const statuses = await instanceStatuses(ec2);
      for (const { machineId, instanceId, requestedAt } of list) {
        const s = statuses.get(instanceId);
        let state: string | undefined = s?.InstanceState?.Name;
        let why = "";
        if (!s) {
          const inst = await byInstanceId(ec2, instanceId);
          // Not listed at all yet, soon after its launch: EC2 has not caught up (eventual consistency); not gone.
          if (!inst && this.#clock.now() - requestedAt < LAUNCH_SETTLE_MS) continue;
          state = inst ? stateOf(inst) : "gone";
          why = inst ? stateWhy(inst) : " (no longer listed by EC2)";
        } else if (state === "shutting-down" || state === "stopping" || state === "stopped") {
          // The status listing carries no reason: DescribeInstances says why (a spot interruption, a user's stop).
          why = stateWhy(await byInstanceId(ec2, instanceId));
        }
        if (state === "terminated" || state === "shutting-down" || state === "gone") {
          out.push({ machineId, verdict: "gone", cause: `instance ${instanceId} in ${region} is ${state === "gone" ? "terminated" : state}${why}; berth did not end it` });
        } else if (state === "stopping" || state === "stopped") {
          out.push({ machineId, verdict: "gone", cause: `instance ${instanceId} in ${region} is ${state}${why}; berth did not stop it` });
        } else if (state === "running" && s && (s.SystemStatus?.Status === "impaired" || s.InstanceStatus?.Status === "impaired")) {
          out.push({ machineId, verdict: "impaired", cause: `instance ${instanceId} in ${region} fails its status checks (system ${s.SystemStatus?.Status}, instance ${s.InstanceStatus?.Status})` });
        }
      }
    }
    return out;
  }

  async #provision(x0: Ctx): Promise<OperationOutcome> {
    // One (instance type, subnet) after another while the launch is refused for capacity or a limit;
    // each attempt has its own ClientToken and launch record, written before its RunInstances.
    // A candidate whose placement breaker is open is skipped unless this operation already launched there.
    const candidates = launchCandidates(x0.pc);
    const keyOf = (cand: LaunchCandidate) => placementKey(x0.pc.region, cand);
    const avoid = new Set(x0.op.avoidPlacements ?? []);
    const open = (key: string) => new Set(candidates.map(keyOf).filter((k) => k !== key && !avoid.has(k))).size;
    const refusals: string[] = [];
    let x: Ctx = x0;
    let inst: Instance | undefined;
    for (let k = 0; k < candidates.length && !inst; k++) {
      const cand = candidates[k]!;
      const token = k === 0 ? x0.op.opId : `${x0.op.opId}.f${k}`;
      const key = keyOf(cand);
      const what = `${cand.instanceType} in ${cand.subnetId}${cand.market === "spot" ? " (spot)" : ""}`;
      if (avoid.has(key) && !(await this.deps.records.byToken(token))) {
        refusals.push(`${what}: backed off (placement breaker open)`);
        continue;
      }
      // The launch is on record before it can cost money; a retry keeps the first attempt's region and deployment.
      const rec = await this.deps.records.intend({ clientToken: token, machineId: x0.b.machineId, org: x0.b.org, pool: x0.b.pool, region: x0.pc.region, deployment: x0.b.deployment, market: cand.market, requestedAt: this.#clock.now() });
      x = { ...x0, c: this.clientsFor(rec.region), b: { ...x0.b, deployment: rec.deployment } };
      if (rec.endReason?.startsWith("refused: ")) {
        // An earlier call of this operation was refused this candidate: the next one.
        refusals.push(`${what}: ${rec.endReason.slice("refused: ".length)}`);
        continue;
      }
      x0.where.placement = { key: placementKey(rec.region, cand), alternatives: open(key) };
      // A retry (or a lost reply) is resolved by looking the token up first, never by a blind second launch.
      inst = await byClientToken(x.c.ec2, token);
      if (inst) {
        await this.deps.records.launched(token, inst.InstanceId!, null);
        break;
      }
      if (rec.region !== x0.pc.region || rec.deployment !== x0.b.deployment) {
        return { kind: "failed", error: `aws_config_changed: provision ${x.op.opId} was recorded for region ${rec.region}, deployment ${rec.deployment}; the configuration now says ${x0.pc.region}, ${x0.b.deployment}`, retryable: false };
      }
      try {
        // The record's market, not today's configuration's: a ClientToken must be sent with the same parameters again.
        const l = await launch(x.c.ec2, { ...withImage(x.pc, provisionArgs(x.op).image), instanceType: cand.instanceType, subnetId: cand.subnetId }, rec.market, x.b, x.op.opId, token);
        inst = l.instance;
        await this.deps.records.launched(token, inst.InstanceId!, l.account);
      } catch (e) {
        if (!CAPACITY_REFUSALS.has(errorName(e))) throw Object.assign(e as object, { clientToken: token });
        await this.deps.records.ended(token, this.#clock.now(), `refused: ${errorName(e)}`);
        refusals.push(`${what}: ${errorName(e)}`);
        delete x0.where.placement;
      }
    }
    if (!inst) {
      return { kind: "failed", error: `aws refused provision: every configured instance type, subnet${x0.pc.spot ? " and market" : ""} was refused or is backed off (${refusals.join("; ")})`, retryable: false };
    }
    if (!boundTo(inst, x.b)) return { kind: "failed", error: `instance ${inst.InstanceId} launched under op ${x.op.opId} is not tagged for machine ${x.b.machineId}`, retryable: false };
    const id = inst.InstanceId!;
    const { ec2 } = x.c;
    const running = await this.#waitFor(async () => {
      // Right after RunInstances, EC2 may not know the id yet (eventual consistency): not yet, not an error.
      const now = await byId(ec2, id).catch((e: unknown) => {
        if (errorName(e) === "InvalidInstanceID.NotFound") return undefined;
        throw e;
      });
      if (now && ["shutting-down", "terminated", "stopping", "stopped"].includes(stateOf(now))) throw new Error(`instance ${id} is ${stateOf(now)}`);
      return now && stateOf(now) === "running" ? now : null;
    }, x.deadline);
    if (!running) return { kind: "ambiguous", error: `instance ${id} launched, not running yet` };
    const online = await this.#waitFor(async () => {
      const r = await x.c.ssm.send(new DescribeInstanceInformationCommand({ Filters: [{ Key: "InstanceIds", Values: [id] }] }));
      return r.InstanceInformationList?.find((i) => i.InstanceId === id && i.PingStatus === "Online") ?? null;
    }, x.deadline);
    if (!online) return { kind: "ambiguous", error: `instance ${id} running; its SSM agent is not online yet (is the instance profile ${x.pc.instanceProfile} attached with AmazonSSMManagedInstanceCore?)` };
    const keeperKey = provisionArgs(x.op).keeperKey ?? null;
    const g = await this.#guest(x, id, { kind: "enroll", keeperKey });
    if (g.kind !== "result") return this.#fromGuest(g, "enroll");
    const host = x.pc.sshAddress === "public" ? running.PublicIpAddress : running.PrivateIpAddress;
    if (!host) return { kind: "ambiguous", error: `instance ${id} has no ${x.pc.sshAddress} address yet` };
    return { kind: "done", result: { instanceId: id, incarnation: String(g.value.incarnation), sshHost: host, sshPort: x.pc.sshPort, hostKey: String(g.value.hostKey) } };
  }

  /**
   * Every not-terminated instance of the machine: those its launch records
   * name (looked up in the record's region; a record whose instance is
   * observed terminated, or whose token launched nothing, is closed), and
   * those tagged for it under today's deployment in today's region.
   */
  async #located(x: Ctx, gone: string[] = [], unlisted: string[] = []): Promise<Located[]> {
    const out: Located[] = [];
    const seen = new Set<string>();
    const now = this.#clock.now();
    for (const rec of await this.deps.records.openFor(x.b.machineId)) {
      const c = this.clientsFor(rec.region);
      const inst = rec.instanceId ? await byInstanceId(c.ec2, rec.instanceId) : await byClientToken(c.ec2, rec.clientToken);
      if (inst?.InstanceId && !rec.instanceId) await this.deps.records.launched(rec.clientToken, inst.InstanceId, null);
      if (!inst) {
        if (now - rec.requestedAt >= LAUNCH_SETTLE_MS) await this.deps.records.ended(rec.clientToken, now, rec.instanceId ? "no longer listed by EC2" : "no instance launched with this client token");
        // RunInstances named this instance and EC2 does not list it yet (eventual consistency): it exists, and may be billed.
        else if (rec.instanceId) unlisted.push(`instance ${rec.instanceId}`);
        // RunInstances' reply was lost (or never sent): for a while, "nothing by this token" may only mean "not listed yet".
        else if (now - rec.requestedAt < TOKEN_LISTING_LAG_MS) unlisted.push(`the launch of client token ${rec.clientToken} (if it launched anything)`);
        continue;
      }
      if (stateOf(inst) === "terminated") {
        gone.push(`${inst.InstanceId} is terminated${stateWhy(inst)}`);
        await this.deps.records.ended(rec.clientToken, now, "observed terminated");
        continue;
      }
      seen.add(inst.InstanceId!);
      out.push({ inst, c, rec });
    }
    if (x.tagScope) for (const inst of await boundInstances(x.tagScope.ec2, x.b)) if (!seen.has(inst.InstanceId!)) out.push({ inst, c: x.tagScope, rec: null });
    return out;
  }

  /** The one instance bound to the machine, running; or why there is none. */
  async #bound(x: Ctx): Promise<{ inst: Instance; c: AwsClients } | { outcome: OperationOutcome }> {
    const gone: string[] = [];
    const unlisted: string[] = [];
    const located = await this.#located(x, gone, unlisted);
    const found = located.map((l) => l.inst);
    if (found.length === 0 && unlisted.length > 0) return { outcome: { kind: "ambiguous", error: `machine ${x.b.machineId}: ${unlisted.join(", ")} not listed by EC2 yet` } };
    if (found.length === 0) {
      const seen = gone.length > 0 ? `: instance ${gone.join(", ")}, not ended by berth` : "";
      return { outcome: { kind: "failed", error: `machine_lost: no live instance is bound to machine ${x.b.machineId}${seen}`, retryable: false } };
    }
    const inst0 = found[0]!;
    if (found.length === 1 && (stateOf(inst0) === "stopped" || stateOf(inst0) === "stopping")) {
      return { outcome: { kind: "failed", error: `machine_lost: instance ${inst0.InstanceId} of machine ${x.b.machineId} is ${stateOf(inst0)}, not stopped by berth`, retryable: false } };
    }
    if (found.length > 1) return { outcome: { kind: "failed", error: `${found.length} instances are bound to machine ${x.b.machineId}; refusing to act on any`, retryable: false } };
    const inst = found[0]!;
    if (stateOf(inst) !== "running") return { outcome: { kind: "ambiguous", error: `instance ${inst.InstanceId} is ${stateOf(inst)}` } };
    return { inst, c: located[0]!.c };
  }

  async #onInstance(x0: Ctx): Promise<OperationOutcome> {
    const r = await this.#bound(x0);
    if ("outcome" in r) return r.outcome;
    const x: Ctx = { ...x0, c: r.c };
    const id = r.inst.InstanceId!;
    const op = x.op;
    switch (op.kind) {
      case "install_key": {
        const a = op.args;
        if (a.mode !== "grant" || typeof a.expiresAt !== "number" || typeof a.grantId !== "string") {
          return { kind: "failed", error: "install_key on aws takes a grant key with an expiry (mode grant, grantId, expiresAt)", retryable: false };
        }
        const key = parsePublicKey(a.publicKey);
        const g = await this.#guest(x, id, { kind: "install_key", publicKey: key.line, grantId: a.grantId, expiresAt: a.expiresAt });
        if (g.kind !== "result") return this.#fromGuest(g, "install_key");
        // The guest read its key file back after writing: the line it found must carry this key for this grant.
        const back = typeof g.value.installed === "string" ? Buffer.from(g.value.installed, "base64").toString("utf8") : "";
        if (!back.includes(` ${key.line} `) || !back.endsWith(` berth:g${x.op.generation}:${a.grantId}`)) {
          return { kind: "failed", error: `key_not_installed: the key file of instance ${id} did not read back the key of grant ${a.grantId} (${back ? "another line" : "no line"})`, retryable: false };
        }
        return { kind: "done", result: { instanceId: id, fingerprint: key.fingerprint, grantId: a.grantId, expiresAt: a.expiresAt, generation: x.op.generation } };
      }
      case "remove_key": {
        const g = await this.#guest(x, id, { kind: "remove_key", grantId: op.args.grantId ?? null });
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
    const unlisted: string[] = [];
    const live = await this.#located(x, [], unlisted);
    if (live.length === 0 && unlisted.length === 0) return { kind: "done", result: { existed: false, terminated: [] } };
    const ids = live.map((l) => l.inst.InstanceId!);
    const byClient = new Map<AwsClients, string[]>();
    for (const l of live) if (stateOf(l.inst) !== "shutting-down") byClient.set(l.c, [...(byClient.get(l.c) ?? []), l.inst.InstanceId!]);
    for (const [c, list] of byClient) await terminate(c.ec2, list);
    // An instance RunInstances named that EC2 does not list yet cannot be terminated yet, and is not gone: never "done" over it.
    if (unlisted.length > 0) return { kind: "ambiguous", error: `machine ${x.b.machineId}: ${unlisted.join(", ")} not listed by EC2 yet; destroy waits for it` };
    const gone = await this.#waitFor(async () => ((await this.#located(x)).length === 0 ? true : null), x.deadline);
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
