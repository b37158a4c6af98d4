/**
 * The names a machine's policy allows, pinned at set-up: each allow entry's
 * name resolved once to its IPv4 addresses (a name without one refuses the
 * set-up), then written as the namespace's /etc/hosts, beside a resolv.conf
 * naming only the policy's resolvers (iproute2's /etc/netns/<ns>/ convention;
 * gvisor binds the same files).
 */
import { mkdirSync, writeFileSync } from "node:fs";
import { lookup } from "node:dns/promises";
import { join } from "node:path";
import { BerthError } from "../../core/errors.js";
import { parseAllowEntry, type NetworkPolicy } from "../../core/network-policy.js";
import { errorMessage } from "../log.js";

/** Resolves every allow entry's name (default: the host's resolver); name → sorted IPv4 addresses. */
export async function resolveNames(policy: NetworkPolicy, resolve?: (name: string) => Promise<string[]>): Promise<Record<string, string[]>> {
  if (policy.mode !== "egress") return {};
  const out: Record<string, string[]> = {};
  const ask = resolve ?? (async (n: string) => (await lookup(n, { all: true, family: 4 })).map((a) => a.address));
  for (const e of policy.allow.map(parseAllowEntry)) {
    if (e.name === null || out[e.name]) continue;
    let ips: string[];
    try {
      ips = [...new Set(await ask(e.name))].sort();
    } catch (err) {
      throw new BerthError("operation_failed", `operation_failed: allow entry ${e.text}: name ${e.name} could not be resolved (${errorMessage(err)})`);
    }
    if (ips.length === 0) throw new BerthError("operation_failed", `operation_failed: allow entry ${e.text}: name ${e.name} has no IPv4 address`);
    out[e.name] = ips;
  }
  return out;
}

/** The namespace's hosts and resolv.conf under `etc` (/etc/netns). */
export function netnsFiles(etc: string, netns: string): { hosts: string; resolvConf: string } {
  return { hosts: join(etc, netns, "hosts"), resolvConf: join(etc, netns, "resolv.conf") };
}

export function writeNetnsFiles(etc: string, netns: string, policy: NetworkPolicy, resolved: Record<string, string[]>): void {
  if (policy.mode !== "egress") return;
  mkdirSync(join(etc, netns), { recursive: true, mode: 0o755 });
  const f = netnsFiles(etc, netns);
  const hosts = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"];
  for (const [name, ips] of Object.entries(resolved)) for (const ip of ips) hosts.push(`${ip} ${name}`);
  writeFileSync(f.hosts, "# berth: names pinned by the machine's network policy\n" + hosts.join("\n") + "\n", { mode: 0o644 });
  const resolv = policy.dns.length > 0 ? policy.dns.map((d) => `nameserver ${d}`).join("\n") : "# berth: no DNS resolver by policy (pinned names only)\nnameserver 127.0.0.1";
  writeFileSync(f.resolvConf, resolv + "\noptions timeout:1 attempts:1\n", { mode: 0o644 });
}
