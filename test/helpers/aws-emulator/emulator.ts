/**
 * An EC2 + SSM emulator on loopback that the real AWS SDK v3 clients talk to
 * through an endpoint override (with fake static credentials; signatures are
 * not checked). One HTTP server speaks both wire protocols:
 *   - EC2 Query (form-encoded `Action=…`, XML answers): RunInstances (with
 *     ClientToken idempotency, IdempotentParameterMismatch, TagSpecifications,
 *     capacity refusals per type/subnet; spot launches with their own
 *     capacity, price and count refusals), DescribeInstances
 *     (instance ids; filters client-token, instance-state-name, tag:K),
 *     RebootInstances, TerminateInstances, DescribeInstanceStatus (paged;
 *     status checks `impaired` when a test sets `instance.impaired`);
 *   - SSM JSON 1.1 (`X-Amz-Target: AmazonSSM.<Op>`): SendCommand
 *     (AWS-RunShellScript), GetCommandInvocation, ListCommands (paged),
 *     DescribeInstanceInformation (paged), CancelCommand; statuses as SSM
 *     names them (Pending, Delayed, InProgress, Success, Failed, TimedOut
 *     with StatusDetails DeliveryTimedOut or ExecutionTimedOut,
 *     Cancelling, Cancelled).
 * Each instance is a real sandbox (instance.ts). Faults are injected by the
 * test through `faults`: lost replies (the action happens, the connection is
 * cut before the answer), throttling, delayed, held and duplicated SSM
 * deliveries, reboots accepted but not performed, slow boots and reboots,
 * terminations that lag, instances stopped or terminated behind the
 * caller's back (`stopBehind`, `terminate`), small pages (`pageSize`),
 * calls never answered (`hold`), subnets whose instances never register
 * (`ssmNeverRegistersIn`), eventual consistency (`describeLagMs`,
 * `invocationLagMs`), `Delayed` deliveries (`ssmDelayed`), cancelled
 * commands (`cancel`, `cancelLagMs`), a reboot whose old boot answers for a
 * while (`rebootGraceMs`), spot interruptions (`interruptSpot`). By default
 * an invocation is invisible for 100 ms after SendCommand and a reboot's old
 * boot answers for 200 ms (cheap, so every test meets them); the other lags
 * default to 0 and a test turns on the ones it is about. `listen()` opens a second endpoint (per-service
 * endpoints); `portCalls` says which one each call came in on.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { createServer as createNetServer, type AddressInfo } from "node:net";
import { randomBytes, randomUUID } from "node:crypto";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { EmulatedInstance, type Invocation } from "./instance.js";
import { ec2Action } from "./ec2-api.js";
import { ssmAction } from "./ssm-api.js";

export const DEFAULT_REGION = "us-east-1";

export interface Faults {
  /** Action name -> how many of the next calls lose their reply (after the action took effect). */
  lose: Map<string, number>;
  /** Action name -> how many of the next calls are never answered (nothing happens; the connection stays open until stop). */
  hold: Map<string, number>;
  /** Action name -> how many of the next calls are throttled (nothing happens). */
  throttle: Map<string, number>;
  /** The next SendCommand deliveries wait this long (ms) before running, one entry per command. */
  ssmDelays: number[];
  /** The next SendCommand deliveries are held until `release()`d, one entry per command. */
  ssmHolds: Array<{ release: () => void; held: Promise<void> }>;
  /** The next SendCommand deliveries run twice; the second run this many ms after the first ends. */
  ssmDuplicates: number[];
  /** The next RunInstances calls are refused with these EC2 error codes (InsufficientInstanceCapacity, InstanceLimitExceeded, VcpuLimitExceeded…), one per call; nothing is launched. */
  runRefusals: string[];
  /** Instance types, subnet ids or `type@subnet` pairs with no capacity: RunInstances for them is refused InsufficientInstanceCapacity (HTTP 500, as EC2 answers it). */
  noCapacity: string[];
  /** Instance types, subnet ids or `type@subnet` pairs with no spot capacity: a spot launch there is refused InsufficientInstanceCapacity (on-demand launches are not). */
  noSpotCapacity: string[];
  /** The spot price per instance type (USD per hour): a spot launch whose MaxPrice is lower is refused SpotMaxPriceTooLow. */
  spotPrices: Record<string, string>;
  /** Spot instances the account may run at once (the spot vCPU limit, counted in instances here): one more is refused MaxSpotInstanceCountExceeded. */
  maxSpotInstances: number;
  /** How many RebootInstances calls are answered true and ignored. */
  rebootsIgnored: number;
  bootMs: number;
  /** Instances launched while set boot, but their SSM agent never registers (a private subnet without NAT or SSM endpoints). */
  ssmNeverRegisters: boolean;
  /** Instances launched while set fail `systemctl reload sshd` (and `ssh`). */
  sshdReloadFails: boolean;
  /** Instances launched while set have an sshd_config that does not include /etc/ssh/sshd_config.d (`sshd -T` shows the default AuthorizedKeysFile). */
  sshdIgnoresDropIns: boolean;
  /** Subnet ids whose instances boot but never register their SSM agent (one zone's subnet without a route to SSM). */
  ssmNeverRegistersIn: string[];
  rebootMs: number;
  terminateLagMs: number;
  /** Largest page a paged list call (DescribeInstances with MaxResults, DescribeInstanceStatus, DescribeInstanceInformation, ListCommands) answers; the rest comes with a NextToken. */
  pageSize: number;
  /** Eventual consistency of EC2: for this long after RunInstances a new instance is not listed by DescribeInstances or DescribeInstanceStatus, and a call naming its id answers InvalidInstanceID.NotFound (RunInstances' own ClientToken idempotency sees it at once). */
  describeLagMs: number;
  /** Eventual consistency of SSM: for this long after SendCommand, GetCommandInvocation answers InvocationDoesNotExist. */
  invocationLagMs: number;
  /** The next SendCommand deliveries cannot reach the agent for this long (ms), one entry per command: the invocation is `Delayed` meanwhile, then delivered. */
  ssmDelayed: number[];
  /** After RebootInstances answers, the old boot keeps running (and answering SSM, SSH) this long before it goes down. */
  rebootGraceMs: number;
  /** After CancelCommand, a running invocation stays `Cancelling` this long before its process is killed and it ends `Cancelled`. */
  cancelLagMs: number;
  /** When > 0, the delivery timeout of every command in ms instead of its TimeoutSeconds (whose minimum, 30 s, is longer than a test). */
  deliveryTimeoutMs: number;
  /** When > 0, the execution timeout of every run in ms instead of its executionTimeout parameter (berth asks for 120 s). */
  executionTimeoutMs: number;
  /** The next SendCommand runs take this much longer (ms) on the instance, one entry per command (a slow plugin start or a busy guest). */
  ssmSlowRuns: number[];
  /** Guest step name (the last word of berth's command comment, e.g. install_key) -> every such run takes this much longer (ms). */
  ssmSlowSteps: Record<string, number>;
}

export class AwsEmulator {
  readonly instances = new Map<string, EmulatedInstance>();
  readonly invocations = new Map<string, Invocation & { instanceId: string }>();
  readonly calls: string[] = [];
  /** `region:Action` of every call, in order. */
  readonly regionCalls: string[] = [];
  /** `port Action` of every call, in order: the local port of the listener it came in on (`url`, or one of `listen()`). */
  readonly portCalls: string[] = [];
  /** `Action ErrorCode` of every error the emulator answered (throttling included), in order. */
  readonly errors: string[] = [];
  readonly faults: Faults = { lose: new Map(), hold: new Map(), throttle: new Map(), ssmDelays: [], ssmHolds: [], ssmDuplicates: [], runRefusals: [], noCapacity: [], noSpotCapacity: [], spotPrices: {}, maxSpotInstances: 1000, rebootsIgnored: 0, bootMs: 0, ssmNeverRegisters: false, ssmNeverRegistersIn: [], sshdReloadFails: false, sshdIgnoresDropIns: false, rebootMs: 0, terminateLagMs: 0, pageSize: 1000, describeLagMs: 0, invocationLagMs: 100, ssmDelayed: [], rebootGraceMs: 200, cancelLagMs: 0, deliveryTimeoutMs: 0, executionTimeoutMs: 0, ssmSlowRuns: [], ssmSlowSteps: {} };
  url = "";
  sshPort = 0;
  #server: Server | null = null;
  readonly #more: Server[] = [];
  readonly #held: ServerResponse[] = [];
  readonly #timers = new Set<NodeJS.Timeout>();

  constructor(readonly dir: string) {}

  async start(): Promise<this> {
    this.sshPort = await freePort();
    this.#server = createServer((req, res) => void this.#handle(req, res));
    await new Promise<void>((r) => this.#server!.listen(0, "127.0.0.1", () => r()));
    this.url = `http://127.0.0.1:${(this.#server.address() as AddressInfo).port}`;
    return this;
  }

  /** Another listener for the same emulator (a second endpoint, as a per-service VPC endpoint is); its URL. */
  async listen(): Promise<string> {
    const server = createServer((req, res) => void this.#handle(req, res));
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
    this.#more.push(server);
    return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  }

  async stop(): Promise<void> {
    for (const t of this.#timers) clearTimeout(t);
    for (const res of this.#held) res.destroy();
    for (const s of this.#more) {
      s.closeAllConnections();
      await new Promise<void>((r) => s.close(() => r()));
    }
    for (const h of this.faults.ssmHolds) h.release();
    for (const i of this.instances.values()) await i.halt();
    await new Promise<void>((r) => (this.#server ? this.#server.close(() => r()) : r()));
    this.#server?.closeAllConnections();
  }

  /** Runs `fn` after `ms` (tracked, so stop() cancels it). */
  later(ms: number, fn: () => void | Promise<void>): void {
    const t = setTimeout(() => {
      this.#timers.delete(t);
      void fn();
    }, ms);
    this.#timers.add(t);
  }

  /** Holds the next SendCommand delivery until the returned function is called. */
  holdNextSsm(): () => void {
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    this.faults.ssmHolds.push({ release, held });
    return release;
  }

  live(): EmulatedInstance[] {
    return [...this.instances.values()].filter((i) => i.state !== "terminated");
  }

  /** Instances of one region (each region is its own EC2/SSM namespace, as on AWS). */
  inRegion(region: string): EmulatedInstance[] {
    return [...this.instances.values()].filter((i) => i.region === region);
  }

  newInstance(tags: Record<string, string>, clientToken: string, region = DEFAULT_REGION): EmulatedInstance {
    const id = `i-${randomBytes(8).toString("hex").slice(0, 17)}`;
    const ip = `127.77.${1 + (this.instances.size >> 8)}.${1 + (this.instances.size % 250)}`;
    const inst = new EmulatedInstance(id, tags, clientToken, ip, this.sshPort, this.dir, Date.now());
    inst.region = region;
    inst.visibleAt = Date.now() + this.faults.describeLagMs;
    if (this.faults.sshdReloadFails) writeFileSync(join(inst.root, ".emu/fail-reload"), "");
    if (this.faults.sshdIgnoresDropIns) writeFileSync(join(inst.root, ".emu/no-dropins"), "");
    this.instances.set(id, inst);
    const unregistered = this.faults.ssmNeverRegisters;
    this.later(this.faults.bootMs, async () => {
      if (inst.state !== "pending") return;
      await inst.boot();
      if (unregistered || this.faults.ssmNeverRegistersIn.includes(inst.subnetId)) inst.ssmOnline = false;
      inst.state = "running";
      this.deliverPending(inst);
    });
    return inst;
  }

  /** SSM: commands waiting for an agent that was offline run once it is online. */
  deliverPending(inst: EmulatedInstance): void {
    for (const inv of this.invocations.values()) if (inv.instanceId === inst.id && inv.status === "Pending" && !(inv as { gated?: boolean }).gated) void this.execute(inv, inst);
  }

  /** Listed by DescribeInstances yet (see `describeLagMs`). */
  visible(inst: EmulatedInstance): boolean {
    return Date.now() >= inst.visibleAt;
  }

  async execute(inv: Invocation & { instanceId: string }, inst: EmulatedInstance): Promise<void> {
    if (inv.status !== "Pending" || !inst.ssmOnline) return;
    inv.status = "InProgress";
    const ctl: { kill?: () => void } = {};
    let timedOut = false;
    const limit = setTimeout(() => {
      timedOut = true;
      ctl.kill?.();
    }, this.faults.executionTimeoutMs || (inv.executionTimeoutS ?? 3600) * 1000);
    limit.unref();
    inv.kill = () => ctl.kill?.();
    const r = await inst.run(inv.script, ctl);
    clearTimeout(limit);
    inv.kill = undefined;
    inv.code = r.code;
    inv.stdout = r.stdout;
    inv.stderr = r.stderr;
    // A CancelCommand may have come in while it ran.
    if ((inv.status as Invocation["status"]) === "Cancelling") inv.status = "Cancelled";
    else if (timedOut) [inv.status, inv.details] = ["TimedOut", "ExecutionTimedOut"];
    else inv.status = r.code === 0 ? "Success" : "Failed";
  }

  /**
   * CancelCommand for one invocation: a queued one ends `Cancelled` at once;
   * a running one is `Cancelling` until its process is killed (`cancelLagMs`),
   * then `Cancelled`. Whatever it did before the kill stays done.
   */
  cancel(inv: Invocation & { instanceId: string }): void {
    if (inv.status === "Pending" || inv.status === "Delayed") {
      inv.status = "Cancelled";
      return;
    }
    if (inv.status !== "InProgress") return;
    inv.status = "Cancelling";
    this.later(this.faults.cancelLagMs, () => inv.kill?.());
  }

  /**
   * RebootInstances as EC2 performs it: the call answers first; the old boot
   * goes on running (and answering) for `rebootGraceMs`, then every process
   * dies, and after `rebootMs` a new boot comes up. A request while one is in
   * progress is coalesced into it.
   */
  async reboot(inst: EmulatedInstance): Promise<void> {
    if (inst.rebooting) return;
    inst.rebooting = true;
    const down = async () => {
      await inst.halt();
      this.later(this.faults.rebootMs, async () => {
        if (inst.state === "running") {
          await inst.boot();
          this.deliverPending(inst);
        }
        inst.rebooting = false;
      });
    };
    if (this.faults.rebootGraceMs > 0) this.later(this.faults.rebootGraceMs, down);
    else await down();
  }

  /**
   * A spot interruption: the notice is readable at once (IMDS
   * spot/instance-action, here `interruption` and the file
   * latest/meta-data/spot/instance-action under the instance's root) and
   * `noticeMs` later (two minutes on AWS) the instance is terminated with
   * StateReason Server.SpotInstanceTermination. Only spot instances are
   * interrupted.
   */
  interruptSpot(inst: EmulatedInstance, noticeMs = 120_000): void {
    if (!inst.spot) throw new Error(`emulator: ${inst.id} is not a spot instance`);
    const time = new Date(Date.now() + noticeMs).toISOString().replace(/\.\d{3}Z$/, "Z");
    inst.interruption = { action: "terminate", time };
    mkdirSync(join(inst.root, "latest/meta-data/spot"), { recursive: true });
    writeFileSync(join(inst.root, "latest/meta-data/spot/instance-action"), JSON.stringify(inst.interruption));
    this.later(noticeMs, async () => {
      if (inst.state !== "running" && inst.state !== "pending") return;
      inst.stateReason = { code: "Server.SpotInstanceTermination", message: "Server.SpotInstanceTermination: Spot instance termination" };
      await this.terminate(inst);
    });
  }

  async terminate(inst: EmulatedInstance): Promise<void> {
    if (inst.state === "terminated" || inst.state === "shutting-down") return;
    inst.state = "shutting-down";
    await inst.halt();
    this.later(this.faults.terminateLagMs, () => {
      inst.state = "terminated";
    });
  }

  /** Stopped behind berth's back (the console, another tool, a scheduled event): halted, its disk kept, not running. */
  async stopBehind(inst: EmulatedInstance): Promise<void> {
    if (inst.state !== "running" && inst.state !== "pending") return;
    inst.state = "stopping";
    await inst.halt();
    inst.ssmOnline = false;
    this.later(this.faults.terminateLagMs, () => {
      if (inst.state === "stopping") inst.state = "stopped";
    });
  }

  async #handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const body = Buffer.concat(chunks).toString("utf8");
    const target = req.headers["x-amz-target"];
    const isSsm = typeof target === "string" && target.startsWith("AmazonSSM.");
    const action = isSsm ? target.slice("AmazonSSM.".length) : (new URLSearchParams(body).get("Action") ?? "");
    // The region is the one the SigV4 credential scope names (signatures themselves are not checked).
    const region = /Credential=[^/]+\/\d{8}\/([^/]+)\//.exec(String(req.headers.authorization ?? ""))?.[1] ?? DEFAULT_REGION;
    this.calls.push(action);
    this.regionCalls.push(`${region}:${action}`);
    this.portCalls.push(`${req.socket.localPort} ${action}`);
    if (take(this.faults.hold, action)) {
      this.#held.push(res);
      return;
    }
    if (take(this.faults.throttle, action)) {
      this.errors.push(`${action} ${isSsm ? "ThrottlingException" : "RequestLimitExceeded"}`);
      if (isSsm) return sendJson(res, 400, { __type: "ThrottlingException", message: "Rate exceeded" }, "ThrottlingException");
      return sendXml(res, 503, errorXml("RequestLimitExceeded", "Request limit exceeded."));
    }
    try {
      const reply: { status: number; body: unknown; errorType?: string } = isSsm
        ? await ssmAction(this, action, JSON.parse(body || "{}") as Record<string, unknown>, region)
        : await ec2Action(this, action, new URLSearchParams(body), region);
      if (take(this.faults.lose, action)) {
        // The action took effect; the answer never arrives.
        req.socket.destroy();
        return;
      }
      if (reply.status >= 400) this.errors.push(`${action} ${isSsm ? reply.errorType : (/<Code>([^<]+)<\/Code>/.exec(reply.body as string)?.[1] ?? "?")}`);
      if (isSsm) sendJson(res, reply.status, reply.body, reply.errorType);
      else sendXml(res, reply.status, reply.body as string);
    } catch (e) {
      const msg = e instanceof Error ? e.message : String(e);
      if (isSsm) sendJson(res, 500, { __type: "InternalServerError", message: msg }, "InternalServerError");
      else sendXml(res, 500, errorXml("InternalError", msg));
    }
  }
}

function take(m: Map<string, number>, action: string): boolean {
  const n = m.get(action) ?? 0;
  if (n <= 0) return false;
  m.set(action, n - 1);
  return true;
}

export function errorXml(code: string, message: string): string {
  return `<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>${code}</Code><Message>${esc(message)}</Message></Error></Errors><RequestID>${randomUUID()}</RequestID></Response>`;
}

export function esc(s: string): string {
  return s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
}

function sendXml(res: ServerResponse, status: number, xml: string): void {
  res.writeHead(status, { "content-type": "text/xml;charset=UTF-8", "x-amzn-requestid": randomUUID() });
  res.end(xml);
}

function sendJson(res: ServerResponse, status: number, body: unknown, errorType?: string): void {
  const h: Record<string, string> = { "content-type": "application/x-amz-json-1.1", "x-amzn-requestid": randomUUID() };
  if (errorType) h["x-amzn-errortype"] = errorType;
  res.writeHead(status, h);
  res.end(JSON.stringify(body));
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createNetServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const p = (s.address() as AddressInfo).port;
      s.close(() => resolve(p));
    });
  });
}
