/**
 * The coordinator ↔ agent contract beside the operations (operations.ts):
 * for every agent route the coordinator calls, the reply it reads, as a zod
 * schema. The coordinator parses each answer with `parseAgentReply`; an
 * answer that does not match is a BerthError `invalid_agent_reply` naming the
 * route and the first offending field, never a value cast to a type it does
 * not have. (The agent's own routes are src/agent/http.ts, alloc-http.ts and
 * images/http.ts; the agent → coordinator calls are parsed by
 * src/protocol/api.ts.)
 *
 * Replies are read as loose objects: fields not named here are kept as they
 * came (a newer agent may answer more), the named ones must hold.
 */
import { z } from "zod";
import { BerthError } from "../core/errors.js";
import type { IssueLike } from "../core/refusal.js";
import { imageView, volumeCheck } from "./api.js";

const o = z.looseObject;
const n = z.number();
const s = z.string();

/** A refusal as every agent route answers it (src/http/server.ts). */
export const agentErrorBody = o({ error: o({ code: s, message: s }).optional() });

const holdRecord = o({ allocationId: s, machineId: s, generation: n, state: z.enum(["held", "released", "fenced"]), vcpu: n, memoryMib: n, takenAt: n, releasedAt: n.nullable() });
const agentVolume = o({ allocationId: s, state: s, path: s, dev: s.nullable(), ino: s.nullable(), diskMib: n.nullable().optional(), diskEnforced: z.boolean().nullable().optional(), diskWhy: s.nullable().optional(), check: o({ ok: z.boolean(), problems: z.array(s) }).nullable().optional() });

export const AGENT_API = {
  /** The envelope of a done operation; its `result` is parsed per kind (operations.ts `parseOperationResult`). */
  "POST /v1/agent/ops": o({ result: z.unknown() }),
  "GET /v1/agent/holds/{allocation}": holdRecord,
  "POST /v1/agent/holds/{allocation}/observe": holdRecord,
  "GET /v1/agent/holds/{allocation}/sandbox": o({ sandbox: s, why: s.nullable().optional() }),
  "POST /v1/agent/standing": o({ epoch: n, standing: s }),
  "GET /v1/agent/volumes": o({ volumes: z.array(agentVolume), quarantined: z.array(s) }),
  "GET /v1/agent/volumes/{allocation}": agentVolume,
  "POST /v1/agent/volumes/{allocation}/verify": volumeCheck,
  "POST /v1/agent/volumes/{allocation}/reset": o({ removed: n }),
  "POST /v1/agent/volumes/{allocation}/remove": o({ allocationId: s, state: s }),
  "POST /v1/agent/volume-quarantine/{name}/remove": o({ removed: s }),
  "GET /v1/agent/images": o({ images: z.array(imageView), maxBytes: n.nullable(), usedBytes: n }),
  "POST /v1/agent/images/{image}/remove": o({ id: s, size: n }),
  "POST /v1/agent/machines/{machine}/network-check": z.discriminatedUnion("ok", [
    o({ ok: z.literal(true), digest: s, reprobed: z.boolean(), tookMs: n.min(0).optional() }),
    o({ ok: z.literal(false), why: s, diff: z.array(s) }),
  ]),
  // callProof may be absent (an agent built before the proof): the switch then refuses it as
  // `unauthorized`, naming why, rather than as an answer off contract.
  "POST /v1/agent/identity/prepare": o({ publicKey: s, signature: s, callProof: s.optional(), step: s }),
} as const satisfies Record<string, z.ZodType>;

export type AgentRoute = keyof typeof AGENT_API;
export type AgentReply<R extends AgentRoute> = z.output<(typeof AGENT_API)[R]>;

/** The request path of an agent `route` with its params, each one encoded segment. */
export function agentPath(route: AgentRoute, params: Record<string, string> = {}): string {
  return route.slice(route.indexOf(" ") + 1).replace(/\{([^}]+)\}/g, (_, name: string) => {
    const v = params[name];
    if (v === undefined) throw new Error(`agent route ${route}: no value for {${name}}`);
    return encodeURIComponent(v);
  });
}

/** Why an agent's answer does not match its route's schema: the first offending field, by its path. */
export function agentReplyMismatch(route: string, issues: readonly IssueLike[]): BerthError {
  const issue = issues[0];
  const at = (issue?.path ?? []).map(String).join(".") || "reply";
  const what = issue === undefined ? "is invalid" : issue.message;
  return new BerthError("invalid_agent_reply", `invalid_agent_reply: the agent's answer to ${route} does not match the contract: field ${at}: ${what} (an agent of another version?)`);
}

/** The agent's answer to `route`, parsed; throws `invalid_agent_reply` when it does not match. */
export function parseAgentReply<R extends AgentRoute>(route: R, body: unknown): AgentReply<R> {
  const p = AGENT_API[route].safeParse(body);
  if (!p.success) throw agentReplyMismatch(route, p.error.issues);
  return p.data as AgentReply<R>;
}

/** The code and message of an agent's refusal body; null members when it names none. */
export function agentRefusal(body: unknown): { code: string | null; message: string | null } {
  const p = agentErrorBody.safeParse(body);
  const e = p.success ? p.data.error : undefined;
  return { code: e?.code ?? null, message: e?.message ?? null };
}
