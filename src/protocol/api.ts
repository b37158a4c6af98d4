/**
 * The client↔coordinator contract: for every coordinator route, the request
 * body the route accepts and the reply it answers, as zod schemas.
 *
 * - The coordinator's routes validate their bodies with `body` (unknown
 *   fields refused; src/coordinator/http/).
 * - The client library, the CLI and the MCP server send requests through
 *   `Api.send` (src/client/http.ts), which parses each reply with `reply`: a
 *   reply that does not match is an `invalid_reply` error naming the field,
 *   never a value cast to a type it does not have.
 * - docs/api.md lists exactly these routes (test/protocol/api-contract.test.ts).
 *
 * Replies are read as loose objects: fields not named here are kept as they
 * came (a newer coordinator may answer more), the named ones must hold.
 * Routes are keyed "METHOD /path/{param}", as in docs/api.md.
 */
import { z } from "zod";
import { isId } from "../core/ids.js";
import { formatDuration, MAX_BORROW_MS, MIN_BORROW_MS } from "../core/durations.js";
import { INVALID_ID_PARAMS, type IssueLike } from "../core/refusal.js";
import type { HostStanding } from "../core/allocation-placement.js";

const id = z.string().refine(isId, { message: "is not a valid id; use 1 to 128 characters of A-Z, a-z, 0-9, '_' or '-'", params: INVALID_ID_PARAMS });
const int = (min: number, max: number) => z.number().int().min(min).max(max);
const text = (max: number) => z.string().min(1).max(max);

export { id as idSchema };

// ---------------------------------------------------------------- request bodies

export const ensureSchema = z.strictObject({
  minReady: int(0, 1000),
  maxReady: int(0, 1000),
  compatibilityKey: text(200),
  access: z.enum(["keeper", "portable"]).default("keeper"),
  provider: z.enum(["hosts", "aws", "external"]).default("external"),
  identity: z.strictObject({ imageId: text(200), repository: text(500).optional(), cacheKey: text(200).optional() }).nullable().default(null),
  hardTtlMs: int(60_000, 30 * 86_400_000).default(86_400_000),
  heartbeatMs: int(1_000, 3_600_000).default(60_000),
  keeperKey: text(2000).nullable().default(null),
  /** The image the pool's machines boot (docs/images.md); checked and canonicalised by core/image-ref. */
  image: z.string().min(1).max(1024).nullable().default(null),
  /** Network policy (docs/network.md); canonicalised and checked by core/network-policy. */
  network: z
    .strictObject({ mode: z.enum(["none", "egress"]), allow: z.array(text(300)).max(64).default([]), dns: z.array(text(15)).max(16).default([]) })
    .default({ mode: "none", allow: [], dns: [] }),
  /** Forwards to the machines' own ports (docs/sessions.md): "off" refuses every one. */
  forwarding: z.enum(["on", "off"]).default("on"),
  /** Where SFTP reaches on the machines (docs/files.md): "workspace" confines it. */
  files: z.enum(["machine", "workspace"]).default("machine"),
});

export const registerSchema = z.strictObject({
  claimToken: text(200),
  resourceId: text(200),
  ssh: z.strictObject({ host: text(255), port: int(1, 65535), user: text(128).nullable().default(null), hostKey: text(2000).nullable().default(null) }),
  hardTtlMs: int(60_000, 30 * 86_400_000).nullable().default(null),
});

export const borrowSchema = z.strictObject({
  access: z.enum(["keeper", "portable"]).default("keeper"),
  publicKey: text(2000).optional(),
  durationMs: z
    .number()
    .int()
    .min(MIN_BORROW_MS, `a borrow lasts at least ${formatDuration(MIN_BORROW_MS)}`)
    .max(MAX_BORROW_MS, `a borrow lasts at most ${MAX_BORROW_MS / 3_600_000}h (${MAX_BORROW_MS} ms)`)
    .optional(),
  /** An id and tokens the client chose, so that a retry after a lost reply answers the same borrow (keeper b_…, portable g_… with grantToken). */
  borrowId: z.string().regex(/^[bg]_[a-z0-9]{20,64}$/, "must be b_ (keeper) or g_ (portable) and 20 to 64 characters of a-z, 0-9").optional(),
  borrowToken: z.string().regex(/^bbt_[A-Za-z0-9_-]{43,86}$/, "must be bbt_ and 43 to 86 base64url characters (32+ random bytes)").optional(),
  grantToken: z.string().regex(/^bgt_[A-Za-z0-9_-]{43,86}$/, "must be bgt_ and 43 to 86 base64url characters (32+ random bytes)").optional(),
});

export const drainSchema = z.strictObject({ force: z.boolean().default(false) });

export const returnSchema = z.strictObject({
  token: text(200),
  disposition: z.enum(["ready", "drain"]).default("ready"),
  grantToken: text(200).optional(),
});

export const ackSchema = z.strictObject({ token: text(200), grantToken: text(200), publicKey: text(2000) });

export const heartbeatSchema = z.strictObject({ token: text(200), grantToken: text(200).optional() });

export const reportSchema = z.strictObject({
  token: text(200),
  firstCommandMs: z.number().min(0).max(3_600_000).optional(),
  scrubMs: z.number().min(0).max(3_600_000).optional(),
});

/** An agent's API address: http: or https: only (the coordinator sends the host-call token there). */
const agentUrl = z
  .string()
  .max(500)
  .url()
  .refine((u) => /^https?:$/.test(new URL(u).protocol), { message: "must be an http: or https: URL" });

/**
 * A host's capacity as its agent reports it: memory in MiB as `memoryMib`.
 * `memoryMb` is its older name (the value was MiB all along), accepted from
 * agents of the previous release until the next one; naming both is refused.
 * `diskMib`: the disk its volumes may take (absent from an agent older than
 * the disk dimension: null, not checked by placement).
 */
const hostCapacity = z
  .strictObject({ vcpu: int(1, 4096), memoryMib: int(64, 64 * 1024 * 1024).optional(), memoryMb: int(64, 64 * 1024 * 1024).optional(), diskMib: int(0, 2 ** 40).optional(), slots: int(0, 10_000) })
  .refine((c) => (c.memoryMib === undefined) !== (c.memoryMb === undefined), { message: "name the memory once, in MiB: memoryMib (memoryMb is its older name)", path: ["memoryMib"] })
  .transform((c) => ({ vcpu: c.vcpu, memoryMib: c.memoryMib ?? c.memoryMb ?? 0, diskMib: c.diskMib ?? null, slots: c.slots }));

const hostDescription = {
  url: agentUrl,
  runtime: z.enum(["process", "gvisor"]),
  /** The runsc release and gVisor platform (gvisor hosts), and a warning naming what an old runsc breaks. */
  runtimeDetail: z
    .strictObject({ runsc: z.strictObject({ version: text(64), platform: z.enum(["kvm", "systrap", "ptrace"]) }).optional(), warning: text(500).optional() })
    .optional(),
  capacity: hostCapacity,
  ssh: z.strictObject({ host: text(255), port: int(1, 65535), hostKey: text(2000), fingerprint: text(200) }),
};

/** An identity proof (docs/host-identity.md): base64 SPKI public key, the coordinator's challenge, base64 signature. */
const identityProof = z.strictObject({ publicKey: text(200), challenge: text(256), signature: text(200) });

export const enrollSchema = z.strictObject({
  name: id,
  ...hostDescription,
  identity: identityProof.optional(),
});

export const emptySchema = z.strictObject({});
export const hostSessionSchema = z.strictObject({ hostId: id, challenge: text(256), signature: text(200) });
export const hostDescribeSchema = z.strictObject({
  description: z.strictObject(hostDescription),
  step: z.enum(["legacy", "local", "cloud", "active"]),
  owed: int(0, 1_000_000),
  version: text(64),
});
export const hostActiveSchema = z.strictObject({ version: text(64) });
export const stoppedReportsSchema = z.strictObject({
  reports: z.array(z.strictObject({ machineId: id, generation: int(0, Number.MAX_SAFE_INTEGER) })).max(10_000),
});
export const activateSchema = z.strictObject({ force: z.boolean().default(false) });
export const removeHostSchema = z.strictObject({ force: z.boolean().default(false) });

export const createAllocationSchema = z.strictObject({
  id: id.optional(),
  size: z.string().min(1).max(64),
  durationMs: z.number().int().optional(),
  strategy: z.enum(["binpack", "spread"]).default("binpack"),
  /** Operators may create for another admitted owner. */
  owner: id.optional(),
  /** The allocation's OpenSSH public key (ssh-ed25519 …); with it the allocation is launched and reachable with the private half. */
  publicKey: z.string().min(1).max(16_384).optional(),
  /** A kept volume (named by the released allocation it belongs to) to run on; needs `publicKey`. The volume's host is the only candidate. */
  volume: id.optional(),
});
export const planSchema = z.strictObject({ size: z.string().min(1).max(64), strategy: z.enum(["binpack", "spread"]).default("binpack") });
export const releaseAllocationSchema = z.strictObject({ keepVolume: z.boolean().default(false) });
export const resolveAllocationSchema = z.strictObject({ volume: z.enum(["keep", "destroy", "host_gone"]) });
// Non-positive budgets reach checkBudget, which refuses them with one message for every dimension.
// diskMib absent: the owner's disk budget is kept (admit: 40 GiB per allocation of `count`).
export const budgetSchema = z.strictObject({ vcpu: int(-1_000_000, 1_000_000), memoryMib: int(-1_000_000_000, 1_000_000_000), diskMib: int(-(2 ** 40), 2 ** 40).optional(), count: int(-1_000_000, 1_000_000) });
const STANDINGS = ["ready", "draining", "withdrawn", "not_ready"] as const satisfies readonly HostStanding[];
export const standingSchema = z.strictObject({ standing: z.enum(STANDINGS), hostGone: z.boolean().default(false) });
export const removeImageSchema = z.strictObject({ host: id.optional() });

// ---------------------------------------------------------------- replies

const o = z.looseObject;
const n = z.number();
const s = z.string();
const nullable = <T extends z.ZodType>(t: T) => t.nullable();

const sshEndpoint = o({ host: nullable(s), port: nullable(n), user: nullable(s), hostKey: nullable(s) });
const machineWithSsh = o({ id: s, generation: n, ssh: sshEndpoint });
const network = o({ mode: s, allow: z.array(s).optional(), dns: z.array(s).optional(), fingerprint: s });

export const poolReply = o({
  name: s,
  access: z.enum(["keeper", "portable"]),
  provider: s,
  compatibilityKey: s,
  minReady: n,
  maxReady: n,
  hardTtlMs: n,
  heartbeatMs: n,
  network: network.optional(),
  image: nullable(s).optional(),
  forwarding: z.enum(["on", "off"]).optional(),
  files: z.enum(["machine", "workspace"]).optional(),
  counts: o({ ready: n, lent: n, cleanup: n, openClaims: n }).optional(),
  states: z.record(s, n).optional(),
  ready: n.optional(),
  machines: n.optional(),
  claims: z.array(o({ id: s, token: s, expiresAt: n })).optional(),
  note: nullable(s).optional(),
  provisionError: nullable(o({ machineId: s, at: n, state: z.enum(["retrying", "failed"]), error: s })).optional(),
  /** Why fewer than minReady are ready (null when not short). */
  shortfall: nullable(s).optional(),
  /** The provisioning circuit breaker (null: no failure since the last success). */
  provisionBreaker: nullable(o({ failures: n, trips: n, openUntil: nullable(n), cause: nullable(s) })).optional(),
  /** The breakers per placement of a self-placed provider (aws: region/instance type/subnet) with a failure since their last success. */
  placementBreakers: z.array(o({ placement: s, failures: n, trips: n, openUntil: nullable(n), cause: nullable(s) })).optional(),
  /** Each live machine's policy and last readiness evidence (docs/network.md). */
  networks: z
    .array(
      o({
        id: s,
        state: s,
        generation: n,
        policyFingerprint: s,
        evidence: nullable(o({ result: s, policyFingerprint: s, generation: n, at: n, checks: z.array(o({ ok: z.boolean() })) })),
      }),
    )
    .optional(),
});

export const borrowReply = o({
  borrowId: s,
  borrowToken: s,
  grantToken: s.optional(),
  pool: s,
  machine: machineWithSsh,
  heartbeatMs: n,
  heartbeatDeadline: n,
  expiresAt: n,
  repeated: z.boolean(),
  state: s.optional(),
  ackDeadline: n.optional(),
});

/** A borrow as `GET /v1/borrows/{id}` shows it: keeper, or a portable grant (whose machine may be pruned: no ssh). */
export const borrowView = o({
  id: s,
  access: z.enum(["keeper", "portable"]),
  pool: s,
  state: s,
  expiresAt: n,
  heartbeatDeadline: nullable(n),
  machine: o({ id: s, state: s, generation: n.optional(), ssh: sshEndpoint.optional() }).optional(),
  cleanup: s.optional(),
});

export const returnReply = o({ state: s, machineId: s.optional(), cleanup: s.optional(), repeated: z.boolean().optional() });

const hostIdentity = o({ state: s, keyFingerprint: nullable(s), since: nullable(n), agentStep: nullable(s), owedReports: n, agentVersion: nullable(s) });
export const hostView = o({
  id: s,
  name: s,
  url: s,
  runtime: s,
  runsc: nullable(o({ version: s, platform: s })),
  runtimeWarning: nullable(s),
  /** memoryMb: the older name of memoryMib (the same MiB), answered too until the next release. */
  capacity: o({ vcpu: n, memoryMib: n, memoryMb: n.optional(), diskMib: nullable(n).optional(), slots: n }),
  usedSlots: n,
  identity: hostIdentity,
});

const resources = o({ vcpu: n, memoryMib: n, diskMib: n.optional(), count: n });
export const ownerView = o({ owner: s, budget: resources, used: resources });

export const allocationView = o({
  id: s,
  owner: s,
  size: s,
  vcpu: n,
  memoryMib: n,
  diskMib: n.optional(),
  state: s,
  hostId: s,
  plan: o({ hostId: s, hostName: s, strategy: s, size: s, vcpu: n, memoryMib: n, diskMib: n.optional(), placedAt: n }),
  createdAt: n,
  expiresAt: n,
  stateSince: n,
  reason: nullable(s),
  created: z.boolean().optional(),
  launch: nullable(
    o({
      fingerprint: s,
      keepVolume: z.boolean(),
      readyAt: nullable(n),
      attempts: n,
      error: nullable(s),
      runtime: nullable(s),
      enforcement: nullable(s),
      machineId: nullable(s),
      volume: nullable(o({ path: s, disk: o({ enforced: z.boolean(), how: s, sizeMib: n }).optional() })),
      volumeFrom: nullable(s).optional(),
      release: nullable(o({ volume: s })),
    }),
  ).optional(),
  access: nullable(o({ host: s, port: n, user: s, hostKey: s, hostKeyFingerprint: s })).optional(),
});

export const planReply = o({
  size: o({ name: s, vcpu: n, memoryMib: n, diskMib: n.optional() }),
  strategy: s,
  decision: o({ chosen: nullable(o({ hostId: s, name: s })), verdicts: z.array(o({ hostId: s, name: s, fits: z.boolean(), reason: s.optional() })) }),
  budget: nullable(o({ admitted: z.literal(true), fits: z.boolean(), message: nullable(s) })),
});

const slots = o({ vcpu: n, memoryMib: n, diskMib: nullable(n).optional(), slots: n });
export const hostAccountView = o({ hostId: s, name: s, standing: s, reported: s.optional(), capacity: slots, used: slots });

export const volumeView = o({
  allocationId: s,
  state: s,
  path: s,
  dev: nullable(s),
  ino: nullable(s),
  /** The volume's disk (MiB; null: made before the disk dimension), whether an image enforces it, and why not. */
  diskMib: nullable(n).optional(),
  diskEnforced: nullable(z.boolean()).optional(),
  diskWhy: nullable(s).optional(),
  hostName: s.optional(),
  allocationState: s.optional(),
  check: nullable(o({ ok: z.boolean(), problems: z.array(s) })).optional(),
});
export const volumeCheck = o({ allocationId: s, ok: z.boolean(), state: s, problems: z.array(s) });

export const imageView = o({ id: s, refs: z.array(s), size: n, layers: n, lastUsedAt: n, pullMs: n, machines: n });
export const hostImages = o({ host: s, maxBytes: nullable(n), usedBytes: n, images: z.array(imageView) });

const machineState = o({ machineId: s, state: s });

// ---------------------------------------------------------------- routes

export interface RouteContract {
  /** The request body's schema (POST); absent: the route takes no body. */
  readonly body?: z.ZodType;
  /** The JSON reply's schema; null: the reply is not JSON (`/metrics`). */
  readonly reply: z.ZodType | null;
}

/** Every coordinator route (the dashboard's /ui routes and the agent's /v1/agent/* are apart). */
export const API = {
  "GET /v1/health": { reply: o({ status: s, version: s, store: s, portable: z.unknown() }) },
  "GET /metrics": { reply: null },
  "GET /v1/pools": { reply: o({ pools: z.array(poolReply) }) },
  "GET /v1/pools/{pool}": { reply: poolReply },
  "POST /v1/pools/{pool}/ensure": { body: ensureSchema, reply: poolReply },
  "POST /v1/pools/{pool}/drain": { body: drainSchema, reply: o({ drained: n, remaining: n }) },
  "POST /v1/pools/{pool}/resume": { reply: o({ pool: s, resumed: z.boolean() }) },
  "POST /v1/pools/{pool}/machines": { body: registerSchema, reply: machineState },
  "POST /v1/machines/{machine}/destroyed": { reply: machineState },
  "POST /v1/machines/{machine}/drain": { reply: machineState },
  "POST /v1/pools/{pool}/borrow": { body: borrowSchema, reply: borrowReply },
  "GET /v1/borrows/{id}": { reply: borrowView },
  "POST /v1/borrows/{id}/ack": { body: ackSchema, reply: borrowView },
  "POST /v1/borrows/{id}/heartbeat": { body: heartbeatSchema, reply: o({ heartbeatDeadline: n, expiresAt: n }) },
  "POST /v1/borrows/{id}/return": { body: returnSchema, reply: returnReply },
  "POST /v1/borrows/{id}/report": { body: reportSchema, reply: o({ recorded: z.literal(true) }) },
  "POST /v1/borrows/{id}/end": { reply: o({ borrowId: s, state: s, machineState: nullable(s) }) },
  "GET /v1/hosts": { reply: o({ hosts: z.array(hostView) }) },
  "POST /v1/hosts/enroll": { body: enrollSchema, reply: o({ hostId: s, hostCallToken: s, identity: z.literal("active").optional() }) },
  "POST /v1/hosts/{host}/activate": { body: activateSchema, reply: o({ host: s, hostId: s, state: s, machines: n, endedBorrows: n }) },
  "POST /v1/hosts/{host}/reset-identity": { body: emptySchema, reply: o({ host: s, hostId: s, state: z.literal("awaiting"), enrollToken: s }) },
  "POST /v1/hosts/{host}/remove": {
    body: removeHostSchema,
    reply: o({ host: s, hostId: s, state: z.enum(["removing", "removed"]), machines: n, allocations: n }),
  },
  "POST /v1/hosts/challenge": { body: emptySchema, reply: o({ challenge: s, expiresAt: n }) },
  "POST /v1/hosts/session": { body: hostSessionSchema, reply: o({ credential: s, expiresAt: n }) },
  "POST /v1/hosts/self/commit": { body: emptySchema, reply: o({ hostCallToken: s }) },
  "POST /v1/hosts/self/describe": { body: hostDescribeSchema, reply: o({ hostId: s, hostCallToken: s }) },
  "POST /v1/hosts/self/active": { body: hostActiveSchema, reply: o({ state: z.literal("active") }) },
  "POST /v1/hosts/self/stopped": { body: stoppedReportsSchema, reply: o({ moot: z.array(o({ machineId: s, generation: n })) }) },
  "GET /v1/sizes": { reply: o({ sizes: z.array(o({ name: s, vcpu: n, memoryMib: n, diskMib: n.optional() })), maxDurationMs: n }) },
  "GET /v1/allocations": { reply: o({ allocations: z.array(allocationView) }) },
  "POST /v1/allocations": { body: createAllocationSchema, reply: allocationView },
  "POST /v1/allocations/plan": { body: planSchema, reply: planReply },
  "GET /v1/allocations/{id}": { reply: allocationView },
  "POST /v1/allocations/{id}/release": { body: releaseAllocationSchema, reply: allocationView },
  "POST /v1/allocations/{id}/resolve": { body: resolveAllocationSchema, reply: allocationView },
  "POST /v1/allocations/{id}/restart": { reply: allocationView },
  "GET /v1/volumes": { reply: o({ volumes: z.array(volumeView), unreachableHosts: z.array(s) }) },
  "GET /v1/volumes/{allocation}": { reply: volumeView },
  "POST /v1/volumes/{allocation}/remove": { reply: o({ allocationId: s, state: s }) },
  "GET /v1/volume-quarantine": { reply: o({ hosts: z.array(o({ hostId: s, hostName: s, quarantined: z.array(s) })), unreachableHosts: z.array(s) }) },
  "POST /v1/volume-quarantine/{host}/{name}/remove": { reply: o({ hostId: s, removed: s }) },
  "POST /v1/volumes/{allocation}/verify": { reply: volumeCheck },
  "POST /v1/volumes/{allocation}/reset": { reply: o({ allocationId: s, removed: n }) },
  "GET /v1/owners": { reply: o({ owners: z.array(ownerView) }) },
  "POST /v1/owners/{tokenId}/admit": { body: budgetSchema, reply: ownerView },
  "POST /v1/owners/{tokenId}/budget": { body: budgetSchema, reply: ownerView },
  "GET /v1/host-accounts": { reply: o({ hosts: z.array(hostAccountView) }) },
  "POST /v1/hosts/{host}/standing": { body: standingSchema, reply: o({ hostId: s, standing: s }) },
  "GET /v1/images": { reply: o({ hosts: z.array(hostImages), unreachableHosts: z.array(s) }) },
  "POST /v1/images/{image}/remove": {
    body: removeImageSchema,
    reply: o({ removed: z.array(o({ host: s, id: s, size: n })), refused: z.array(o({ host: s, code: s, message: s })) }),
  },
} as const satisfies Record<string, RouteContract>;

export type Route = keyof typeof API;

type ParamNames<P extends string> = P extends `${string}{${infer Name}}${infer Rest}` ? Name | ParamNames<Rest> : never;
/** The path params a route takes, by name ("GET /v1/pools/{pool}" → {pool: string}). */
export type RouteParams<R extends Route> = { [K in ParamNames<R>]: string };
/** A body as it travels: closed string sets widen to string, since the route is what refuses a value outside them. */
type Wire<T> = T extends string ? string : T extends readonly (infer U)[] ? Wire<U>[] : T extends object ? { [K in keyof T]: Wire<T[K]> } : T;
/** What a client sends: the body before defaults are applied. */
export type RouteBody<R extends Route> = (typeof API)[R] extends { body: infer B extends z.ZodType } ? Wire<z.input<B>> : never;
export type RouteReply<R extends Route> = (typeof API)[R]["reply"] extends infer T extends z.ZodType ? z.output<T> : string;

/** The request path of `route` with its params, each one encoded segment. */
export function routePath(route: Route, params: Record<string, string>): string {
  const path = route.slice(route.indexOf(" ") + 1);
  return path.replace(/\{([^}]+)\}/g, (_, name: string) => {
    const v = params[name];
    if (v === undefined) throw new Error(`route ${route}: no value for {${name}}`);
    return encodeURIComponent(v);
  });
}

/** A JSON reply of `route` read by its schema: the typed reply, or why it does not match (`replyMismatch`). */
export function parseReply<R extends Route>(route: R, raw: unknown): { ok: true; reply: RouteReply<R> } | { ok: false; why: string } {
  const schema = API[route].reply;
  if (schema === null) return { ok: false, why: `${route} answers text, not JSON` };
  const p = schema.safeParse(raw);
  // The schema is the route's own: its output is the route's reply type.
  return p.success ? { ok: true, reply: p.data as RouteReply<R> } : { ok: false, why: replyMismatch(route, p.error.issues) };
}

/** Why a reply does not match its route's schema: the first offending field, by its path. */
export function replyMismatch(route: Route, issues: readonly IssueLike[]): string {
  const issue = issues[0];
  const at = (issue?.path ?? []).map(String).join(".") || "reply";
  const what = issue === undefined ? "is invalid" : issue.message;
  return `invalid_reply: the coordinator's answer to ${route} does not match the API contract: field ${at}: ${what} (a coordinator of another version?)`;
}
