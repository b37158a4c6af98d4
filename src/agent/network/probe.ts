/**
 * The readiness probe: what it checks (a pure plan from the policy and the
 * agent's own addresses), the small program that runs INSIDE the machine
 * (through the runtime's own exec, so it sees exactly what a borrower sees),
 * and the evidence built from its report.
 *
 * Checks:
 *   permit       TCP connect to the policy's probe target (the first allow
 *                entry with a port the deny list leaves open, or the agent's
 *                configured permit target) answers; none without one
 *   deny         TCP connects are refused by the machine's own rules: the client
 *                sees a reset or ICMP admin-prohibited AND the table's refuse
 *                chain counts the packet during that check (its witness). Targets:
 *                the cloud metadata address, the agent's canary listener on the
 *                host, the agent's API and SSH gateway where they listen (a
 *                listener bound to loopback cannot be routed to and is not
 *                probed), the coordinator, extra targets
 *   dns-answer   each allowed resolver answers a UDP query
 *   dns-refused  a resolver the policy does not allow is refused (with its witness)
 *   pinned       each pinned name resolves (hosts file) to its pinned addresses
 * The program runs one check per line it reads on stdin, so the host reads
 * the counter between checks.
 */
import { METADATA_ADDRESS, parseAllowEntry, permitsTcp, type NetworkPolicy } from "../../core/network-policy.js";
import type { ProbeCheck, ReadinessEvidence, RulesWitness } from "../../core/network-evidence.js";
import type { Runtime } from "../runtime/types.js";
import type { Readable } from "node:stream";

export interface ProbeTarget {
  kind: "permit" | "deny" | "dns-answer" | "dns-refused" | "pinned";
  host: string;
  port: number;
  why: string;
  /** pinned: the addresses the name must resolve to. */
  expect?: string[];
}

export interface ProbeSettings {
  /** Extra TCP targets that must be refused (host:port), e.g. a test server outside the policy. */
  deny?: Array<{ host: string; port: number; why: string }>;
  /** The permit target when the policy has no allow entry with a port. */
  permit?: { host: string; port: number } | null;
  /** Resolvers that must be refused when the policy does not allow them (default: the host's own). */
  refusedResolvers?: string[];
  /** Name queried in DNS checks. */
  dnsName?: string;
}

export interface PlanInput {
  policy: NetworkPolicy;
  resolved: Record<string, string[]>;
  /** The machine's gateway: the host's end of its veth. */
  gatewayIp: string;
  /** The agent's listeners on this host (API, SSH gateway): the address each is bound to and its port. */
  agentPorts: Array<{ host: string; port: number; why: string }>;
  /** The agent's canary: a listener on every host address, so a refusal of it is told apart from "nothing listening". */
  canaryPort: number | null;
  /** Coordinator address:port pairs. */
  coordinator: Array<{ ip: string; port: number }>;
  settings: ProbeSettings;
  machineRange: string;
}

export function probePlan(i: PlanInput): ProbeTarget[] {
  const p = i.policy;
  if (p.mode !== "egress") return [];
  const out: ProbeTarget[] = [];
  // The permit target: an allow entry with a port that the deny list leaves open (never one the platform
  // always refuses, e.g. SMTP), or the operator's configured target; else no permit check.
  for (const e of p.allow.map(parseAllowEntry)) {
    if (e.ports === null) continue;
    const host = e.cidr !== null ? (e.cidr.includes("/") ? null : e.cidr) : (i.resolved[e.name as string]?.[0] ?? null);
    if (host === null) continue;
    const port = [e.ports[0], e.ports[1]].find((x) => permitsTcp(p, host, x, i.resolved, [i.machineRange]));
    if (port === undefined) continue;
    out.push({ kind: "permit", host, port, why: `allow entry ${e.text}` });
    break;
  }
  if (!out.some((t) => t.kind === "permit") && i.settings.permit) out.push({ kind: "permit", host: i.settings.permit.host, port: i.settings.permit.port, why: "configured permit target" });
  out.push({ kind: "deny", host: METADATA_ADDRESS, port: 80, why: "cloud metadata" });
  if (i.canaryPort !== null) out.push({ kind: "deny", host: i.gatewayIp, port: i.canaryPort, why: "the agent's canary listener (host)" });
  for (const a of i.agentPorts) {
    // A listener on a loopback address cannot be reached from a machine's namespace by routing: nothing to probe.
    if (a.host.startsWith("127.") || a.host === "::1" || a.host === "localhost") continue;
    const wildcard = a.host === "0.0.0.0" || a.host === "::" || a.host === "";
    out.push({ kind: "deny", host: wildcard ? i.gatewayIp : a.host, port: a.port, why: a.why });
  }
  for (const c of i.coordinator) out.push({ kind: "deny", host: c.ip, port: c.port, why: "coordinator" });
  for (const d of i.settings.deny ?? []) {
    if (!permitsTcp(p, d.host, d.port, i.resolved, [i.machineRange])) out.push({ kind: "deny", host: d.host, port: d.port, why: d.why });
  }
  for (const r of p.dns) out.push({ kind: "dns-answer", host: r, port: 53, why: "allowed resolver" });
  for (const r of i.settings.refusedResolvers ?? []) {
    if (!p.dns.includes(r) && !permitsTcp(p, r, 53, i.resolved, [i.machineRange])) out.push({ kind: "dns-refused", host: r, port: 53, why: "resolver outside the policy" });
  }
  for (const [name, ips] of Object.entries(i.resolved)) out.push({ kind: "pinned", host: name, port: 0, why: "pinned name", expect: ips });
  return out;
}

/**
 * The program run inside the machine (`node -e PROBE_PROGRAM PLAN_JSON DNS_NAME`):
 * one JSON line per check on stdout. Bounded: every check gives up after 2 s.
 */
export const PROBE_PROGRAM = String.raw`
const net = require("net"), dgram = require("dgram"), dns = require("dns");
const plan = JSON.parse(process.argv[1]); const qname = process.argv[2] || "berth-probe.invalid";
const LIMIT = 2000;
function tcp(t) { return new Promise((res) => { const t0 = process.hrtime.bigint(); const ms = () => Number(process.hrtime.bigint() - t0) / 1e6;
  const s = net.connect({ host: t.host, port: t.port }); const timer = setTimeout(() => { s.destroy(); res({ got: "timeout", ms: ms() }); }, LIMIT);
  s.on("connect", () => { clearTimeout(timer); const m = ms(); s.destroy(); res({ got: "open", ms: m }); });
  s.on("error", (e) => { clearTimeout(timer); const m = ms(); res({ got: e.code === "ECONNREFUSED" ? "refused" : (e.code === "EHOSTUNREACH" || e.code === "ENETUNREACH" || e.code === "EACCES" || e.code === "EPERM") ? "unreachable" : "error:" + e.code, ms: m }); }); }); }
function query() { const labels = qname.split(".").filter(Boolean); const parts = [Buffer.from([0x42, 0x42, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0])];
  for (const l of labels) { parts.push(Buffer.from([l.length])); parts.push(Buffer.from(l)); } parts.push(Buffer.from([0, 0, 1, 0, 1])); return Buffer.concat(parts); }
function udp(t) { return new Promise((res) => { const t0 = process.hrtime.bigint(); const ms = () => Number(process.hrtime.bigint() - t0) / 1e6;
  const s = dgram.createSocket("udp4"); let done = false; const fin = (got) => { if (done) return; done = true; clearTimeout(timer); const m = ms(); try { s.close(); } catch {} res({ got, ms: m }); };
  const timer = setTimeout(() => fin("timeout"), LIMIT);
  s.on("message", () => fin("answered")); s.on("error", (e) => fin(e.code === "ECONNREFUSED" ? "refused" : (e.code === "EHOSTUNREACH" || e.code === "ENETUNREACH" || e.code === "EPERM") ? "unreachable" : "error:" + e.code));
  s.connect(t.port, t.host, (err) => { if (err) return fin("error:" + err.code); s.send(query(), (e2) => { if (e2) fin(e2.code === "ECONNREFUSED" ? "refused" : (e2.code === "EHOSTUNREACH" || e2.code === "ENETUNREACH" || e2.code === "EPERM") ? "unreachable" : "error:" + e2.code); }); }); }); }
function pinned(t) { return new Promise((res) => { const t0 = Date.now(); dns.lookup(t.host, { all: true, family: 4 }, (e, addrs) => {
  res({ got: e ? "error:" + e.code : "resolved:" + addrs.map((a) => a.address).sort().join(","), ms: Date.now() - t0 }); }); }); }
const rl = require("readline").createInterface({ input: process.stdin });
rl.on("line", async (line) => { const i = Number(line); const t = plan[i]; if (!t) return;
  const r = t.kind === "pinned" ? await pinned(t) : t.kind.startsWith("dns") ? await udp(t) : await tcp(t);
  process.stdout.write(JSON.stringify({ ...t, ...r, i }) + "\n"); });
rl.on("close", () => process.exit(0));
`;

/** What a check saw, and for a refusal check the rule's own witness. */
export interface StepReport {
  got: string;
  ms: number;
  /** Packets the machine's refuse chain counted during this check (refusal checks); null: not read. */
  refusals: number | null;
}

function isRefusal(t: ProbeTarget): boolean {
  return t.kind === "deny" || t.kind === "dns-refused";
}

/**
 * A refusal check passes only when the client saw a refusal (TCP reset or
 * ICMP admin-prohibited) AND the machine's own refuse chain counted a packet
 * during that check: a reset from a closed port, a missing table or a rule
 * that let the packet through elsewhere all leave the counter where it was.
 */
function judge(t: ProbeTarget, r: StepReport): boolean {
  switch (t.kind) {
    case "permit":
      return r.got === "open";
    case "deny":
    case "dns-refused":
      return (r.got === "refused" || r.got === "unreachable") && r.refusals !== null && r.refusals >= 1;
    case "dns-answer":
      return r.got === "answered";
    case "pinned":
      return r.got === `resolved:${[...(t.expect ?? [])].sort().join(",")}`;
  }
}

/** Reads the steps' reports into checks; a target without a report fails. */
export function checksFromSteps(plan: ProbeTarget[], steps: Array<StepReport | null>): ProbeCheck[] {
  return plan.map((t, i) => {
    const r = steps[i] ?? null;
    const target = t.kind === "pinned" ? t.host : `${t.host}:${t.port}`;
    if (!r) return { kind: t.kind, target, why: t.why, got: "no report", ms: 0, ok: false };
    const witness = isRefusal(t) ? { witness: r.refusals === null ? "refuse counter unreadable" : `refuse counter +${r.refusals}` } : {};
    return { kind: t.kind, target, why: t.why, got: r.got, ms: Math.round(r.ms * 10) / 10, ok: judge(t, r), ...witness };
  });
}

/**
 * Runs the probe inside the machine through the runtime, one check at a
 * time: the refuse chain's counter is read before and after each refusal
 * check (`refusals`), so each check carries its own witness. Bounded wait.
 */
export async function runInside(
  runtime: Runtime, machineId: string, plan: ProbeTarget[], dnsName: string, nodeBin: string,
  refuseCounter: () => Promise<number | null>, timeoutMs = 20_000,
): Promise<Array<StepReport | null>> {
  const h = await runtime.exec(machineId, { argv: [nodeBin, "-e", PROBE_PROGRAM, JSON.stringify(plan), dnsName], env: {} });
  // The probe's stderr, kept (bounded) to say why when it ends before answering every step.
  let stderr = "";
  h.stderr.on("data", (c: Buffer) => {
    if (stderr.length < 2048) stderr += c.toString("utf8");
  });
  const reader = new LineReader(h.stdout, Date.now() + timeoutMs);
  const out: Array<StepReport | null> = [];
  let timedOut = false;
  let endedEarly = false;
  try {
    for (let i = 0; i < plan.length; i++) {
      const t = plan[i] as ProbeTarget;
      const before = isRefusal(t) ? await refuseCounter() : null;
      h.stdin.write(`${i}\n`);
      const line = await reader.next();
      if (line === null) {
        timedOut = !reader.ended;
        endedEarly = reader.ended;
        break;
      }
      const after = isRefusal(t) ? await refuseCounter() : null;
      out.push(stepOf(line, i, before, after));
    }
  } finally {
    h.stdin.end();
  }
  if (timedOut) {
    await h.signalGroup("SIGKILL").catch(() => false);
    h.killClient("SIGKILL");
    throw new Error(`the network probe in machine ${machineId} did not finish within ${timeoutMs} ms`);
  }
  const status = await Promise.race([h.exited, new Promise<null>((r) => setTimeout(() => r(null), 2_000))]);
  if (endedEarly) {
    const how = status === null ? "still running" : status.signal ? `killed by ${status.signal}` : `exit ${status.code}`;
    throw new Error(`the network probe in machine ${machineId} ended its output after ${out.length} of ${plan.length} steps (${how}): ${stderr.trim().slice(-400) || "no stderr"}`);
  }
  return out;
}

/** One probe answer line as a step report; null when it is not the answer to step `i`. */
function stepOf(line: string, i: number, before: number | null, after: number | null): StepReport | null {
  let o: { got?: unknown; ms?: unknown; i?: unknown };
  try {
    o = JSON.parse(line) as typeof o;
  } catch {
    return null;
  }
  if (Number(o.i) !== i) return null;
  return { got: String(o.got), ms: Number(o.ms), refusals: before !== null && after !== null ? after - before : null };
}

/** The probe's output, a line at a time, each wait bounded by one deadline. */
class LineReader {
  /** The output ended. */
  ended = false;
  #buf = "";
  readonly #lines: string[] = [];
  #waiting: ((line: string | null) => void) | null = null;

  constructor(
    stdout: Readable,
    private readonly deadline: number,
  ) {
    stdout.on("data", (c: Buffer) => {
      this.#buf += c.toString("utf8");
      let i: number;
      while ((i = this.#buf.indexOf("\n")) >= 0) {
        this.#lines.push(this.#buf.slice(0, i));
        this.#buf = this.#buf.slice(i + 1);
      }
      this.#deliver();
    });
    const end = (): void => {
      this.ended = true;
      this.#deliver();
    };
    stdout.once("end", end);
    stdout.once("close", end);
  }

  /** The next line; null at the end of the output or at the deadline. */
  next(): Promise<string | null> {
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.#waiting = null;
        resolve(null);
      }, Math.max(0, this.deadline - Date.now()));
      this.#waiting = (l) => {
        clearTimeout(timer);
        resolve(l);
      };
      this.#deliver();
    });
  }

  #deliver(): void {
    if (!this.#waiting) return;
    const w = this.#waiting;
    if (this.#lines.length > 0) {
      this.#waiting = null;
      w(this.#lines.shift() as string);
    } else if (this.ended) {
      this.#waiting = null;
      w(null);
    }
  }
}

export function evidenceOf(
  checks: ProbeCheck[],
  meta: {
    fingerprint: string; generation: number; incarnation: string | null; startedAt: number; now: number; pinned: Record<string, string[]>; error?: string;
    rules?: RulesWitness;
  },
): ReadinessEvidence {
  const pass = meta.error === undefined && meta.rules !== undefined && checks.length > 0 && checks.every((c) => c.ok) && checks.some((c) => c.kind === "deny");
  return {
    result: pass ? "pass" : "fail",
    policyFingerprint: meta.fingerprint,
    generation: meta.generation,
    incarnation: meta.incarnation,
    at: meta.now,
    durationMs: meta.now - meta.startedAt,
    checks,
    pinned: meta.pinned,
    ...(meta.rules !== undefined ? { rules: meta.rules } : {}),
    ...(meta.error !== undefined ? { error: meta.error } : {}),
  };
}
