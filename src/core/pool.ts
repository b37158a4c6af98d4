/**
 * Pools and desired capacity. A pool is a named set of compatible machines;
 * `fillDecision` is the one capacity rule (invariant 7):
 *   ready + busy + in-cleanup + unexpired fill claims <= maxReady, and a claim
 *   is issued only while ready capacity (counting claims already funding
 *   provisioning) is below minReady.
 */
import type { NetworkPolicy } from "./network-policy.js";

export type Access = "keeper" | "portable";
export type ProviderName = "hosts" | "aws" | "external";

export interface PoolIdentity {
  /** Provider-scoped immutable image id. */
  imageId: string;
  repository?: string;
  cacheKey?: string;
}

export interface PoolRecord {
  org: string;
  name: string;
  access: Access;
  provider: ProviderName;
  compatibilityKey: string;
  identity: PoolIdentity | null;
  minReady: number;
  maxReady: number;
  hardTtlMs: number;
  heartbeatMs: number;
  keeperKey: string | null;
  /** Network policy of its machines (part of compatibility: a change rotates machines). */
  network: NetworkPolicy;
  /** The image its machines boot, canonical (core/image-ref.ts); null: the host's root. Part of compatibility: a change rotates machines. */
  image: string | null;
  /** `ssh -L`/`-W` to the machine's own ports (docs/sessions.md): "off" refuses every forward. Part of compatibility: a change rotates machines. */
  forwarding: Forwarding;
  /** Where SFTP reaches on its machines (docs/files.md): "workspace" confines it. Part of compatibility: a change rotates machines. */
  files: FilesScope;
  createdAt: number;
  updatedAt: number;
}

/** Whether a pool's machines accept forwards to their own ports. */
export type Forwarding = "on" | "off";

/** Where a pool's SFTP sessions may reach: the machine's whole view, or only its workspace. */
export type FilesScope = "machine" | "workspace";

export const CAPACITY_LIMIT = 1000;

export interface CapacityCounts {
  ready: number;
  /** reserved + installing + busy */
  lent: number;
  /** revoking + fencing + scrubbing */
  cleanup: number;
  /** Unexpired, unconsumed fill claims (they fund machines being provisioned). */
  openClaims: number;
}

export type FillDecision = { kind: "issue"; claims: number } | { kind: "hold"; why: string };

export function fillDecision(pool: Pick<PoolRecord, "minReady" | "maxReady">, c: CapacityCounts): FillDecision {
  const total = c.ready + c.lent + c.cleanup + c.openClaims;
  const wantReady = pool.minReady - (c.ready + c.openClaims);
  if (wantReady <= 0) return { kind: "hold", why: "ready capacity (with claims under way) meets minReady" };
  const room = pool.maxReady - total;
  if (room <= 0) return { kind: "hold", why: "maxReady reached" };
  return { kind: "issue", claims: Math.min(wantReady, room) };
}

/** Time before hard TTL at which a ready machine is rotated out and no new borrow is admitted on it. */
export function rotationMarginMs(hardTtlMs: number): number {
  return Math.min(5 * 60_000, Math.floor(hardTtlMs / 10));
}
