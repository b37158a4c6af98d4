/**
 * Agent operations: provision, install_key, remove_key, fence, scrub, destroy
 * (the contract, shared with the coordinator, is src/protocol/operations.ts).
 *
 * Protocol, per request `{opId, kind, machineId, generation, args}`:
 *   1. A known opId with a different kind, machine, generation or arguments
 *      is refused (`conflict`). A known opId that is `done` returns its first
 *      result, byte for byte, and acts on nothing.
 *   2. Preconditions (machine state, generation) are checked; a refusal
 *      changes nothing and is not recorded, so a retry is refused the same way
 *      (generations only grow).
 *   3. The operation row is written `started` BEFORE anything acts (for
 *      provision, together with the machine's `creating` record), so a crash
 *      leaves a durable trace that recovery reads as "mid-operation".
 *   4. The action runs (runtime calls outside any transaction).
 *   5. The state change and the result are committed in ONE transaction,
 *      and only then is the reply sent: a lost reply is answered again from
 *      the record by the coordinator's retry, never by acting a second time.
 *   A failure marks the row `failed`; a retry with the same opId runs it
 *   again (every runtime method is idempotent on the machine id), since no
 *   result was ever given out.
 *
 * Operations on one machine run one at a time (a per-machine queue).
 *
 * Generations: the agent keeps each machine's current generation. An
 * operation below it is refused (`generation_mismatch`); one above it
 * advances it, removing every grant key of an older generation (keeper keys,
 * the keeper pool's long-lived access, stay until removed). A key removal is
 * never a fence: only `fence` closes sessions and restarts the machine's
 * processes (new incarnation), and proves none of the old ones remain.
 */
import { BerthError, assertNever } from "../core/errors.js";
import { parseId, type Id } from "../core/ids.js";
import {
  OPERATION_KINDS,
  isAllocKind,
  hashNormalizedArgs,
  normalizeArgs,
  type DestroyResult,
  type FenceResult,
  type InstallKeyResult,
  type KeySelector,
  type NormalizedArgs,
  type OperationKind,
  type OperationResponse,
  type OperationResult,
  type ProvisionResult,
  type RemoveKeyResult,
  type ScrubResult,
} from "../protocol/operations.js";
import type { SessionRegistry } from "./contracts.js";
import { KeyedLock } from "./keyed-lock.js";
import { supersededAt, type AgentKeys } from "./keys.js";
import { errorMessage, type AgentLog } from "./log.js";
import type { CreateOptions, Runtime } from "./runtime/types.js";
import type { AgentStore, MachineRecord, OpRecord, StoredKey } from "./store.js";
import type { MachineNetworks } from "./network/manager.js";
import type { NetworkPolicy } from "../core/network-policy.js";
import type { ReadinessEvidence } from "../core/network-evidence.js";
import type { ImageCache } from "./images/cache.js";
import { processRefusesImages } from "./runtime/process.js";

export type OpKind = OperationKind;

export interface OpRequest {
  opId: string;
  kind: OpKind;
  machineId: string;
  generation: number;
  args?: unknown;
}

export type OpResponse = OperationResponse;
type Normalized = NormalizedArgs;

export interface AgentOpsDeps {
  /** The durable record of machines, keys and operation results. */
  store: AgentStore;
  /** The key authority the SSH gateway consults. */
  keys: AgentKeys;
  /** The sandbox runtime that creates, fences, scrubs and destroys machines. */
  runtime: Runtime;
  /** The gateway's sessions: cut them, count them. */
  sessions: SessionRegistry;
  /** The clock (epoch ms). */
  now: () => number;
  log: AgentLog;
  /** Machine networks (network policy `egress`); null where this host cannot enforce one (why). */
  network?: MachineNetworks | { unavailable: string } | null;
  /** The image cache that pulls and unpacks the images machines boot (images/cache.ts); absent: no images here. */
  images?: ImageCache | null;
}

/** Who runs the allocation operations (src/agent/allocations.ts), once attached. */
export interface AllocOpsRunner {
  run(req: OpRequest & { kind: "alloc_hold" | "alloc_launch" | "alloc_release" }): Promise<OpResponse>;
  /** What an allocation's sandbox is started with (its size), by machine id; undefined for pool machines. */
  createOptions(machineId: string): CreateOptions | undefined;
}

export class AgentOps {
  #allocations: AllocOpsRunner | null = null;

  /** Routes alloc_hold / alloc_launch / alloc_release to the allocation operations (they run provision, install_key and destroy through this class). */
  attachAllocations(a: AllocOpsRunner): void {
    this.#allocations = a;
  }

  readonly #deps: AgentOpsDeps;
  /** One operation at a time per machine. */
  readonly #perMachine = new KeyedLock();

  constructor(deps: AgentOpsDeps) {
    this.#deps = deps;
  }

  /** Runs (or answers again) one operation. Refusals and failures throw BerthError. */
  async run(req: OpRequest): Promise<OpResponse> {
    const opId = parseId(req.opId, "opId");
    const machineId = parseId(req.machineId, "machineId");
    const kind = req.kind;
    if (!OPERATION_KINDS.includes(kind)) {
      throw new BerthError("invalid_request", `invalid_request: unknown operation kind ${JSON.stringify(String(kind)).slice(0, 40)}; use one of ${OPERATION_KINDS.join(", ")}`);
    }
    const generation = req.generation;
    if (!Number.isSafeInteger(generation) || generation < 0) {
      throw new BerthError("invalid_request", "invalid_request: generation must be a non-negative integer");
    }
    if (isAllocKind(kind)) {
      if (this.#allocations === null) throw new BerthError("invalid_request", `invalid_request: this agent does not run allocations (${kind})`);
      return this.#allocations.run({ ...req, kind });
    }
    const args = normalizeArgs(kind, req.args);
    const argsHash = hashNormalizedArgs(args);
    return this.#perMachine.run(machineId, () => this.#execute(opId, kind, machineId, generation, args, argsHash));
  }

  async #execute(
    opId: Id,
    kind: OpKind,
    machineId: Id,
    generation: number,
    args: Normalized,
    argsHash: string,
  ): Promise<OpResponse> {
    const { store } = this.#deps;
    const existing = store.getOp(opId);
    if (existing !== null) {
      if (
        existing.kind !== kind ||
        existing.machineId !== machineId ||
        existing.generation !== generation ||
        existing.argsHash !== argsHash
      ) {
        throw new BerthError(
          "conflict",
          `conflict: operation ${opId} was already used for ${existing.kind} of machine ${existing.machineId} at generation ${existing.generation} with other arguments; use a new operation id`,
        );
      }
      if (existing.status === "done") return respond(existing);
    }

    const machine = store.getMachine(machineId);
    this.#checkPreconditions(opId, kind, machineId, generation, machine);

    // An install is one local transaction (the key, the machine record and the
    // result together), so its operation row is written in that transaction:
    // a crash before the commit leaves nothing installed and nothing recorded,
    // and a retry runs it afresh. One durable write instead of two.
    const intent = existing === null && kind === "install_key" ? { opId, kind, machineId, generation, argsHash } : null;
    try {
      if (existing === null && intent === null) {
        store.transaction(() => {
          store.insertOp({ opId, kind, machineId, generation, argsHash, now: this.#deps.now() });
          if (kind === "provision" && machine === null) {
            // The intent record, before the runtime creates anything: after a
            // crash, "no record" means "never ours".
            const now = this.#deps.now();
            store.putMachine({
              id: machineId, generation, state: "creating", incarnation: null, workspace: null,
              identity: null, mismatch: null, createdAt: now, updatedAt: now,
            });
          }
        });
      } else {
        store.markOpStarted(opId);
      }
    } catch (e) {
      if ((e as { code?: unknown }).code === "SQLITE_CONSTRAINT_PRIMARYKEY") {
        throw new BerthError("conflict", `conflict: operation ${opId} is already in use; use a new operation id`);
      }
      throw e;
    }

    try {
      const ctx: OpContext = { opId, machineId, generation, intent };
      await this.#act(ctx, args);
      // The reply is read back from the record, so a first answer and a
      // retried one are the same bytes.
      const done = store.getOp(opId);
      if (done === null || done.status !== "done") throw new Error(`operation ${opId} finished without its result recorded`);
      this.#deps.log.info({ opId, kind, machineId, generation }, "operation done");
      return respond(done);
    } catch (e) {
      if (intent !== null && (e as { code?: unknown }).code === "SQLITE_CONSTRAINT_PRIMARYKEY") {
        throw new BerthError("conflict", `conflict: operation ${opId} is already in use; use a new operation id`);
      }
      const msg = errorMessage(e);
      try {
        store.failOp(opId, msg, this.#deps.now());
      } catch (e2) {
        this.#deps.log.error({ opId, error: errorMessage(e2) }, "could not record an operation failure");
      }
      this.#deps.log.warn({ opId, kind, machineId, generation, error: msg }, "operation failed");
      if (e instanceof BerthError) throw e;
      throw new BerthError(
        "operation_failed",
        `operation_failed: ${kind} of machine ${machineId} (operation ${opId}) failed: ${msg}; retry with the same operation id`,
      );
    }
  }

  #checkPreconditions(opId: Id, kind: OpKind, machineId: Id, generation: number, m: MachineRecord | null): void {
    if (m === null) {
      if (kind === "provision" || kind === "destroy") return;
      throw new BerthError("not_found", `not_found: machine ${machineId} is not on this host; provision it first`);
    }
    if (generation < m.generation) {
      throw new BerthError(
        "generation_mismatch",
        `generation_mismatch: operation ${opId} (${kind}) carries generation ${generation} of machine ${machineId}, which is at generation ${m.generation}; nothing was changed`,
      );
    }
    switch (m.state) {
      case "running":
        return;
      case "creating":
        if (kind === "provision" || kind === "destroy") return;
        throw new BerthError("conflict", `conflict: machine ${machineId} is still being created; finish its provision operation first`);
      case "destroying":
        if (kind === "destroy") return;
        throw new BerthError("conflict", `conflict: machine ${machineId} is being destroyed; only destroy can finish it`);
      case "destroyed":
        if (kind === "destroy") return;
        throw new BerthError("conflict", `conflict: machine ${machineId} was destroyed; use a new machine id`);
      case "mismatch":
        if (kind === "destroy" && m.mismatch?.startsWith("missing")) return;
        throw new BerthError(
          "conflict",
          `conflict: machine ${machineId} does not match its record (${m.mismatch ?? "unknown"}); the agent will not touch it; an operator must inspect it`,
        );
      default:
        assertNever(m.state, "machine state");
    }
  }

  async #act(ctx: OpContext, args: Normalized): Promise<OperationResult> {
    switch (args.kind) {
      case "provision":
        return this.#provision(ctx, args.network ?? null, args.image ?? null);
      case "install_key":
        return this.#installKey(ctx, args);
      case "remove_key":
        return this.#removeKey(ctx, args.which);
      case "fence":
        return this.#fence(ctx);
      case "scrub":
        return this.#scrub(ctx);
      case "destroy":
        return this.#destroy(ctx);
      case "alloc_hold":
      case "alloc_launch":
      case "alloc_release":
        throw new Error(`${args.kind} is run by the allocation operations, not here`);
      default:
        return assertNever(args, "operation");
    }
  }

  /** The machine's record, which the preconditions proved exists. */
  #machine(id: string): MachineRecord {
    const m = this.#deps.store.getMachine(id);
    if (m === null) throw new Error(`machine ${id} has no record`);
    return m;
  }

  /** Commits `m` (generation possibly advanced) and the result, in one transaction, with the keys' change. */
  #commit(ctx: OpContext, m: MachineRecord, result: OperationResult): () => void {
    return () => {
      const now = this.#deps.now();
      if (ctx.intent) this.#deps.store.insertOp({ ...ctx.intent, now });
      this.#deps.store.putMachine({ ...m, generation: Math.max(m.generation, ctx.generation), updatedAt: now });
      this.#deps.store.finishOp(ctx.opId, result, now);
    };
  }

  /** The machine networks, or a refusal naming why this host cannot enforce a policy. */
  #networks(): MachineNetworks {
    const n = this.#deps.network;
    if (n === undefined || n === null || "unavailable" in n) {
      const why = n && "unavailable" in n ? n.unavailable : "network policies are not enabled on this agent";
      throw new BerthError("provider_unavailable", `provider_unavailable: this host cannot enforce a network policy: ${why}`);
    }
    return n;
  }

  /** The machine's network, when it has one (a record exists). */
  #networkOf(machineId: string): MachineNetworks | null {
    const n = this.#deps.network;
    if (n === undefined || n === null || "unavailable" in n) return null;
    return n.get(machineId) ? n : null;
  }

  async #provision(ctx: OpContext, policy: NetworkPolicy | null, image: string | null): Promise<ProvisionResult> {
    const { runtime, store, keys } = this.#deps;
    const before = this.#machine(ctx.machineId);
    const existed = before.state === "running";
    let createOpts: CreateOptions = { ...this.#allocations?.createOptions(ctx.machineId) };
    // The image first: a bad or unreachable one fails the provision before
    // anything of the machine exists (cache.ts verifies it whole).
    if (image !== null) {
      if (runtime.kind === "process") throw processRefusesImages(image);
      const images = this.#deps.images;
      if (!images) throw new BerthError("provider_unavailable", `provider_unavailable: this agent has no image cache; it cannot boot ${image}`);
      createOpts = { ...createOpts, image: await images.ensure(image) };
    }
    // The network next (intent, then exact identity), so no process of the
    // machine ever runs outside its namespace.
    let net: MachineNetworks | null = null;
    if (policy !== null && policy.mode === "egress") {
      net = this.#networks();
      const rec = await net.setUp(ctx.machineId, policy);
      createOpts = { ...createOpts, network: { netns: rec.netns, inode: rec.netnsInode as string, ...net.files(rec.netns) } };
    }
    const rm = await runtime.create(ctx.machineId, createOpts);
    const evidence: ReadinessEvidence | null = net ? await net.probe(ctx.machineId, runtime, ctx.generation) : null;
    const img = createOpts.image;
    const result: ProvisionResult = {
      incarnation: rm.incarnation, runtime: runtime.kind, existed,
      ...(evidence ? { network: evidence } : {}),
      ...(img ? { image: { ref: img.ref, id: img.id, digest: img.digest } } : {}),
    };
    const m: MachineRecord = {
      ...before,
      state: "running",
      incarnation: rm.incarnation,
      workspace: rm.workspace,
      identity: rm.identity,
      mismatch: null,
    };
    const generation = Math.max(before.generation, ctx.generation);
    if (keys.generationOf(ctx.machineId) === undefined) {
      store.transaction(this.#commit(ctx, m, result));
      keys.attach(ctx.machineId, generation);
    } else {
      keys.advance(ctx.machineId, generation, this.#commit(ctx, m, result));
    }
    return result;
  }

  async #installKey(
    ctx: OpContext,
    a: Extract<Normalized, { kind: "install_key" }>,
  ): Promise<InstallKeyResult> {
    const { store, keys } = this.#deps;
    const now = this.#deps.now();
    if (a.expiresAt !== null && now >= a.expiresAt) {
      throw new BerthError(
        "grant_expired",
        `grant_expired: the key for grant ${a.grantId} expired at ${new Date(a.expiresAt).toISOString()}; it was not installed; borrow again`,
      );
    }
    if (store.wasRemoved(ctx.machineId, ctx.generation, a.grantId, a.fingerprint)) {
      throw new BerthError(
        "conflict",
        `conflict: the key of grant ${a.grantId} was already removed from machine ${ctx.machineId} at generation ${ctx.generation}; a removed key is never installed again`,
      );
    }
    this.#attachIfNeeded(ctx.machineId);
    const m = this.#machine(ctx.machineId);
    const key: StoredKey = {
      machineId: ctx.machineId,
      fingerprint: a.fingerprint,
      publicKey: a.publicKey,
      generation: ctx.generation,
      mode: a.mode,
      grantId: a.grantId,
      expiresAt: a.expiresAt,
      installedAt: now,
    };
    const result: InstallKeyResult = {
      fingerprint: a.fingerprint,
      grantId: a.grantId,
      mode: a.mode,
      expiresAt: a.expiresAt,
      superseded: [],
    };
    const superseded = this.#deps.store.listKeys(ctx.machineId).filter((k) => supersededAt(k, ctx.generation));
    result.superseded = superseded.map((k) => k.fingerprint);
    keys.install(key, this.#commit(ctx, m, result));
    return result;
  }

  async #removeKey(ctx: OpContext, which: KeySelector): Promise<RemoveKeyResult> {
    const { keys, sessions, store } = this.#deps;
    this.#attachIfNeeded(ctx.machineId);
    const m = this.#machine(ctx.machineId);
    const current = keys.generationOf(ctx.machineId) ?? m.generation;
    if (ctx.generation > current) keys.advance(ctx.machineId, ctx.generation);
    // Durable first (key deleted, removal remembered); the listeners (the
    // gateway) cut the sessions admitted with the key as it leaves the index.
    const removed = keys.remove(ctx.machineId, which, ctx.generation);
    // With no key left, every open session of the machine was admitted with a
    // key that is gone: close them all and count them. With other keys left,
    // the revocation listeners cut only this key's sessions.
    const left = keys.list(ctx.machineId).length;
    const sessionsClosed = left === 0 ? await sessions.closeMachine(ctx.machineId, `key removed (operation ${ctx.opId})`) : 0;
    const result: RemoveKeyResult = {
      removed: removed.map((k) => ({ fingerprint: k.fingerprint, grantId: k.grantId })),
      keysRemaining: left,
      sessionsClosed,
      sessionsRemaining: sessions.count(ctx.machineId),
    };
    store.transaction(this.#commit(ctx, this.#machine(ctx.machineId), result));
    return result;
  }

  async #fence(ctx: OpContext): Promise<FenceResult> {
    const { runtime, sessions, store, keys } = this.#deps;
    const m = this.#machine(ctx.machineId);
    if (ctx.generation > m.generation) keys.advance(ctx.machineId, ctx.generation);
    const sessionsClosed = await sessions.closeMachine(ctx.machineId, `fence (operation ${ctx.opId})`);
    // The fence proves absence itself or throws (FenceProof.remaining); what is
    // left to check is that the machine is there, at the incarnation it reports.
    const proof = await runtime.fence(ctx.machineId);
    if ((await runtime.incarnation(ctx.machineId)) !== proof.incarnation) {
      throw new Error(`the runtime no longer has machine ${ctx.machineId} at incarnation ${proof.incarnation} after the fence`);
    }
    if (m.incarnation !== null && proof.incarnation === m.incarnation) {
      throw new Error(`the fence of machine ${ctx.machineId} did not change its incarnation (${proof.incarnation})`);
    }
    const result: FenceResult = {
      incarnationBefore: m.incarnation,
      incarnationAfter: proof.incarnation,
      sessionsClosed,
      processesRemaining: proof.remaining,
      evidence: proof.evidence,
    };
    const after: MachineRecord = { ...this.#machine(ctx.machineId), incarnation: proof.incarnation, mismatch: null };
    store.transaction(this.#commit(ctx, after, result));
    this.#attachIfNeeded(ctx.machineId);
    this.#sweepSessions();
    return result;
  }

  /** After a fence or destroy every process of the machine is gone: retained session records can be cleaned (in the background; a failure only leaves them for the next sweep). */
  #sweepSessions(): void {
    const sweep = this.#deps.sessions.sweep;
    if (!sweep) return;
    sweep.call(this.#deps.sessions).catch((e: unknown) => this.#deps.log.warn({ error: errorMessage(e) }, "session record sweep failed; retried after the next fence"));
  }

  async #scrub(ctx: OpContext): Promise<ScrubResult> {
    const { runtime, store, keys } = this.#deps;
    const m = this.#machine(ctx.machineId);
    if (ctx.generation > m.generation) keys.advance(ctx.machineId, ctx.generation);
    await runtime.scrub(ctx.machineId);
    // gVisor's scrub may restart the sandbox (a new incarnation): record what
    // the runtime's own record says now, so the next start recognises the
    // machine (no count: scrub comes after a fence).
    const incarnation = await runtime.incarnation(ctx.machineId);
    const seen = incarnation !== null ? { exists: true, incarnation } : await runtime.inspect(ctx.machineId);
    if (!seen.exists) throw new Error(`the runtime no longer has machine ${ctx.machineId} after the scrub`);
    // Before it may be ready again: the rules exactly the policy's, then the probe from inside.
    const net = this.#networkOf(ctx.machineId);
    let evidence: ReadinessEvidence | null = null;
    if (net) {
      await net.reapply(ctx.machineId);
      evidence = await net.probe(ctx.machineId, runtime, ctx.generation);
    }
    const result: ScrubResult = { incarnationBefore: m.incarnation, incarnation: seen.incarnation, scrubbed: true, ...(evidence ? { network: evidence } : {}) };
    store.transaction(this.#commit(ctx, { ...this.#machine(ctx.machineId), incarnation: seen.incarnation }, result));
    return result;
  }

  async #destroy(ctx: OpContext): Promise<DestroyResult> {
    const { runtime, sessions, store, keys } = this.#deps;
    const now = this.#deps.now();
    const m = store.getMachine(ctx.machineId);
    if (m === null || m.state === "destroyed") {
      await this.#networkOf(ctx.machineId)?.tearDown(ctx.machineId);
      // Never created here (or already gone): record it destroyed, so a
      // delayed provision for this id can never bring it back.
      const result: DestroyResult = {
        existed: false, incarnationBefore: m?.incarnation ?? null, sessionsClosed: 0, keysRemoved: 0, processesRemaining: 0,
      };
      const rec: MachineRecord = m ?? {
        id: ctx.machineId, generation: ctx.generation, state: "destroyed", incarnation: null, workspace: null,
        identity: null, mismatch: null, createdAt: now, updatedAt: now,
      };
      store.transaction(this.#commit(ctx, { ...rec, state: "destroyed" }, result));
      return result;
    }
    // Access goes first, durably: no key authenticates from here on.
    const dropped = keys.drop(ctx.machineId, () => {
      store.putMachine({ ...m, state: "destroying", generation: Math.max(m.generation, ctx.generation), updatedAt: now });
    });
    const sessionsClosed = await sessions.closeMachine(ctx.machineId, `destroy (operation ${ctx.opId})`);
    await runtime.destroy(ctx.machineId);
    const seen = await runtime.inspect(ctx.machineId);
    if (seen.exists || seen.liveProcesses > 0) {
      throw new Error(`machine ${ctx.machineId} still exists after destroy (${seen.liveProcesses} processes)`);
    }
    // No process of the machine is left: its network goes, in order (manager.ts).
    await this.#networkOf(ctx.machineId)?.tearDown(ctx.machineId);
    // A retry after a crash finds the keys already dropped; report the total once known.
    const result: DestroyResult = {
      existed: true,
      incarnationBefore: m.incarnation,
      sessionsClosed,
      keysRemoved: dropped.length,
      processesRemaining: 0,
    };
    store.transaction(this.#commit(ctx, { ...this.#machine(ctx.machineId), state: "destroyed" }, result));
    this.#sweepSessions();
    return result;
  }

  /** Machines left unattached by recovery (mid-operation) become usable once an operation on them completes. */
  #attachIfNeeded(machineId: string): void {
    if (this.#deps.keys.generationOf(machineId) !== undefined) return;
    const m = this.#machine(machineId);
    if (m.state === "running") this.#deps.keys.attach(machineId, m.generation);
  }
}

interface OpContext {
  opId: Id;
  machineId: Id;
  generation: number;
  /** The operation row, when it is written with the result (install_key) rather than before the work. */
  intent: { opId: Id; kind: OpKind; machineId: Id; generation: number; argsHash: string } | null;
}

function respond(op: OpRecord): OpResponse {
  return {
    opId: op.opId as Id,
    kind: op.kind as OpKind,
    machineId: op.machineId as Id,
    generation: op.generation,
    status: "done",
    result: op.result as OperationResult,
  };
}
