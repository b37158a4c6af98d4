/**
 * The agent's record of each machine's network (table `machine_networks`,
 * migration 5): the intent (names, address slot, policy) written BEFORE
 * anything is created, the exact identity (network namespace inode, host veth ifindex, nftables
 * table handle) written once everything is up, and the last readiness
 * evidence. A record in `releasing` keeps its identity until every object is
 * proven gone; then the row is deleted.
 */
import type { NetworkPolicy } from "../../core/network-policy.js";
import type { ReadinessEvidence, RulesWitness } from "../../core/network-evidence.js";
import type { Statements } from "../../store/sqlite/statements.js";

export type NetState = "intent" | "up" | "releasing";

export interface NetRecord {
  machineId: string;
  state: NetState;
  policy: NetworkPolicy;
  fingerprint: string;
  slot: number | null;
  netns: string;
  hostIf: string;
  table: string;
  netnsInode: string | null;
  hostIfindex: number | null;
  nftHandle: number | null;
  resolved: Record<string, string[]>;
  evidence: ReadinessEvidence | null;
  /** The rules as last loaded by the agent and read back from the kernel (migration 6); null before. */
  rules: RulesWitness | null;
  createdAt: number;
  updatedAt: number;
}

interface Row {
  machine_id: string;
  state: string;
  policy: string;
  fingerprint: string;
  slot: number | null;
  netns: string;
  host_if: string;
  nft_table: string;
  netns_inode: string | null;
  host_ifindex: number | null;
  nft_handle: number | null;
  resolved: string | null;
  evidence: string | null;
  rules: string | null;
  created_at: number;
  updated_at: number;
}

function fromRow(r: Row): NetRecord {
  return {
    machineId: r.machine_id,
    state: r.state as NetState,
    policy: JSON.parse(r.policy) as NetworkPolicy,
    fingerprint: r.fingerprint,
    slot: r.slot,
    netns: r.netns,
    hostIf: r.host_if,
    table: r.nft_table,
    netnsInode: r.netns_inode,
    hostIfindex: r.host_ifindex,
    nftHandle: r.nft_handle,
    resolved: r.resolved ? (JSON.parse(r.resolved) as Record<string, string[]>) : {},
    evidence: r.evidence ? (JSON.parse(r.evidence) as ReadinessEvidence) : null,
    rules: r.rules ? (JSON.parse(r.rules) as RulesWitness) : null,
    createdAt: r.created_at,
    updatedAt: r.updated_at,
  };
}

export class NetworkTable {
  constructor(private readonly q: Statements) {}

  get(machineId: string): NetRecord | null {
    const r = this.q("SELECT * FROM machine_networks WHERE machine_id = ?").get(machineId) as Row | undefined;
    return r ? fromRow(r) : null;
  }

  list(): NetRecord[] {
    return (this.q("SELECT * FROM machine_networks ORDER BY machine_id").all() as Row[]).map(fromRow);
  }

  put(n: NetRecord): void {
    this.q(
      `INSERT INTO machine_networks (machine_id, state, policy, fingerprint, slot, netns, host_if, nft_table, netns_inode, host_ifindex, nft_handle, resolved, evidence, rules, created_at, updated_at)
       VALUES (@machineId, @state, @policy, @fingerprint, @slot, @netns, @hostIf, @table, @netnsInode, @hostIfindex, @nftHandle, @resolved, @evidence, @rules, @createdAt, @updatedAt)
       ON CONFLICT(machine_id) DO UPDATE SET state = excluded.state, policy = excluded.policy, fingerprint = excluded.fingerprint,
         slot = excluded.slot, netns = excluded.netns, host_if = excluded.host_if, nft_table = excluded.nft_table,
         netns_inode = excluded.netns_inode, host_ifindex = excluded.host_ifindex, nft_handle = excluded.nft_handle,
         resolved = excluded.resolved, evidence = excluded.evidence, rules = excluded.rules, updated_at = excluded.updated_at`,
    ).run({
      ...n,
      policy: JSON.stringify(n.policy),
      resolved: JSON.stringify(n.resolved),
      evidence: n.evidence === null ? null : JSON.stringify(n.evidence),
      rules: n.rules === null ? null : JSON.stringify(n.rules),
    });
  }

  delete(machineId: string): void {
    this.q("DELETE FROM machine_networks WHERE machine_id = ?").run(machineId);
  }
}
