/** API shapes of stored records: camelCase, no hashes, no internal columns. */
import { identityFingerprint } from "../../core/host-identity.js";
import type { PoolRecord } from "../../core/pool.js";
import { policyFingerprint } from "../../core/network-policy.js";
import { evidenceSummary, type ReadinessEvidence } from "../../core/network-evidence.js";
import type { MachineNetworkRow } from "../../store/machine-network.js";
import type { BorrowRow } from "../../store/borrows.js";
import { runtimeDetailOf, type HostRow } from "../../store/hosts.js";

export function presentPool(p: PoolRecord) {
  return {
    name: p.name,
    access: p.access,
    provider: p.provider,
    compatibilityKey: p.compatibilityKey,
    identity: p.identity,
    minReady: p.minReady,
    maxReady: p.maxReady,
    hardTtlMs: p.hardTtlMs,
    heartbeatMs: p.heartbeatMs,
    keeperKey: p.keeperKey !== null,
    network: { ...p.network, fingerprint: policyFingerprint(p.network) },
    image: p.image,
    forwarding: p.forwarding,
    files: p.files,
  };
}

/** A machine's network: the policy it was made for and its last readiness evidence. */
export function presentMachineNetwork(r: MachineNetworkRow) {
  const e = r.network_evidence ? (JSON.parse(r.network_evidence) as ReadinessEvidence) : null;
  return {
    id: r.id,
    state: r.state,
    generation: r.generation,
    policyFingerprint: r.network_fingerprint ?? "none",
    evidence: e ? evidenceSummary(e) : null,
  };
}

export function presentBorrow(b: BorrowRow & { machine_state: string | null }) {
  return {
    id: b.id,
    access: "keeper",
    pool: b.pool,
    machineId: b.machine_id,
    machineState: b.machine_state,
    state: b.state,
    generation: b.generation,
    createdAt: b.created_at,
    heartbeatDeadline: b.heartbeat_deadline,
    expiresAt: b.expires_at,
    endedAt: b.ended_at,
    reason: b.reason,
  };
}

export function presentHost(h: HostRow) {
  const detail = runtimeDetailOf(h);
  return {
    id: h.id,
    name: h.name,
    url: h.url,
    runtime: h.runtime,
    /** gvisor: the runsc release and the platform its sandboxes use (null: not reported, or the process runtime). */
    runsc: detail?.runsc ?? null,
    runtimeWarning: detail?.warning ?? null,
    capacity: { vcpu: h.vcpu, memoryMib: h.memory_mb, memoryMb: h.memory_mb, diskMib: h.disk_mib === null || h.disk_mib === undefined ? null : Number(h.disk_mib), slots: h.slots },
    usedSlots: h.used_slots,
    ssh: { host: h.ssh_host, port: h.ssh_port, fingerprint: h.fingerprint },
    enrolledAt: h.enrolled_at,
    identity: {
      state: h.identity_state,
      keyFingerprint: h.identity_key ? identityFingerprint(h.identity_key) : h.pending_identity_key ? identityFingerprint(h.pending_identity_key) : null,
      since: h.identity_since,
      agentStep: h.agent_step,
      owedReports: h.owed_reports,
      agentVersion: h.agent_version,
    },
  };
}
