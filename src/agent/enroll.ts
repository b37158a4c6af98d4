/**
 * Enrollment: the agent introduces itself to the coordinator.
 *
 *   POST {coordinator}/v1/hosts/enroll
 *   Authorization: Bearer <enroll token>
 *   {name, url, runtime, runtimeDetail: {runsc?: {version, platform}, warning?},
 *    capacity: {vcpu, memoryMib, diskMib, slots}, ssh: {host, port, hostKey, fingerprint},
 *    identity?: {publicKey, challenge, signature}}
 *   -> {hostId, hostCallToken, identity?: "active"}
 *
 * With `identity` (every agent since host identity, docs/host-identity.md)
 * the agent proves its identity key; a new host is then recorded with it and
 * answered `identity: "active"`: the enroll token is never used for it again.
 * Without it (an agent built before), the host stays on the shared token.
 *
 * The enroll token comes from a file or BERTH_ENROLL_TOKEN, never argv, and
 * is never logged. The agent keeps `hostId` and only the hash of the
 * host-call token (hashToken("host-call", …)) in its store. On restart it
 * enrolls again under the same name (the coordinator keeps the host of that
 * name and learns the new URL and SSH port); a coordinator answering with a
 * different host id is refused, since this state directory's machines belong
 * to the stored one.
 */
import { readFileSync, statSync } from "node:fs";
import { z } from "zod";
import { BerthError } from "../core/errors.js";
import { parseId, type Id } from "../core/ids.js";
import { postToCoordinator, refusalOf } from "./coordinator-call.js";
import type { RuntimeDetail } from "./runtime/types.js";

export interface EnrollRequest {
  name: string;
  url: string;
  runtime: string;
  runtimeDetail: RuntimeDetail;
  capacity: { vcpu: number; memoryMib: number; diskMib: number; slots: number };
  ssh: { host: string; port: number; hostKey: string; fingerprint: string };
}

export interface Enrollment {
  hostId: Id;
  hostCallToken: string;
  /** "active": the coordinator recorded this host's identity key. */
  identity?: "active";
}

export interface IdentityProof {
  publicKey: string;
  challenge: string;
  signature: string;
}

/** A refusal by the coordinator (4xx): retrying with the same token will not help. */
export class EnrollRefusedError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
    this.name = "EnrollRefusedError";
  }
}

const responseSchema = z.object({
  hostId: z.string(),
  hostCallToken: z.string().min(16).max(512),
  identity: z.literal("active").optional(),
});

export async function enroll(coordinatorUrl: string, enrollToken: string, body: EnrollRequest, identity?: IdentityProof, timeoutMs = 15_000): Promise<Enrollment> {
  const payload = identity === undefined ? body : { ...body, identity };
  const res = await postToCoordinator(coordinatorUrl, "/v1/hosts/enroll", "the enrollment", { authorization: `Bearer ${enrollToken}` }, payload, timeoutMs);
  if (res.status < 200 || res.status > 299) {
    const { code, message } = refusalOf(res.status, res.text);
    const what = `the coordinator refused the enrollment (${res.status} ${code}): ${message}`;
    if (res.status >= 400 && res.status < 500) throw new EnrollRefusedError(res.status, code, what);
    throw new Error(what);
  }
  let parsed: z.infer<typeof responseSchema>;
  try {
    parsed = responseSchema.parse(JSON.parse(res.text));
  } catch {
    throw new Error("the coordinator's enrollment answer is not {hostId, hostCallToken}");
  }
  return { hostId: parseId(parsed.hostId, "hostId"), hostCallToken: parsed.hostCallToken, ...(parsed.identity ? { identity: parsed.identity } : {}) };
}

/**
 * The enroll token: from `file` (owner-only permissions recommended) or the
 * BERTH_ENROLL_TOKEN environment variable. Never from argv.
 */
export function readEnrollToken(file: string | undefined, env: NodeJS.ProcessEnv): string | null {
  if (file !== undefined) {
    let text: string;
    try {
      statSync(file);
      text = readFileSync(file, "utf8");
    } catch (e) {
      throw new BerthError("invalid_request", `invalid_request: cannot read the enroll token file ${file} (${(e as NodeJS.ErrnoException).code ?? "error"})`);
    }
    const token = text.trim();
    if (token === "" || /\s/.test(token)) {
      throw new BerthError("invalid_request", `invalid_request: the enroll token file ${file} must hold exactly one token`);
    }
    return token;
  }
  const fromEnv = env.BERTH_ENROLL_TOKEN?.trim();
  return fromEnv === undefined || fromEnv === "" ? null : fromEnv;
}
