/**
 * Portable-access test kit: a scripted provider standing in for the cloud or
 * agent API at the outermost boundary (it can hold, fail, lose or duplicate
 * completions), a portable pool of registered machines on a real store, and
 * small readers of the store.
 *
 * The provider is registered under the name "external" so that machines are
 * registered with claim tokens through the real HTTP API; every key, fence,
 * scrub and destroy operation then goes through the real executor to it.
 */
import assert from "node:assert/strict";
import type { OperationOutcome, OperationRequest, Provider, ProviderCapabilities } from "../../src/providers/provider.js";
import { parsePublicKey } from "../../src/core/ssh-public-key.js";
import { generateSshKeyPair } from "../../src/core/ssh-keys.js";
import type { Coordinator } from "../../src/coordinator/server.js";
import { ApiError, type Api } from "../../src/cli/api.js";
import { startTestCoordinator, TestClock, type Engine, type TestCoordinator } from "./env.js";
import type { CoordinatorConfig } from "../../src/coordinator/context.js";

export type Behaviour = "done" | "fail" | "ambiguous" | "hold" | "throw";

interface Rule {
  kind: OperationRequest["kind"];
  behaviour: Behaviour;
  times: number;
}

export interface Call {
  opId: string;
  kind: OperationRequest["kind"];
  resourceId: string;
  generation: number;
  args: Record<string, unknown>;
}

export const ALL_CAPABILITIES: ProviderCapabilities = { provision: false, installKey: true, revokeKey: true, fence: true, scrub: true, destroy: true, observeIdentity: true };

/**
 * A provider that does what it is told, and keeps the keys it was asked to
 * install per resource (as a naive cloud API would: it does not fence its
 * own delayed work by generation), so tests can see what is left.
 */
export class ScriptedExternalProvider implements Provider {
  readonly name = "external";
  readonly calls: Call[] = [];
  /** resourceId -> installed key fingerprints. */
  readonly keys = new Map<string, Set<string>>();
  readonly destroyed = new Set<string>();
  readonly #rules: Rule[] = [];
  readonly #held: Array<{ call: Call; release: (b: Behaviour) => void }> = [];
  readonly #waiters: Array<{ kind: string; resolve: () => void }> = [];
  #incarnation = 0;

  constructor(readonly capabilities: ProviderCapabilities = ALL_CAPABILITIES) {}

  /** The next `times` operations of `kind` behave this way (then back to "done"). */
  on(kind: OperationRequest["kind"], behaviour: Behaviour, times = 1): void {
    this.#rules.push({ kind, behaviour, times });
  }

  /** Drops every pending rule: from now on operations succeed. */
  clearRules(): void {
    this.#rules.length = 0;
  }

  /** Resolves once an operation of `kind` is being held. */
  heldOne(kind: OperationRequest["kind"]): Promise<void> {
    if (this.#held.some((h) => h.call.kind === kind)) return Promise.resolve();
    return new Promise((resolve) => this.#waiters.push({ kind, resolve }));
  }

  /** Lets the oldest held operation of `kind` finish with `outcome`. */
  release(kind: OperationRequest["kind"], outcome: Behaviour = "done"): void {
    const i = this.#held.findIndex((h) => h.call.kind === kind);
    assert.ok(i >= 0, `no held ${kind}`);
    const [h] = this.#held.splice(i, 1);
    h!.release(outcome);
  }

  callsOf(kind: OperationRequest["kind"]): Call[] {
    return this.calls.filter((c) => c.kind === kind);
  }

  keysOn(resourceId: string): string[] {
    return [...(this.keys.get(resourceId) ?? [])];
  }

  async run(op: OperationRequest): Promise<OperationOutcome> {
    const call: Call = { opId: op.opId, kind: op.kind, resourceId: op.machine.resource_id, generation: op.generation, args: op.args };
    this.calls.push(call);
    const rule = this.#rules.find((r) => r.kind === op.kind && r.times > 0);
    let behaviour: Behaviour = "done";
    if (rule) {
      rule.times--;
      behaviour = rule.behaviour;
    }
    if (behaviour === "hold") {
      behaviour = await new Promise<Behaviour>((release) => {
        this.#held.push({ call, release });
        for (const w of this.#waiters.filter((x) => x.kind === op.kind)) w.resolve();
      });
    }
    switch (behaviour) {
      case "fail":
        return { kind: "failed", error: `scripted ${op.kind} failure`, retryable: false };
      case "ambiguous":
        // The work happened, the reply was lost.
        this.#apply(call);
        return { kind: "ambiguous", error: `scripted lost reply for ${op.kind}` };
      case "throw":
        throw new Error(`scripted ${op.kind} transport error`);
      default:
        return { kind: "done", result: this.#apply(call) };
    }
  }

  #apply(c: Call): Record<string, unknown> {
    const set = this.keys.get(c.resourceId) ?? new Set<string>();
    this.keys.set(c.resourceId, set);
    switch (c.kind) {
      case "install_key": {
        const fp = parsePublicKey(c.args.publicKey).fingerprint;
        set.add(fp);
        return { fingerprint: fp };
      }
      case "remove_key": {
        const fp = String(c.args.fingerprint ?? "");
        const had = set.delete(fp);
        return { removed: had ? [{ fingerprint: fp }] : [] };
      }
      case "fence":
        return { incarnation: `inc-${++this.#incarnation}`, sessionsClosed: 0 };
      case "scrub":
        return { scrubbed: true };
      case "destroy":
        this.keys.delete(c.resourceId);
        this.destroyed.add(c.resourceId);
        return { destroyed: true };
      default:
        return {};
    }
  }
}

/** Ticks the reconciler and runs what it starts, until nothing is due. */
export async function settle(coord: Pick<Coordinator, "reconciler" | "executor">, rounds = 60): Promise<void> {
  for (let i = 0; i < rounds; i++) {
    const r = await coord.reconciler.tick();
    for (const s of r.started) await coord.executor.execute(s);
    if (r.visited === 0) return;
  }
  throw new Error("the reconciler did not settle");
}

export interface PortableEnv {
  t: TestCoordinator;
  clock: TestClock;
  provider: ScriptedExternalProvider;
  admin: Api;
  machines: string[];
  close(): Promise<void>;
}

export const HOST_KEY = generateSshKeyPair("gateway").publicKey;

/** A coordinator (portable enabled, reconciler driven by hand) with a portable pool of `n` registered machines. */
export async function portableEnv(
  engine: Engine,
  o: { n?: number; config?: Partial<CoordinatorConfig>; pool?: string; poolBody?: Record<string, unknown>; provider?: ScriptedExternalProvider } = {},
): Promise<PortableEnv> {
  const clock = new TestClock();
  const provider = o.provider ?? new ScriptedExternalProvider();
  const t = await startTestCoordinator({ engine, clock, reconcile: false, providers: [provider], config: { portable: true, ...o.config } });
  const admin = await t.api("admin");
  const pool = o.pool ?? "agents";
  const n = o.n ?? 1;
  const e = await admin.call<{ claims: { token: string }[] }>("POST", `/v1/pools/${pool}/ensure`, {
    minReady: n,
    maxReady: n,
    compatibilityKey: "linux-x64",
    access: "portable",
    provider: "external",
    heartbeatMs: 10_000,
    ...o.poolBody,
  });
  const machines: string[] = [];
  for (let i = 0; i < e.claims.length; i++) {
    const r = await admin.call<{ machineId: string }>("POST", `/v1/pools/${pool}/machines`, {
      claimToken: e.claims[i]!.token,
      resourceId: `vm-${pool}-${i + 1}`,
      ssh: { host: "10.0.0.1", port: 22, user: "borrower", hostKey: HOST_KEY },
    });
    machines.push(r.machineId);
    clock.advance(1); // distinct ready_since: the borrow order is deterministic
  }
  return { t, clock, provider, admin, machines, close: () => t.close() };
}

export interface Borrowed {
  borrowId: string;
  borrowToken: string;
  grantToken: string;
  state: string;
  expiresAt: number;
  ackDeadline: number;
  heartbeatDeadline: number;
  generation: number;
  fingerprint: string;
  machine: { id: string; generation: number };
  publicKey: string;
  privateKey: string;
}

export async function borrowPortable(api: Api, pool = "agents", extra: Record<string, unknown> = {}): Promise<Borrowed> {
  const pair = generateSshKeyPair("test-borrow");
  const r = await api.call<Omit<Borrowed, "publicKey" | "privateKey">>("POST", `/v1/pools/${pool}/borrow`, { access: "portable", publicKey: pair.publicKey, ...extra });
  return { ...r, publicKey: pair.publicKey, privateKey: pair.privateKey };
}

export function ackBody(b: Borrowed): Record<string, string> {
  return { token: b.borrowToken, grantToken: b.grantToken, publicKey: b.publicKey };
}

export function tokens(b: Borrowed): Record<string, string> {
  return { token: b.borrowToken, grantToken: b.grantToken };
}

export async function refused(p: Promise<unknown>, code: string, status?: number): Promise<void> {
  await assert.rejects(p, (e: unknown) => {
    assert.ok(e instanceof ApiError, `expected a refusal, got ${String(e)}`);
    assert.equal(e.code, code, e.message);
    if (status !== undefined) assert.equal(e.status, status, e.message);
    return true;
  });
}

export interface GrantView {
  state: string;
  reason: string | null;
  generation: number;
  expires_at: number;
  heartbeat_deadline: number;
  activated_at: number | null;
  machine_id: string;
}

export async function grantRow(t: TestCoordinator, id: string): Promise<GrantView> {
  const g = await t.store.transaction((tx) => tx.get<GrantView>("SELECT * FROM grants WHERE id = ?", [id]));
  assert.ok(g, `grant ${id} exists`);
  return g;
}

export async function machineRow(t: TestCoordinator, id: string): Promise<{ state: string; generation: number; reason: string | null } | undefined> {
  return t.store.transaction((tx) => tx.get<{ state: string; generation: number; reason: string | null }>("SELECT state, generation, reason FROM machines WHERE id = ?", [id]));
}

export async function auditEvents(t: TestCoordinator, machineId: string): Promise<string[]> {
  const rows = await t.store.transaction((tx) => tx.all<{ event: string }>("SELECT event FROM audit WHERE machine_id = ? ORDER BY seq", [machineId]));
  return rows.map((r) => r.event);
}

export function metricValue(text: string, name: string, labels: string): number {
  const line = text.split("\n").find((l) => l.startsWith(`${name}{`) && l.includes(labels));
  return line ? Number(line.split(" ").pop()) : 0;
}
