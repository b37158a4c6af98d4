/**
 * The nftables ruleset of one machine: one `inet` table per machine in the
 * host's root namespace, hooked at forward (what the machine sends through
 * the host), input (what it sends to the host itself) and NAT postrouting.
 * Pure text, so the rules are read and tested without root.
 *
 * Forward order, first match wins (a verdict ends the chain):
 *   1. replies of established flows pass
 *   2. another source address than the machine's, or IPv6: refused
 *   3. platform hard deny (link-local incl. 169.254.169.254, loopback,
 *      multicast, reserved, the machine range = every other machine,
 *      the coordinator's address:port): refused
 *   4. SMTP (25, 465, 587): refused
 *   5. explicit opens: allow entries inside private ranges, pinned names' addresses, DNS resolvers on 53
 *   6. private ranges: refused
 *   7. the allow list
 *   8. everything else: refused
 * Input: everything from the machine to the host's own addresses is refused
 * (agent API, SSH gateway, a coordinator on this host, any other service).
 * "Refused" is `tcp reset` for TCP and ICMP admin-prohibited otherwise, so a
 * client fails at once instead of waiting for a time-out.
 */
import {
  HARD_DENY_CIDRS,
  PRIVATE_CIDRS,
  SMTP_PORTS,
  isPrivateAllow,
  parseAllowEntry,
  type NetworkPolicy,
} from "../../core/network-policy.js";

export interface RulesetInput {
  table: string;
  hostIf: string;
  guestIp: string;
  policy: NetworkPolicy;
  /** Pinned names -> addresses (resolved at set-up). */
  resolved: Record<string, string[]>;
  /** The whole machine address range (other machines). */
  machineRange: string;
  /** Coordinator (or other) address:port pairs always refused. */
  denyServices: Array<{ ip: string; port: number }>;
}

function portRange(p: [number, number] | null): string {
  if (p === null) return "0-65535";
  return p[0] === p[1] ? String(p[0]) : `${p[0]}-${p[1]}`;
}

function set(name: string, type: string, elements: string[]): string {
  const els = elements.length > 0 ? `\n    elements = { ${elements.join(", ")} }` : "";
  return `  set ${name} {\n    type ${type}\n    flags interval${els}\n  }\n`;
}

/** The table's text for `nft -f`: declare, delete, define again (one atomic transaction, idempotent). */
export function machineRuleset(i: RulesetInput): string {
  if (i.policy.mode !== "egress") throw new Error("a ruleset is only built for an egress policy");
  const explicit: string[] = [];
  const allow: string[] = [];
  for (const e of i.policy.allow.map(parseAllowEntry)) {
    const ports = portRange(e.ports);
    const targets = e.cidr !== null ? [e.cidr] : (i.resolved[e.name as string] ?? []);
    const into = e.cidr === null || isPrivateAllow(e) ? explicit : allow;
    for (const t of targets) for (const proto of ["tcp", "udp"]) into.push(`${t} . ${proto} . ${ports}`);
  }
  for (const r of i.policy.dns) for (const proto of ["tcp", "udp"]) explicit.push(`${r} . ${proto} . 53`);
  const hard = [...HARD_DENY_CIDRS, i.machineRange];
  const svc = i.denyServices.map((s) => `${s.ip} . ${s.port}`);
  const h = JSON.stringify(i.hostIf);
  return [
    `table inet ${i.table} {}`,
    `delete table inet ${i.table}`,
    `table inet ${i.table} {`,
    set("hard_deny", "ipv4_addr", hard),
    set("deny_services", "ipv4_addr . inet_service", svc),
    set("explicit", "ipv4_addr . inet_proto . inet_service", explicit),
    set("private", "ipv4_addr", [...PRIVATE_CIDRS]),
    set("allow", "ipv4_addr . inet_proto . inet_service", allow),
    `  chain refuse {`,
    `    counter`,
    `    meta l4proto tcp reject with tcp reset`,
    `    reject with icmpx admin-prohibited`,
    `  }`,
    `  chain machine_forward {`,
    `    type filter hook forward priority filter; policy accept;`,
    `    iifname ${h} ct state established,related accept`,
    `    iifname ${h} meta nfproto != ipv4 jump refuse`,
    `    iifname ${h} ip saddr != ${i.guestIp} jump refuse`,
    `    iifname ${h} ip daddr @hard_deny jump refuse`,
    `    iifname ${h} ip daddr . tcp dport @deny_services jump refuse`,
    `    iifname ${h} meta l4proto { tcp, udp } th dport { ${SMTP_PORTS.join(", ")} } jump refuse`,
    `    iifname ${h} ip daddr . meta l4proto . th dport @explicit accept`,
    `    iifname ${h} ip daddr @private jump refuse`,
    `    iifname ${h} ip daddr . meta l4proto . th dport @allow accept`,
    `    iifname ${h} jump refuse`,
    `    oifname ${h} ct state new jump refuse`,
    `  }`,
    `  chain machine_input {`,
    `    type filter hook input priority filter; policy accept;`,
    `    iifname ${h} ct state established,related accept`,
    `    iifname ${h} jump refuse`,
    `  }`,
    `  chain machine_nat {`,
    `    type nat hook postrouting priority srcnat; policy accept;`,
    `    ip saddr ${i.guestIp} oifname != ${h} masquerade`,
    `  }`,
    `}`,
    "",
  ].join("\n");
}
