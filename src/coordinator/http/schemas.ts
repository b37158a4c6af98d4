/** Schemas for every request body the coordinator accepts. Unknown fields are refused. */
import { z } from "zod";
import { BerthError } from "../../core/errors.js";
import { isId } from "../../core/ids.js";
import { INVALID_ID_PARAMS } from "../../core/refusal.js";

const id = z.string().refine(isId, { message: "is not a valid id; use 1 to 128 characters of A-Z, a-z, 0-9, '_' or '-'", params: INVALID_ID_PARAMS });
const int = (min: number, max: number) => z.number().int().min(min).max(max);
const text = (max: number) => z.string().min(1).max(max);

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
  durationMs: int(1_000, 24 * 3_600_000).optional(),
  /** An id and tokens the client chose, so that a retry after a lost reply answers the same borrow (keeper b_…, portable g_… with grantToken). */
  borrowId: z.string().regex(/^[bg]_[a-z0-9]{20,64}$/, "must be b_ (keeper) or g_ (portable) and 20 to 64 characters of a-z, 0-9").optional(),
  borrowToken: z.string().regex(/^bbt_[A-Za-z0-9_-]{43,86}$/, "must be bbt_ and 43 to 86 base64url characters (32+ random bytes)").optional(),
  grantToken: z.string().regex(/^bgt_[A-Za-z0-9_-]{43,86}$/, "must be bgt_ and 43 to 86 base64url characters (32+ random bytes)").optional(),
});

type BorrowBody = z.infer<typeof borrowSchema>;

/** A keeper borrow's client-chosen id and token: both or neither, the id `b_…`; no grant token. */
export function chosenKeeper(body: BorrowBody): { borrowId: string; borrowToken: string } | null {
  if (body.grantToken !== undefined) throw new BerthError("invalid_request", "invalid_request: grantToken is only for --access portable borrows");
  if (body.borrowId === undefined && body.borrowToken === undefined) return null;
  if (body.borrowId === undefined || body.borrowToken === undefined) {
    throw new BerthError("invalid_request", "invalid_request: borrowId and borrowToken go together (a client-chosen borrow; both or neither)");
  }
  if (!body.borrowId.startsWith("b_")) throw new BerthError("invalid_request", "invalid_request: field borrowId: a keeper borrow's id starts with b_");
  return { borrowId: body.borrowId, borrowToken: body.borrowToken };
}

/** A portable borrow's client-chosen id and tokens: all three or none, the id `g_…`. */
export function chosenPortable(body: BorrowBody): { borrowId: string; borrowToken: string; grantToken: string } | null {
  const { borrowId, borrowToken, grantToken } = body;
  if (borrowId === undefined && borrowToken === undefined && grantToken === undefined) return null;
  if (borrowId === undefined || borrowToken === undefined || grantToken === undefined) {
    throw new BerthError("invalid_request", "invalid_request: borrowId, borrowToken and grantToken go together (a client-chosen portable borrow; all or none)");
  }
  if (!borrowId.startsWith("g_")) throw new BerthError("invalid_request", "invalid_request: field borrowId: a portable borrow's id starts with g_");
  return { borrowId, borrowToken, grantToken };
}

export const drainSchema = z.strictObject({ force: z.boolean().default(false) });

export const tokenSchema = z.strictObject({ token: text(200) });

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

const hostDescription = {
  url: agentUrl,
  runtime: z.enum(["process", "gvisor"]),
  /** The runsc release and gVisor platform (gvisor hosts), and a warning naming what an old runsc breaks. */
  runtimeDetail: z
    .strictObject({ runsc: z.strictObject({ version: text(64), platform: z.enum(["kvm", "systrap", "ptrace"]) }).optional(), warning: text(500).optional() })
    .optional(),
  capacity: z.strictObject({ vcpu: int(1, 4096), memoryMb: int(64, 64 * 1024 * 1024), slots: int(0, 10_000) }),
  ssh: z.strictObject({ host: text(255), port: int(1, 65535), hostKey: text(2000), fingerprint: text(200) }),
};

/** An identity proof (docs/host-identity.md): base64 SPKI public key, the coordinator's challenge, base64 signature. */
const identityProof = z.strictObject({ publicKey: text(200), challenge: text(256), signature: text(200) });

export const enrollSchema = z.strictObject({
  name: id,
  ...hostDescription,
  identity: identityProof.optional(),
});

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

export { id as idSchema };

