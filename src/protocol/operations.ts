/**
 * The coordinator ↔ agent operation contract: `POST /v1/agent/ops` carries
 * `{opId, kind, machineId, generation, args}` and a done operation answers
 * `{opId, kind, machineId, generation, status: "done", result}`.
 *
 * One word per operation on both sides: the coordinator's operation rows,
 * the provider interface and the agent's records all use these kinds. The
 * agent validates arguments with these schemas and keeps a hash of their
 * canonical form (a retried op id with other arguments is refused); the
 * coordinator validates results with these schemas before reading them.
 */
import { createHash } from "node:crypto";
import { z } from "zod";
import { BerthError, assertNever } from "../core/errors.js";
import { isId, parseId, type Id } from "../core/ids.js";
import { parsePublicKey } from "../core/ssh-public-key.js";
import { INVALID_ID_PARAMS, zodRefusal } from "../core/refusal.js";
import { parsePolicy, type NetworkPolicy } from "../core/network-policy.js";
import { canonicalImage } from "../core/image-ref.js";

export const OPERATION_KINDS = ["provision", "install_key", "remove_key", "fence", "scrub", "destroy", "alloc_hold", "alloc_launch", "alloc_release"] as const;
export type OperationKind = (typeof OPERATION_KINDS)[number];
/** The allocation operations (src/agent/operations/alloc-*.ts): `machineId` names the allocation's sandbox, `generation` the launch actor's. */
export type AllocOperationKind = "alloc_hold" | "alloc_launch" | "alloc_release";

const idField = z.string().refine((s): boolean => isId(s), { message: "is not a valid id; use 1 to 128 characters of A-Z, a-z, 0-9, '_' or '-'", params: INVALID_ID_PARAMS });

/** The request envelope (arguments are validated per kind by `normalizeArgs`). */
export const operationRequestSchema = z
  .object({
    opId: idField,
    kind: z.enum(OPERATION_KINDS),
    machineId: idField,
    generation: z.number().int().nonnegative(),
    args: z.unknown().optional(),
  })
  .strict();
/** An operation request: the envelope checked (ids, kind, generation), the arguments not yet. */
export type OperationRequest = z.infer<typeof operationRequestSchema>;

// ---- arguments -------------------------------------------------------------

export const installKeyArgsSchema = z
  .object({
    publicKey: z.string().max(16_384),
    mode: z.enum(["grant", "keeper"]),
    grantId: z.string(),
    expiresAt: z.number().int().nonnegative().nullable(),
  })
  .strict();
export type InstallKeyArgs = z.infer<typeof installKeyArgsSchema>;

export const removeKeyArgsSchema = z
  .object({
    grantId: z.string().optional(),
    fingerprint: z.string().regex(/^SHA256:[A-Za-z0-9+/]{43}$/).optional(),
  })
  .strict();
export type RemoveKeyArgs = z.infer<typeof removeKeyArgsSchema>;

export const allocHoldArgsSchema = z.strictObject({ allocationId: z.string(), vcpu: z.number().int().min(1).max(4096), memoryMib: z.number().int().min(1).max(16 * 1024 * 1024) });
export const allocLaunchArgsSchema = z.strictObject({
  allocationId: z.string(),
  /** The allocation's public key (the client keeps the private half); installed as a grant key until `expiresAt`. */
  publicKey: z.string().max(16_384),
  expiresAt: z.number().int().nonnegative(),
  /** The host's standing epoch the launch was decided under (src/agent/standing.ts); absent: 0. */
  standingEpoch: z.number().int().nonnegative().optional(),
  /** A kept volume (the allocation id it was made for) the sandbox runs on instead of a new one (`alloc create --volume`); its record must exist here. */
  volume: z.string().optional(),
  /** The size's disk (MiB): the volume's image is made of it (src/agent/volume-disk.ts); absent: none named. */
  diskMib: z.number().int().min(1).max(2 ** 40).optional(),
});
/** The allocation operations' arguments as they travel (the agent validates them with these schemas). */
export type AllocOpArgs = { alloc_hold: z.input<typeof allocHoldArgsSchema>; alloc_launch: z.input<typeof allocLaunchArgsSchema>; alloc_release: z.input<typeof allocReleaseArgsSchema> };
/** `resolve`: an operator ends the allocation's quarantine; the agent then destroys a sandbox that does not match its record (what the runtime can prove is that machine's), instead of refusing. */
export const allocReleaseArgsSchema = z.strictObject({ allocationId: z.string(), keepVolume: z.boolean(), resolve: z.boolean().optional() });

/**
 * provision takes the machine's network policy (absent or `none`: no network
 * of its own, as before; the canonical hash of `{kind: "provision"}` is kept)
 * and the image it boots (absent: the host's root; core/image-ref.ts), and
 * `forwarding: "off"` when the pool refuses forwards to the machine's ports,
 * `files: "workspace"` when it confines SFTP to the workspace.
 */
const provisionArgsSchema = z.union([
  z.object({ network: z.unknown().optional(), image: z.string().max(1024).nullable().optional(), forwarding: z.enum(["on", "off"]).optional(), files: z.enum(["machine", "workspace"]).optional() }).passthrough(),
  z.undefined(),
  z.null(),
]);

/** fence, scrub and destroy take no arguments; an object sent anyway is ignored. */
const noArgsSchema = z.union([z.record(z.string(), z.unknown()), z.undefined(), z.null()]);

/** Which keys a removal names: by grant, by fingerprint, or both. */
export interface KeySelector {
  grantId?: string;
  fingerprint?: string;
}

/** Arguments as the agent acts on them: validated, ids checked, the key parsed. */
export type NormalizedArgs =
  | { kind: "provision"; network?: NetworkPolicy; image?: string; forwarding?: "off"; files?: "workspace" }
  | { kind: "install_key"; publicKey: string; fingerprint: string; mode: "grant" | "keeper"; grantId: Id; expiresAt: number | null }
  | { kind: "remove_key"; which: KeySelector }
  | { kind: "fence" }
  | { kind: "scrub" }
  | { kind: "destroy" }
  | { kind: "alloc_hold"; allocationId: Id; vcpu: number; memoryMib: number }
  | { kind: "alloc_launch"; allocationId: Id; publicKey: string; fingerprint: string; expiresAt: number; standingEpoch?: number; volume?: Id; diskMib?: number }
  | { kind: "alloc_release"; allocationId: Id; keepVolume: boolean; resolve?: true };

function invalidArgs(kind: OperationKind, error: z.ZodError): BerthError {
  return zodRefusal(error, { what: `arguments of ${kind}`, at: "args" });
}

/** Validates and canonicalises the arguments of an operation (ids through parseId). */
export function normalizeArgs(kind: OperationKind, raw: unknown): NormalizedArgs {
  switch (kind) {
    case "install_key": {
      const p = installKeyArgsSchema.safeParse(raw);
      if (!p.success) throw invalidArgs(kind, p.error);
      const key = parsePublicKey(p.data.publicKey);
      const grantId = parseId(p.data.grantId, "args.grantId");
      if (p.data.mode === "grant" && p.data.expiresAt === null) {
        throw new BerthError("invalid_request", "invalid_request: args.expiresAt is required for a grant key (only keeper keys may have no expiry)");
      }
      return { kind, publicKey: key.line, fingerprint: key.fingerprint, mode: p.data.mode, grantId, expiresAt: p.data.expiresAt };
    }
    case "remove_key": {
      const p = removeKeyArgsSchema.safeParse(raw);
      if (!p.success || (p.data.grantId === undefined && p.data.fingerprint === undefined)) {
        throw new BerthError("invalid_request", "invalid_request: args of remove_key must name {grantId} and/or {fingerprint: \"SHA256:…\"}");
      }
      const which: KeySelector = {};
      if (p.data.grantId !== undefined) which.grantId = parseId(p.data.grantId, "args.grantId");
      if (p.data.fingerprint !== undefined) which.fingerprint = p.data.fingerprint;
      return { kind, which };
    }
    case "alloc_hold": {
      const p = allocHoldArgsSchema.safeParse(raw);
      if (!p.success) throw invalidArgs(kind, p.error);
      return { kind, allocationId: parseId(p.data.allocationId, "args.allocationId"), vcpu: p.data.vcpu, memoryMib: p.data.memoryMib };
    }
    case "alloc_launch": {
      const p = allocLaunchArgsSchema.safeParse(raw);
      if (!p.success) throw invalidArgs(kind, p.error);
      const key = parsePublicKey(p.data.publicKey);
      // Epoch 0 is left out, so the arguments (and their hash) of a launch that names none are unchanged.
      const standingEpoch = p.data.standingEpoch ? { standingEpoch: p.data.standingEpoch } : {};
      // Absent unless a kept volume is attached, so the arguments (and their hash) of every other launch are unchanged.
      const volume = p.data.volume !== undefined ? { volume: parseId(p.data.volume, "args.volume") } : {};
      // Absent unless named, so the arguments (and their hash) of a launch from an older coordinator are unchanged.
      const disk = p.data.diskMib !== undefined ? { diskMib: p.data.diskMib } : {};
      return { kind, allocationId: parseId(p.data.allocationId, "args.allocationId"), publicKey: key.line, fingerprint: key.fingerprint, expiresAt: p.data.expiresAt, ...standingEpoch, ...volume, ...disk };
    }
    case "alloc_release": {
      const p = allocReleaseArgsSchema.safeParse(raw);
      if (!p.success) throw invalidArgs(kind, p.error);
      return { kind, allocationId: parseId(p.data.allocationId, "args.allocationId"), keepVolume: p.data.keepVolume, ...(p.data.resolve === true ? { resolve: true as const } : {}) };
    }
    case "provision": {
      const p = provisionArgsSchema.safeParse(raw);
      if (!p.success) throw invalidArgs(kind, p.error);
      const network = parsePolicy(p.data?.network ?? null);
      const image = p.data?.image ? canonicalImage(p.data.image) : undefined;
      // "on" is left out, so the arguments (and their hash) of a provision with forwards allowed are unchanged.
      return { kind, ...(network.mode === "none" ? {} : { network }), ...(image !== undefined ? { image } : {}), ...(p.data?.forwarding === "off" ? { forwarding: "off" as const } : {}), ...(p.data?.files === "workspace" ? { files: "workspace" as const } : {}) };
    }
    case "fence":
    case "scrub":
    case "destroy": {
      const p = noArgsSchema.safeParse(raw);
      if (!p.success) throw invalidArgs(kind, p.error);
      return { kind };
    }
    default:
      return assertNever(kind, "operation kind");
  }
}

/** The hash an operation's record keeps of its arguments (validated, canonical). */
export function argsHashOf(kind: OperationKind, rawArgs: unknown): string {
  return hashNormalizedArgs(normalizeArgs(kind, rawArgs));
}

export function hashNormalizedArgs(args: NormalizedArgs): string {
  return createHash("sha256").update(canonicalJson(args)).digest("hex");
}

/** JSON with object keys sorted and undefined members left out. */
export function canonicalJson(v: unknown): string {
  if (v === null || typeof v !== "object") return JSON.stringify(v);
  if (Array.isArray(v)) return `[${v.map(canonicalJson).join(",")}]`;
  const o = v as Record<string, unknown>;
  return `{${Object.keys(o)
    .sort()
    .filter((k) => o[k] !== undefined)
    .map((k) => `${JSON.stringify(k)}:${canonicalJson(o[k])}`)
    .join(",")}}`;
}

// ---- the coordinator's operation rows ---------------------------------------

/**
 * The arguments a coordinator operation row keeps (store/operations.ts
 * `args`), per machine kind: what the executor hands its provider. provision
 * carries what the pool asked for (the keeper key is installed right after,
 * by the provider); the others are what the agent takes.
 */
export const opRowArgsSchemas = {
  // Loose: a field a newer coordinator wrote is kept (and reaches no provider until it is named here).
  provision: z.looseObject({
    claimId: z.string().optional(),
    keeperKey: z.string().nullable().optional(),
    network: z.unknown().optional(),
    image: z.string().optional(),
    forwarding: z.enum(["on", "off"]).optional(),
    files: z.enum(["machine", "workspace"]).optional(),
  }),
  install_key: installKeyArgsSchema,
  remove_key: removeKeyArgsSchema,
  fence: z.object({}),
  scrub: z.object({}),
  destroy: z.object({}),
} as const;
export type MachineOperationKind = keyof typeof opRowArgsSchemas;
export type OpRowArgs = { [K in MachineOperationKind]: z.infer<(typeof opRowArgsSchemas)[K]> };
/** An operation row's kind and arguments, read together: narrowing the kind narrows the arguments. */
export type OpRowCall = { [K in MachineOperationKind]: { kind: K; args: OpRowArgs[K] } }[MachineOperationKind];

/** Reads an operation row's arguments by its kind; a BerthError naming the field when they do not match. */
export function parseOpRowArgs(kind: MachineOperationKind, json: string): OpRowCall {
  let raw: unknown;
  try {
    raw = JSON.parse(json);
  } catch {
    throw new BerthError("internal", `internal: the arguments of a ${kind} operation row are not JSON`);
  }
  const read = <S extends z.ZodType>(schema: S): z.output<S> => {
    const p = schema.safeParse(raw);
    if (!p.success) throw zodRefusal(p.error, { what: `the arguments of a ${kind} operation row`, at: "args" });
    return p.data;
  };
  switch (kind) {
    case "provision":
      return { kind, args: read(opRowArgsSchemas.provision) };
    case "install_key":
      return { kind, args: read(opRowArgsSchemas.install_key) };
    case "remove_key":
      return { kind, args: read(opRowArgsSchemas.remove_key) };
    case "fence":
    case "scrub":
    case "destroy":
      return { kind, args: read(opRowArgsSchemas[kind]) };
    default:
      return assertNever(kind, "operation kind");
  }
}

// ---- results ---------------------------------------------------------------

/** Readiness evidence of a machine with a network policy (src/core/network-evidence.ts). */
export const readinessEvidenceSchema = z.object({
  result: z.enum(["pass", "fail"]),
  policyFingerprint: z.string(),
  generation: z.number().int().nonnegative(),
  incarnation: z.string().nullable(),
  at: z.number(),
  durationMs: z.number(),
  checks: z.array(z.object({
    kind: z.enum(["permit", "deny", "dns-answer", "dns-refused", "pinned"]),
    target: z.string(),
    why: z.string(),
    got: z.string(),
    ms: z.number(),
    ok: z.boolean(),
    witness: z.string().optional(),
  })),
  pinned: z.record(z.string(), z.array(z.string())),
  rules: z.object({
    digest: z.string(),
    namespaceDigest: z.string(),
    lines: z.array(z.string()).optional(),
    namespaceLines: z.array(z.string()).optional(),
  }).optional(),
  error: z.string().optional(),
});

export const provisionResultSchema = z.object({
  incarnation: z.string(),
  runtime: z.string(),
  /** True when the runtime already had the machine (a provision retried under a new opId). */
  existed: z.boolean(),
  /** Present when the machine has a network policy: the probe run before it may be ready. */
  network: readinessEvidenceSchema.optional(),
  /** Present when the machine boots an image: the reference, the cache's id and the digest it was pulled by. */
  image: z.object({ ref: z.string(), id: z.string().nullable(), digest: z.string().nullable() }).optional(),
});
export const installKeyResultSchema = z.object({
  fingerprint: z.string(),
  grantId: z.string(),
  mode: z.enum(["grant", "keeper"]),
  expiresAt: z.number().nullable(),
  /** Fingerprints of keys of older generations removed by this install. */
  superseded: z.array(z.string()),
});
export const removeKeyResultSchema = z.object({
  /** Keys removed now; empty when none was installed (the key is absent either way). */
  removed: z.array(z.object({ fingerprint: z.string(), grantId: z.string() })),
  /** Keys of the machine still installed (other grants, a keeper key). */
  keysRemaining: z.number(),
  /** Sessions closed because no key of the machine is left (else the gateway cuts the key's own sessions). */
  sessionsClosed: z.number(),
  /** Live sessions of the machine once that is done. */
  sessionsRemaining: z.number(),
});
export const fenceResultSchema = z.object({
  incarnationBefore: z.string().nullable(),
  incarnationAfter: z.string(),
  sessionsClosed: z.number(),
  processesRemaining: z.number(),
  evidence: z.string(),
});
export const scrubResultSchema = z.object({
  incarnationBefore: z.string().nullable(),
  /** The incarnation after the scrub (gVisor restarts the sandbox; process keeps it). */
  incarnation: z.string().nullable(),
  scrubbed: z.literal(true),
  /** Present when the machine has a network policy: the probe run after the scrub, before it may be ready again. */
  network: readinessEvidenceSchema.optional(),
});
export const destroyResultSchema = z.object({
  existed: z.boolean(),
  incarnationBefore: z.string().nullable(),
  sessionsClosed: z.number(),
  keysRemoved: z.number(),
  processesRemaining: z.literal(0),
});

/** `disk`: the volume's disk limit: enforced by a filesystem image of `sizeMib`, or accounted only (`how` says why); absent from agents before the disk dimension. */
export const volumeDiskSchema = z.object({ enforced: z.boolean(), how: z.string(), sizeMib: z.number() });
export const volumeIdentitySchema = z.object({ path: z.string(), dev: z.string(), ino: z.string(), disk: volumeDiskSchema.optional() });
export const allocHoldResultSchema = z.object({
  allocationId: z.string(),
  generation: z.number(),
  /** True when this generation's hold was already taken (a retried or recovered hold). */
  existed: z.boolean(),
});
export const allocLaunchResultSchema = z.object({
  allocationId: z.string(),
  machineId: z.string(),
  incarnation: z.string(),
  runtime: z.string(),
  fingerprint: z.string(),
  volume: volumeIdentitySchema,
  /** What the runtime enforces of the size (e.g. "cgroup v2: cpu.max 2, memory.max 4096 MiB" or "not enforced: …"). */
  enforcement: z.string(),
});
export const allocReleaseResultSchema = z.object({
  allocationId: z.string(),
  sessionsClosed: z.number(),
  processesRemaining: z.literal(0),
  volume: z.enum(["kept", "wiped", "none"]),
  holdReleased: z.literal(true),
});

export const operationResultSchemas = {
  provision: provisionResultSchema,
  install_key: installKeyResultSchema,
  remove_key: removeKeyResultSchema,
  fence: fenceResultSchema,
  scrub: scrubResultSchema,
  destroy: destroyResultSchema,
  alloc_hold: allocHoldResultSchema,
  alloc_launch: allocLaunchResultSchema,
  alloc_release: allocReleaseResultSchema,
} as const satisfies Record<OperationKind, z.ZodType>;

export type ProvisionResult = z.infer<typeof provisionResultSchema>;
export type InstallKeyResult = z.infer<typeof installKeyResultSchema>;
export type RemoveKeyResult = z.infer<typeof removeKeyResultSchema>;
export type FenceResult = z.infer<typeof fenceResultSchema>;
export type ScrubResult = z.infer<typeof scrubResultSchema>;
export type DestroyResult = z.infer<typeof destroyResultSchema>;
export type AllocHoldResult = z.infer<typeof allocHoldResultSchema>;
export type AllocLaunchResult = z.infer<typeof allocLaunchResultSchema>;
export type AllocReleaseResult = z.infer<typeof allocReleaseResultSchema>;
export type OperationResults = { [K in OperationKind]: z.infer<(typeof operationResultSchemas)[K]> };
export type OperationResult = OperationResults[OperationKind];

/** A done operation as the agent answers it. */
export interface OperationResponse<K extends OperationKind = OperationKind> {
  opId: Id;
  kind: K;
  machineId: Id;
  generation: number;
  status: "done";
  result: OperationResults[K];
}

/** Reads an agent's result for `kind`; null when it does not match the contract. */
export function parseOperationResult<K extends OperationKind>(kind: K, raw: unknown): OperationResults[K] | null {
  const p = (operationResultSchemas[kind] as unknown as z.ZodType<OperationResults[K]>).safeParse(raw);
  return p.success ? p.data : null;
}
