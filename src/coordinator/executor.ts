/**
 * The operation executor: carries out durable provider operations outside
 * any store transaction.
 *
 *   1. start (one transaction): the op row is `pending` (or `running` with an
 *      expired lease, i.e. its coordinator died); lease it (`leaseOp`: mark
 *      it `running`, count the attempt, push its due row to the lease end).
 *      A crash from here on leaves a due row that another coordinator (or
 *      this one, restarted) picks up, and the retried call carries the same
 *      op id, so the agent returns its first result instead of acting twice.
 *   2. call the provider (no transaction open).
 *   3. complete (one transaction): record the outcome and apply the machine
 *      transition it proves, only if the machine is still at the operation's
 *      generation. A late completion for an older generation changes nothing.
 *
 * Ambiguous outcomes (timeouts, lost replies) are retried with the same id to
 * learn what happened; after the attempts run out, a machine whose cleanup
 * could not be proven is quarantined (then destroyed), never made ready.
 *
 * What a proof means for grants and registration is not decided here: the
 * executor receives those steps as `deps` (wired in server.ts), so it imports
 * neither the grant code nor registration, and the grant code can run an
 * operation it leased itself (the ack) through `execute`.
 */
import type { Ctx } from "./context.js";
import type { Tx } from "../store/store.js";
import { backoffMs } from "../store/store.js";
import { audit } from "../store/audit.js";
import { clearDue, poolRef, setDue, setDueNoLater } from "../store/due.js";
import { expireClaim, lockClaim } from "../store/claims.js";
import { lockMachine, setIncarnation, type MachineRow } from "../store/machines.js";
import { forwardingOf } from "../store/forwarding.js";
import { filesScopeOf } from "../store/files-scope.js";
import { failOp, finishOp, leaseHeld, leaseOp, lockOp, OP_LEASE_MS, retryOpAt, type OpRow } from "../store/operations.js";
import { releaseHostSlot } from "../store/hosts.js";
import type { OperationEvidence, OperationOutcome, Placement } from "../providers/provider.js";
import { parseOpRowArgs, readinessEvidenceSchema, type OpRowCall } from "../protocol/operations.js";
import { applyTransition } from "./actions/transition.js";
import { readinessVerdict, type ReadinessEvidence, type ReadinessVerdict } from "../core/network-evidence.js";
import { policyFingerprint } from "../core/network-policy.js";
import { setMachineEvidence } from "../store/machine-network.js";
import { readPool } from "../store/pools.js";
import type { PoolRecord } from "../core/pool.js";
import { closeBreaker } from "../store/provision-breaker.js";
import { closePlacement, openPlacements } from "../store/placement-breakers.js";
import { countProvisionGiveUp } from "./breakers.js";

/** Attempts before a failed or unprovable operation is given up (destroy is retried for as long as it takes). */
export const OP_MAX_ATTEMPTS = 6;

/** An operation leased by this coordinator, with its machine as the lease found it. */
export interface StartedOp {
  op: OpRow;
  machine: MachineRow;
  /** provision of a self-placed provider: the pool's placements whose breaker is open as the lease was taken. */
  avoidPlacements?: string[];
}

/** Where a provisioned machine can be reached, as its provider proved it. */
export interface ProvisionedMachine {
  incarnation: string;
  sshHost: string;
  sshPort: number;
  hostKey: string;
}

/** A machine's cleanup step that keeps its grant in step. */
export type CleanupStep = "revoked" | "fenced" | "closed";

export interface ExecutorDeps {
  ctx: Ctx;
  /** The grant bookkeeping that operation proofs drive (actions/grants.ts). */
  grants: {
    /** install_key proved done: activate the grant for exactly the op's generation, or handle a late install. */
    installConfirmed(tx: Tx, op: OpRow, m: MachineRow, now: number, nonce: string): Promise<boolean>;
    /** install_key could not be proven: invalidate the grant (its machine is cleaned up or quarantined). */
    installFailed(tx: Tx, op: OpRow, m: MachineRow, now: number, nonce: string, error: string): Promise<void>;
    /** A cleanup step of a machine was proven at `generation`. */
    cleanupStep(tx: Tx, machineId: string, generation: number, step: CleanupStep, now: number): Promise<void>;
    /** A cleanup step could not be proven (counted; the executor quarantines the machine). */
    cleanupFailed(tx: Tx, m: MachineRow, kind: string): void;
    /** The machine is destroyed: close every grant it still has. */
    machineDestroyed(tx: Tx, machineId: string, now: number): Promise<void>;
  };
  /** A provisioned machine becomes ready if its fill claim still funds it (actions/register.ts). */
  registerProvisioned(tx: Tx, m: MachineRow, found: ProvisionedMachine, now: number): Promise<{ ok: true } | { ok: false; why: string }>;
}

export class OperationExecutor {
  readonly #deps: ExecutorDeps;
  /** Operation id -> throttled outcomes in a row (in memory: a restart only resets the backoff). */
  readonly #throttled = new Map<string, number>();

  constructor(deps: ExecutorDeps) {
    this.#deps = deps;
  }

  /** Step 1, inside the reconciler's transaction for the op's due row. */
  async start(tx: Tx, opId: string, now: number): Promise<StartedOp | null> {
    const { ctx } = this.#deps;
    const op = await lockOp(tx, opId);
    if (!op || op.state === "done" || op.state === "failed") {
      await clearDue(tx, "op", opId);
      return null;
    }
    if (leaseHeld(op, now)) {
      await setDue(tx, "op", opId, op.updated_at + OP_LEASE_MS);
      return null;
    }
    let machine = await lockMachine(tx, op.machine_id);
    if (!machine) {
      await failOp(tx, opId, "machine record is gone", now);
      return null;
    }
    if (op.kind === "destroy" && (machine.state === "quarantined" || machine.state === "draining")) {
      machine = (await applyTransition(tx, ctx, machine, { kind: "destroy_started" }, now, { nonce: op.id })).machine;
    }
    const avoidPlacements = op.kind === "provision" && ctx.providers.get(machine.provider)?.selfPlaced ? await openPlacements(tx, machine.org, machine.pool, now) : undefined;
    return { op: await leaseOp(tx, opId, now), machine, avoidPlacements };
  }

  /**
   * Step 2 + 3: call the provider, then record what it proved. `read`, when
   * given, runs inside the recording transaction after the record (a caller
   * answering from the state it produced needs no transaction of its own);
   * its result is returned. The reconciler is woken unless the record
   * settled everything (an install that activated its grant).
   */
  async execute<T = void>(started: StartedOp, read?: (tx: Tx) => Promise<T>): Promise<T | undefined> {
    const { ctx } = this.#deps;
    const { op, machine, avoidPlacements } = started;
    const provider = ctx.providers.get(machine.provider);
    let outcome: OperationOutcome;
    const call = rowCall(op);
    if ("error" in call) {
      // A row whose arguments do not match the contract is never sent; retrying cannot change it.
      outcome = { kind: "failed", error: call.error, retryable: false };
    } else if (!provider) {
      outcome = { kind: "failed", error: `provider ${machine.provider} is not configured`, retryable: true };
    } else {
      try {
        outcome = await provider.run({ ...call, opId: op.id, machine, generation: op.generation, ...(avoidPlacements?.length ? { avoidPlacements } : {}) });
      } catch (e) {
        outcome = { kind: "ambiguous", error: e instanceof Error ? e.message : String(e) };
      }
    }
    ctx.metrics.operations.inc({ kind: op.kind, outcome: outcome.kind });
    const seedNonce = Buffer.from(ctx.randomBytes(8)).toString("hex");
    const r = await ctx.store.transaction(
      async (tx) => {
        const settled = await this.#complete(tx, op, outcome, ctx.now(), seedNonce);
        return { settled, value: read ? await read(tx) : undefined };
      },
      { name: "complete-op" },
    );
    if (!r.settled) ctx.kick();
    return r.value;
  }

  /** Records an outcome; true when nothing follows from it (no operation, retry or cleanup to run). */
  async #complete(tx: Tx, op: OpRow, outcome: OperationOutcome, now: number, nonce: string): Promise<boolean> {
    const current = await lockOp(tx, op.id);
    // Another coordinator (after our lease ran out) may have completed it: its record stands.
    if (!current || current.state !== "running" || current.attempts !== op.attempts) return false;
    const m = await lockMachine(tx, op.machine_id);
    const { ctx } = this.#deps;
    if (outcome.kind !== "done") {
      // Destruction is retried for as long as it takes, even after a refusal: its
      // record is the only trace of a machine that may still exist, and a
      // machine left `destroying` with no operation would never be looked at again.
      if (outcome.kind === "ambiguous" && outcome.throttled) {
        // Throttled: nothing is known to be wrong with the machine. Not counted as an attempt;
        // retried after a jittered backoff that grows with the run of throttled calls.
        if (this.#throttled.size > 10_000) this.#throttled.clear(); // ops completed by another coordinator leave entries
        const streak = (this.#throttled.get(op.id) ?? 0) + 1;
        this.#throttled.set(op.id, streak);
        const delay = Math.round(Math.min(backoffMs(Math.min(streak, 10)) * ctx.config.opRetryUnitMs, 60_000));
        await retryOpAt(tx, op.id, outcome.error, now, now + delay, { uncount: true });
        return false;
      }
      this.#throttled.delete(op.id);
      const retryable = outcome.kind === "ambiguous" || outcome.retryable || op.kind === "destroy";
      if (retryable && (op.attempts < OP_MAX_ATTEMPTS || op.kind === "destroy")) {
        const delay = Math.round(Math.min(backoffMs(op.attempts) * ctx.config.opRetryUnitMs, 60_000)); // whole ms: PostgreSQL columns are BIGINT
        await retryOpAt(tx, op.id, outcome.error, now, now + delay);
        return false;
      }
      await failOp(tx, op.id, outcome.error, now);
      if (m) await this.#onGiveUp(tx, op, m, outcome.error, now, nonce, outcome.placement);
      return false;
    }
    this.#throttled.delete(op.id);
    await finishOp(tx, op.id, outcome.result, now);
    if (!m) return false;
    if (op.kind === "install_key" && m.generation === op.generation) {
      if (typeof outcome.result.incarnation === "string") await setIncarnation(tx, m.id, outcome.result.incarnation);
      // Activation is the grant code's: it revalidates the grant for exactly this generation.
      return this.#deps.grants.installConfirmed(tx, op, m, now, nonce);
    }
    await this.#onDone(tx, op, m, outcome.result, now, nonce);
    return false;
  }

  /** A proven outcome: a destroy, a provision, or a cleanup step of exactly the op's generation. */
  async #onDone(tx: Tx, op: OpRow, m: MachineRow, result: OperationEvidence, now: number, nonce: string): Promise<void> {
    const { ctx } = this.#deps;
    if (op.kind === "destroy") return this.#onDestroyed(tx, m, now, nonce);
    if (op.kind === "provision") return this.#onProvisioned(tx, op, m, result, now, nonce);
    // Everything below proves a step for exactly the op's generation. A late
    // completion for an older generation is recorded on the op and changes nothing.
    if (m.generation !== op.generation) {
      await audit(tx, { at: now, machineId: m.id, subject: op.id, event: `late_${op.kind}`, from: m.state, to: m.state, generation: m.generation, actor: ctx.actor });
      return;
    }
    if (typeof result.incarnation === "string") await setIncarnation(tx, m.id, result.incarnation);
    switch (op.kind) {
      case "remove_key":
        if (m.state === "revoking") await this.#cleanupStep(tx, m, "revoked", now, nonce);
        return;
      case "fence":
        if (m.state === "fencing") await this.#cleanupStep(tx, m, "fenced", now, nonce);
        return;
      case "scrub":
        if (m.state === "scrubbing") await this.#onScrubbed(tx, m, result, now, nonce);
        return;
      case "install_key":
        return; // the current generation's install is recorded by #complete
    }
  }

  /** The destroy is proven: the machine, its grants and its host slot are done with; the pool looks again. */
  async #onDestroyed(tx: Tx, m: MachineRow, now: number, nonce: string): Promise<void> {
    const { ctx, grants } = this.#deps;
    if (m.state !== "destroying") return;
    await applyTransition(tx, ctx, m, { kind: "destroyed" }, now, { nonce });
    await grants.machineDestroyed(tx, m.id, now);
    if (m.host_id) await releaseHostSlot(tx, m.host_id);
    await setDue(tx, "retention", `m:${m.id}`, now + ctx.config.retentionMs);
    await setDueNoLater(tx, "fill", poolRef(m.org, m.pool), now);
  }

  /**
   * The provider made a machine: it is registered (ready) only with passing
   * network evidence, for the pool's settings as they are now, and while its
   * claim still funds it; otherwise it is drained and its claim expired.
   */
  async #onProvisioned(tx: Tx, op: OpRow, m: MachineRow, result: OperationEvidence, now: number, nonce: string): Promise<void> {
    const { ctx } = this.#deps;
    const found = provisionedMachine(result);
    const provisioning = m.state === "provisioning";
    const net = provisioning ? await this.#network(tx, m, result, 0) : ({ kind: "ready" } as const);
    // The pool's image (or forwarding, or files scope) changed while this machine was being made for the old one: never lent, replaced.
    const stale = provisioning ? provisionedForOldPool(m, await readPool(tx, m.org, m.pool)) : null;
    const r =
      net.kind !== "ready"
        ? { ok: false as const, why: net.why }
        : stale !== null
          ? { ok: false as const, why: stale }
          : found
            ? await this.#deps.registerProvisioned(tx, m, found, now)
            : { ok: false as const, why: "the provider's proof lacks the machine's incarnation or SSH address" };
    if (net.kind === "quarantine") ctx.metrics.machineQuarantined(m, "network_probe_failed", now);
    // The provider launched and proved a machine: the pool's provisioning works, its breakers close.
    if (found) await closeBreaker(tx, m.org, m.pool);
    if (found && typeof result.placement === "string") await closePlacement(tx, m.org, m.pool, result.placement);
    if (r.ok || !provisioning) return;
    const d = await applyTransition(tx, ctx, m, { kind: "drain", reason: `not registered: ${r.why}` }, now, { nonce });
    if (d.opIds.length === 0) await audit(tx, { at: now, machineId: m.id, subject: op.id, event: "unregistered", from: "provisioning", to: d.machine.state, generation: m.generation, actor: ctx.actor });
    // Its claim will never fund a ready machine: expire it now (not at its TTL, while it
    // still counts as capacity on its way), and let the pool look again.
    await expireOpenClaim(tx, m);
    await setDueNoLater(tx, "fill", poolRef(m.org, m.pool), now);
  }

  /** A key removal or fence proven: the machine and its grant move one step on. */
  async #cleanupStep(tx: Tx, m: MachineRow, step: "revoked" | "fenced", now: number, nonce: string): Promise<void> {
    const { ctx, grants } = this.#deps;
    await applyTransition(tx, ctx, m, step === "revoked" ? { kind: "revoked" } : { kind: "fenced" }, now, { nonce });
    await grants.cleanupStep(tx, m.id, m.generation, step, now);
  }

  /**
   * The scrub proven: ready again only with passing network evidence for this
   * generation (docs/network.md), and rotated out when the pool's settings
   * changed while it was lent (replaced, never changed live).
   */
  async #onScrubbed(tx: Tx, m: MachineRow, result: OperationEvidence, now: number, nonce: string): Promise<void> {
    const { ctx, grants } = this.#deps;
    const net = await this.#network(tx, m, result, m.generation);
    if (net.kind === "quarantine") {
      ctx.metrics.machineQuarantined(m, "network_probe_failed", now);
      grants.cleanupFailed(tx, m, "network_probe");
      await applyTransition(tx, ctx, m, { kind: "quarantine", reason: net.why }, now, { nonce });
      return;
    }
    const back = await applyTransition(tx, ctx, m, { kind: "scrubbed" }, now, { nonce });
    await grants.cleanupStep(tx, m.id, m.generation, "closed", now);
    const pool = await readPool(tx, m.org, m.pool);
    const image = pool?.image ?? null;
    const forwarding = pool?.forwarding ?? "on";
    const files = pool?.files ?? "machine";
    const rotate =
      net.kind === "rotate" ? net.why
      : (m.image ?? null) !== image ? `image changed to ${image ?? "the host's root"}`
      : forwardingOf(m) !== forwarding ? `forwarding changed to ${forwarding}`
      : filesScopeOf(m) !== files ? `files scope changed to ${files}`
      : null;
    if (rotate !== null) await applyTransition(tx, ctx, back.machine, { kind: "drain", reason: rotate }, now, { nonce: `${nonce}:rotate` });
    // Back in the ready queue: let the reconciler check the pool is not above its capacity.
    await setDueNoLater(tx, "fill", poolRef(m.org, m.pool), now);
  }

  /**
   * The network verdict of a provision or scrub result: records the evidence
   * on the machine and counts it. A machine of a pool with a policy becomes
   * ready only with passing evidence for its policy and generation; a policy
   * changed meanwhile rotates it out.
   */
  async #network(tx: Tx, m: MachineRow, result: OperationEvidence, generation: number): Promise<ReadinessVerdict> {
    const pool = await readPool(tx, m.org, m.pool);
    const current = pool ? policyFingerprint(pool.network) : "none";
    const expected = m.network_fingerprint ?? "none";
    // Absent or off the contract: no evidence (a machine with a policy is then not ready).
    const read = result.network === undefined ? null : readinessEvidenceSchema.safeParse(result.network);
    const evidence: ReadinessEvidence | null = read?.success ? read.data : null;
    if (evidence) await setMachineEvidence(tx, m.id, evidence);
    if (expected !== "none") {
      const outcome = evidence ? evidence.result : "missing";
      tx.afterCommit(() => this.#deps.ctx.metrics.networkProbes.inc({ pool: m.pool, outcome }));
    }
    return readinessVerdict(expected, current, generation, evidence);
  }

  async #onGiveUp(tx: Tx, op: OpRow, m: MachineRow, error: string, now: number, nonce: string, placement?: Placement): Promise<void> {
    const { ctx, grants } = this.#deps;
    if (op.kind === "provision") {
      if (m.state === "provisioning") await applyTransition(tx, ctx, m, { kind: "drain", reason: `provisioning failed: ${error}` }, now, { nonce });
      tx.afterCommit(() => ctx.metrics.history.provision(m.org, m.pool, now, "failed"));
      // Failing capacity stops itself: after N provisions given up in a row a pool of a
      // self-placed provider (cloud instances: each attempt is paid for) stops launching for a while.
      if (!ctx.providers.get(m.provider)?.selfPlaced) return;
      // Its claim will never fund a ready machine: expired now, so the pool replaces it at once
      // (the breaker, not the claim's TTL, is what stops a pool whose launches keep failing).
      await expireOpenClaim(tx, m);
      await setDueNoLater(tx, "fill", poolRef(m.org, m.pool), now);
      await countProvisionGiveUp(tx, ctx, op.id, m, error, placement, now);
      return;
    }
    if (m.generation !== op.generation && op.kind !== "destroy") return;
    if (op.kind === "install_key") return grants.installFailed(tx, op, m, now, nonce, error);
    if (m.state === "quarantined" || m.state === "draining" || m.state === "destroying" || m.state === "destroyed") return;
    ctx.metrics.machineQuarantined(m, `${op.kind}_failed`, now);
    grants.cleanupFailed(tx, m, op.kind);
    await applyTransition(tx, ctx, m, { kind: "quarantine", reason: `${op.kind} could not be proven: ${error}` }, now, { nonce });
  }
}

/** The operation row's kind and arguments, parsed by the contract (protocol/operations.ts), or why they do not parse. */
function rowCall(op: OpRow): OpRowCall | { error: string } {
  try {
    return parseOpRowArgs(op.kind, op.args);
  } catch (e) {
    return { error: e instanceof Error ? e.message : String(e) };
  }
}

/** A machine's fill claim, expired (and its due row cleared) if still open. */
async function expireOpenClaim(tx: Tx, m: MachineRow): Promise<void> {
  const claim = m.claim_id ? await lockClaim(tx, m.claim_id) : undefined;
  if (claim && claim.state === "open") {
    await expireClaim(tx, claim.id);
    await clearDue(tx, "claim", claim.id);
  }
}

/** Why a machine just provisioned no longer fits its pool (image, forwarding or files scope changed meanwhile), or null. */
function provisionedForOldPool(m: MachineRow, pool: PoolRecord | undefined): string | null {
  const image = pool?.image ?? null;
  const forwarding = pool?.forwarding ?? "on";
  const files = pool?.files ?? "machine";
  if ((m.image ?? null) !== image) return `the pool's image changed to ${image ?? "the host's root"} while it was provisioned for ${m.image ?? "the host's root"}`;
  if (forwardingOf(m) !== forwarding) return `the pool's forwarding changed to ${forwarding} while it was provisioned with ${forwardingOf(m)}`;
  if (filesScopeOf(m) !== files) return `the pool's files scope changed to ${files} while it was provisioned with ${filesScopeOf(m)}`;
  return null;
}

/** The address a provision proved, or null when its evidence lacks any part of it. */
function provisionedMachine(e: OperationEvidence): ProvisionedMachine | null {
  const { incarnation, sshHost, sshPort, hostKey } = e;
  if (typeof incarnation !== "string" || sshHost === undefined || sshPort === undefined || hostKey === undefined) return null;
  return { incarnation, sshHost, sshPort, hostKey };
}
