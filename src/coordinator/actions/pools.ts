/**
 * Pool actions: ensure (store desired capacity, then fill in the same
 * transaction), show and list. `ensure` never lowers capacity by cancelling
 * an unexpired claim that already funds provisioning.
 */
import { BerthError } from "../../core/errors.js";
import { CAPACITY_LIMIT, type Access, type PoolIdentity, type PoolRecord, type ProviderName, type CapacityCounts, type Forwarding, type FilesScope } from "../../core/pool.js";
import { missingPortableCapabilities } from "../../providers/provider.js";
import { poolRef, setDue } from "../../store/due.js";
import { countLiveMachines, countMachinesByState, poolTotals } from "../../store/machines.js";
import { insertPoolIfAbsent, listPools as listPoolRecords, lockPool, readPool, updatePool } from "../../store/pools.js";
import { whyShort } from "./exhausted.js";
import type { Ctx } from "../context.js";
import type { Principal } from "../auth.js";
import { fillPool } from "./fill.js";
import { NO_NETWORK, hostAddressRefusal, policyFingerprint, policyRefusal, type NetworkPolicy } from "../../core/network-policy.js";
import { poolMachineNetworks, staleReadyMachineIds, type MachineNetworkRow } from "../../store/machine-network.js";
import { lockMachine } from "../../store/machines.js";
import { applyTransition } from "./transition.js";
import { countCapacity, type IssuedClaim } from "./capacity.js";
import { formatImageRef, imageProvider, parseImageRef } from "../../core/image-ref.js";
import { lastProvisionError, staleImageReadyMachineIds, type ProvisionError } from "../../store/images.js";
import { staleForwardingReadyMachineIds } from "../../store/forwarding.js";
import { staleFilesScopeReadyMachineIds } from "../../store/files-scope.js";
import { countHostsByRuntime, listHosts } from "../../store/hosts.js";
import { closeBreaker, readBreaker, type Breaker } from "../../store/provision-breaker.js";
import { closePlacements, openPlacements, readPlacementBreakers, type PlacementBreaker } from "../../store/placement-breakers.js";
import type { Tx } from "../../store/store.js";

export interface EnsureInput {
  name: string;
  minReady: number;
  maxReady: number;
  compatibilityKey: string;
  access: Access;
  provider: ProviderName;
  identity: PoolIdentity | null;
  hardTtlMs: number;
  heartbeatMs: number;
  keeperKey: string | null;
  /** Network policy of the pool's machines; default `none`. */
  network?: NetworkPolicy;
  /** The image its machines boot (core/image-ref.ts); default null: the host's root. */
  image?: string | null;
  /** Forwards to the machines' own ports; default "on". */
  forwarding?: Forwarding;
  /** Where SFTP reaches on the machines; default "machine". */
  files?: FilesScope;
}

export interface EnsureResult {
  pool: PoolRecord;
  counts: CapacityCounts;
  claims: IssuedClaim[];
  note: string | null;
}

export function checkPortable(ctx: Ctx, providerName: string): void {
  if (!ctx.config.portable) {
    throw new BerthError("portable_unsupported", "portable_unsupported: this coordinator does not have portable access enabled (start it with --portable); no fallback to keeper access is made");
  }
  const provider = ctx.providers.get(providerName);
  const missing = provider ? missingPortableCapabilities(provider.capabilities) : ["provider"];
  if (missing.length > 0) {
    throw new BerthError("portable_unsupported", `portable_unsupported: provider ${providerName} lacks ${missing.join(", ")}; portable pools need exact key install, key revoke, session fencing, destruction evidence and identity observation`);
  }
}

export async function ensurePool(ctx: Ctx, p: Principal, input: EnsureInput): Promise<EnsureResult> {
  if (input.minReady > input.maxReady) throw new BerthError("invalid_request", `invalid_request: minReady (${input.minReady}) is above maxReady (${input.maxReady})`);
  if (input.maxReady > CAPACITY_LIMIT) throw new BerthError("invalid_request", `invalid_request: maxReady is at most ${CAPACITY_LIMIT}`);
  if (!ctx.providers.get(input.provider)) throw new BerthError("invalid_request", `invalid_request: provider ${input.provider} is not configured on this coordinator`);
  if (input.access === "portable") checkPortable(ctx, input.provider);
  const image = checkImage(input);
  const settings = { ...input, network: input.network ?? NO_NETWORK, image, forwarding: input.forwarding ?? "on", files: input.files ?? "machine" };
  if (settings.network.mode === "egress" && input.provider !== "hosts") {
    throw new BerthError("invalid_request", `invalid_request: network egress is enforced by berth agents; provider ${input.provider} cannot enforce it (use --provider hosts, or --network none)`);
  }
  if (image !== null && input.provider === "hosts" && settings.network.mode === "egress") {
    throw new BerthError("invalid_request", `invalid_request: pool ${input.name}: an image machine cannot have network egress in this version (its readiness probe runs the agent's own Node inside the machine, which an image does not have); use --network none`);
  }
  const refused = policyRefusal(settings.network);
  if (refused !== null) throw new BerthError("invalid_request", refused);
  const fingerprint = policyFingerprint(settings.network);
  const now = ctx.now();
  const seed = ctx.randomBytes(32);
  const nonce = Buffer.from(ctx.randomBytes(8)).toString("hex");
  const result = await ctx.store.transaction(async (tx) => {
    // Insert-if-absent first, so concurrent first ensures of one pool serialize on its row.
    if (image !== null && input.provider === "hosts") await checkImageHosts(tx, p.org, input.name);
    if (settings.network.mode === "egress") {
      const addrs = (await listHosts(tx, p.org)).flatMap((h) => [urlHost(h.url), h.ssh_host]);
      const hostRefused = hostAddressRefusal(settings.network, addrs);
      if (hostRefused !== null) throw new BerthError("invalid_request", hostRefused);
    }
    const created = await insertPoolIfAbsent(tx, p.org, input.name, settings, now);
    const existing = await lockPool(tx, p.org, input.name);
    if (!created && existing) {
      if (existing.access !== input.access || existing.provider !== input.provider || existing.compatibilityKey !== input.compatibilityKey) {
        if ((await countLiveMachines(tx, p.org, input.name)) > 0) {
          throw new BerthError(
            "conflict",
            `conflict: pool ${input.name} has live machines as ${existing.access}/${existing.provider}/${existing.compatibilityKey}; drain it before changing access, provider or compatibility key`,
          );
        }
      }
      await updatePool(tx, p.org, input.name, settings, now);
      // The policy is part of compatibility: ready machines of another policy
      // are rotated out (never changed live); lent ones when they come back.
      for (const id of await staleReadyMachineIds(tx, p.org, input.name, fingerprint)) {
        const m = await lockMachine(tx, id);
        if (m && m.state === "ready") await applyTransition(tx, ctx, m, { kind: "drain", reason: `network policy changed to ${fingerprint}` }, now, { nonce: `${nonce}:${id}` });
      }
      // So is the image: ready machines of another image go now, lent ones when they come back (executor.ts).
      for (const id of await staleImageReadyMachineIds(tx, p.org, input.name, image)) {
        const m = await lockMachine(tx, id);
        if (m && m.state === "ready") await applyTransition(tx, ctx, m, { kind: "drain", reason: `image changed to ${image ?? "the host's root"}` }, now, { nonce: `${nonce}:img:${id}` });
      }
      // And the forwarding switch: an agent applies it when it provisions a machine.
      for (const id of await staleForwardingReadyMachineIds(tx, p.org, input.name, settings.forwarding)) {
        const m = await lockMachine(tx, id);
        if (m && m.state === "ready") await applyTransition(tx, ctx, m, { kind: "drain", reason: `forwarding changed to ${settings.forwarding}` }, now, { nonce: `${nonce}:fwd:${id}` });
      }
      // And the files scope, likewise.
      for (const id of await staleFilesScopeReadyMachineIds(tx, p.org, input.name, settings.files)) {
        const m = await lockMachine(tx, id);
        if (m && m.state === "ready") await applyTransition(tx, ctx, m, { kind: "drain", reason: `files scope changed to ${settings.files}` }, now, { nonce: `${nonce}:files:${id}` });
      }
    }
    const pool = (await lockPool(tx, p.org, input.name))!;
    const filled = await fillPool(tx, ctx, pool, now, seed);
    // Keep the reconciler looking at this pool while it is short.
    await setDue(tx, "fill", poolRef(p.org, input.name), now + 1000);
    const counts = await countCapacity(tx, p.org, input.name, now);
    return { pool, counts, claims: filled.issued, note: filled.why };
  }, { name: "ensure" });
  if (result.claims.length > 0) ctx.kick();
  // Claims of a self-provisioning provider are the coordinator's own; their tokens never leave it.
  const provider = ctx.providers.get(input.provider);
  return provider?.capabilities.provision ? { ...result, claims: [] } : result;
}

export async function getPool(
  ctx: Ctx,
  p: Principal,
  name: string,
): Promise<{ pool: PoolRecord; counts: CapacityCounts; states: Record<string, number>; machines: MachineNetworkRow[]; provisionError: ProvisionError | null; breaker: Breaker | null; placementBreakers: PlacementBreaker[]; shortfall: string | null }> {
  const now = ctx.now();
  return ctx.store.transaction(async (tx) => {
    const pool = await readPool(tx, p.org, name);
    if (!pool) throw new BerthError("not_found", `not_found: no pool named ${name} in this organisation`);
    const counts = await countCapacity(tx, p.org, name, now);
    const states: Record<string, number> = {};
    for (const r of await countMachinesByState(tx, p.org, name)) states[r.state] = r.n;
    // Fewer ready than minReady: why (what holds the pool back), for waits that must say so.
    const shortfall = counts.ready < pool.minReady ? await whyShort(tx, pool, counts, Boolean(ctx.providers.get(pool.provider)?.capabilities.provision)) : null;
    return { pool, counts, states, machines: await poolMachineNetworks(tx, p.org, name), provisionError: await lastProvisionError(tx, p.org, name), breaker: await readBreaker(tx, p.org, name), placementBreakers: await readPlacementBreakers(tx, p.org, name), shortfall };
  });
}

/** `berth pool resume`: closes the pool's provisioning breaker and its placement breakers (the operator fixed the cause) and lets it fill now. */
export async function resumePool(ctx: Ctx, p: Principal, name: string): Promise<{ pool: string; resumed: boolean }> {
  const now = ctx.now();
  const had = await ctx.store.transaction(async (tx) => {
    const pool = await lockPool(tx, p.org, name);
    if (!pool) throw new BerthError("not_found", `not_found: no pool named ${name} in this organisation`);
    const b = await readBreaker(tx, p.org, name);
    const placements = await openPlacements(tx, p.org, name, now);
    await closeBreaker(tx, p.org, name);
    await closePlacements(tx, p.org, name);
    await setDue(tx, "fill", poolRef(p.org, name), now);
    return (b !== null && b.openUntil !== null && b.openUntil > now) || placements.length > 0;
  }, { name: "resume" });
  ctx.kick();
  return { pool: name, resumed: had };
}

/**
 * The image of an ensure, canonical, checked against the provider: agents
 * boot OCI images and root directories, the aws provider AMIs, an outside
 * keeper registers machines as they are.
 */
function checkImage(input: EnsureInput): string | null {
  if (input.image === undefined || input.image === null || input.image === "") return null;
  const ref = parseImageRef(input.image);
  const needs = imageProvider(ref);
  if (input.provider === "external") {
    throw new BerthError("invalid_request", `invalid_request: pool ${input.name}: machines of an external keeper are registered as they are; --image needs --provider hosts (or aws for ami:)`);
  }
  if (needs !== input.provider) {
    throw new BerthError(
      "invalid_request",
      needs === "aws"
        ? `invalid_request: pool ${input.name}: ${input.image} is an AMI, which only --provider aws boots`
        : `invalid_request: pool ${input.name}: provider ${input.provider} boots AMIs only (--image ami:ami-…); ${input.image} is booted by berth agents (--provider hosts)`,
    );
  }
  return formatImageRef(ref);
}

/** An image pool of the hosts provider needs a gvisor host; refused where every enrolled host runs the process runtime. */
async function checkImageHosts(tx: Tx, org: string, pool: string): Promise<void> {
  const byRuntime = await countHostsByRuntime(tx, org);
  const total = [...byRuntime.values()].reduce((a, b) => a + b, 0);
  if (total > 0 && (byRuntime.get("gvisor") ?? 0) === 0) {
    throw new BerthError(
      "invalid_request",
      `invalid_request: pool ${pool} names an image, which only the gvisor runtime boots; every enrolled host of this organisation runs the process runtime (its commands run in the host's own root). Enroll a host with berth agent --runtime gvisor`,
    );
  }
}

export async function listPools(ctx: Ctx, p: Principal): Promise<Array<{ pool: PoolRecord; ready: number; total: number }>> {
  return ctx.store.transaction(async (tx) => {
    const pools = await listPoolRecords(tx, p.org);
    const totals = await poolTotals(tx, p.org);
    return pools.map((pool) => ({ pool, ready: totals.get(pool.name)?.ready ?? 0, total: totals.get(pool.name)?.total ?? 0 }));
  });
}

function urlHost(url: string): string {
  try {
    return new URL(url).hostname;
  } catch {
    return "";
  }
}
