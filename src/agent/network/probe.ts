/**
 * The readiness probe: what it checks (a pure plan from the policy and the
 * agent's own addresses), the small program that runs INSIDE the machine
 * (through the runtime's own exec, so it sees exactly what a borrower sees),
 * and the evidence built from its report.
 *
 * Checks:
 *   permit       TCP connect to the policy's probe target (the first allow
 *                entry with a port, or the agent's --network-probe-permit) answers
 *   deny         TCP connects are refused (reset / ICMP), not dropped: the cloud
 *                metadata address, the host (agent API and SSH gateway ports on
 *                the machine's gateway address), the coordinator, extra targets
 *   dns-answer   each allowed resolver answers a UDP query
 *   dns-refused  a resolver the policy does not allow is refused
 *   pinned       each pinned name resolves (hosts file) to its pinned addresses
 */
import { METADATA_ADDRESS, parseAllowEntry, permitsTcp, type NetworkPolicy } from "../../core/network-policy.js";
import type { ProbeCheck, ReadinessEvidence } from "../../core/network-evidence.js";
import type { Runtime } from "../runtime/types.js";

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
  /** Ports of the agent on this host (API, SSH gateway). */
  agentPorts: Array<{ port: number; why: string }>;
  /** Coordinator address:port pairs. */
  coordinator: Array<{ ip: string; port: number }>;
  settings: ProbeSettings;
  machineRange: string;
}

export function probePlan(i: PlanInput): ProbeTarget[] {
  const p = i.policy;
  if (p.mode !== "egress") return [];
  const out: ProbeTarget[] = [];
  const withPort = p.allow.map(parseAllowEntry).find((e) => e.ports !== null);
  if (withPort && withPort.ports) {
    const host = withPort.cidr !== null ? (withPort.cidr.includes("/") ? null : withPort.cidr) : (i.resolved[withPort.name as string]?.[0] ?? null);
    if (host !== null) out.push({ kind: "permit", host, port: withPort.ports[0], why: `allow entry ${withPort.text}` });
  }
  if (!out.some((t) => t.kind === "permit") && i.settings.permit) out.push({ kind: "permit", host: i.settings.permit.host, port: i.settings.permit.port, why: "configured permit target" });
  out.push({ kind: "deny", host: METADATA_ADDRESS, port: 80, why: "cloud metadata" });
  for (const a of i.agentPorts) out.push({ kind: "deny", host: i.gatewayIp, port: a.port, why: a.why });
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
(async () => { for (const t of plan) { const r = t.kind === "pinned" ? await pinned(t) : t.kind.startsWith("dns") ? await udp(t) : await tcp(t);
  process.stdout.write(JSON.stringify({ ...t, ...r }) + "\n"); } })();
`;

function judge(t: ProbeTarget, got: string): boolean {
  switch (t.kind) {
    case "permit":
      return got === "open";
    case "deny":
      return got === "refused" || got === "unreachable";
    case "dns-answer":
      return got === "answered";
    case "dns-refused":
      return got === "refused" || got === "unreachable";
    case "pinned":
      return got === `resolved:${[...(t.expect ?? [])].sort().join(",")}`;
  }
}

/** Reads the program's report into checks; a target without a line fails. */
export function checksFromReport(plan: ProbeTarget[], stdout: string): ProbeCheck[] {
  const lines = new Map<string, { got: string; ms: number }>();
  for (const line of stdout.split("\n")) {
    try {
      const o = JSON.parse(line) as { kind: string; host: string; port: number; got: string; ms: number };
      lines.set(`${o.kind} ${o.host} ${o.port}`, { got: String(o.got), ms: Math.round(Number(o.ms) * 10) / 10 });
    } catch {
      /* not a report line */
    }
  }
  return plan.map((t) => {
    const r = lines.get(`${t.kind} ${t.host} ${t.port}`);
    const target = t.kind === "pinned" ? t.host : `${t.host}:${t.port}`;
    if (!r) return { kind: t.kind, target, why: t.why, got: "no report", ms: 0, ok: false };
    return { kind: t.kind, target, why: t.why, got: r.got, ms: r.ms, ok: judge(t, r.got) };
  });
}

/** Runs the probe inside the machine through the runtime; resolves to its stdout (bounded wait). */
export async function runInside(runtime: Runtime, machineId: string, plan: ProbeTarget[], dnsName: string, nodeBin: string, timeoutMs = 20_000): Promise<string> {
  const h = await runtime.exec(machineId, { argv: [nodeBin, "-e", PROBE_PROGRAM, JSON.stringify(plan), dnsName], env: {} });
  h.stdin.end();
  const chunks: Buffer[] = [];
  const ended = new Promise<void>((r) => {
    h.stdout.on("data", (c: Buffer) => chunks.push(Buffer.from(c)));
    h.stdout.once("end", () => r());
    h.stdout.once("close", () => r());
  });
  h.stderr.resume();
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<"timeout">((r) => (timer = setTimeout(() => r("timeout"), timeoutMs)));
  const done = await Promise.race([Promise.all([h.exited, ended]), timeout]);
  clearTimeout(timer);
  if (done === "timeout") {
    await h.signalGroup("SIGKILL").catch(() => false);
    h.killClient("SIGKILL");
    throw new Error(`the network probe in machine ${machineId} did not finish within ${timeoutMs} ms`);
  }
  return Buffer.concat(chunks).toString("utf8");
}

export function evidenceOf(
  checks: ProbeCheck[],
  meta: { fingerprint: string; generation: number; incarnation: string | null; startedAt: number; now: number; pinned: Record<string, string[]>; error?: string },
): ReadinessEvidence {
  const pass = meta.error === undefined && checks.length > 0 && checks.every((c) => c.ok) && checks.some((c) => c.kind === "deny");
  return {
    result: pass ? "pass" : "fail",
    policyFingerprint: meta.fingerprint,
    generation: meta.generation,
    incarnation: meta.incarnation,
    at: meta.now,
    durationMs: meta.now - meta.startedAt,
    checks,
    pinned: meta.pinned,
    ...(meta.error !== undefined ? { error: meta.error } : {}),
  };
}
