/**
 * Running one guest program through SSM Run Command and learning its answer.
 *
 * SendCommand has no idempotency token, so a command's Comment carries the
 * berth operation id and step. For a recorded step (enroll, install_key,
 * remove_key, scrub) a retry first looks the earlier command up by that
 * comment and waits for it rather than sending another; whatever happens,
 * the guest program itself answers a finished operation id from its record
 * and takes the guest lock, so a duplicated or delayed delivery never acts
 * twice. Read-only steps (fence_prepare's boot id, boot_id) are always sent
 * fresh: an old answer would be a stale boot id.
 *
 * Each command has a short delivery timeout, so work queued for an instance
 * that is offline expires instead of running long after it was meant to (and
 * if it does run late, the generation checks in the program refuse it).
 */
import { GetCommandInvocationCommand, ListCommandsCommand, SendCommandCommand, type SSMClient } from "@aws-sdk/client-ssm";
import { guestProgram, parseGuestOutput, type GuestStep, type GuestTarget } from "./guest.js";

export type GuestOutcome =
  | { kind: "result"; value: Record<string, unknown> }
  | { kind: "refused"; code: string; message: string }
  /** The program may or may not have run (still queued, timed out, reply lost). */
  | { kind: "unknown"; why: string };

export interface Clock {
  now: () => number;
  sleep: (ms: number) => Promise<void>;
  pollMs: number;
}

const RECORDED = new Set<GuestStep["kind"]>(["enroll", "install_key", "remove_key", "scrub"]);
const PENDING = new Set(["Pending", "InProgress", "Delayed"]);
/** Seconds SSM keeps trying to deliver a command to an offline instance. 30 is the service minimum. */
export const DELIVERY_TIMEOUT_S = 30;

export function commentFor(opId: string, step: GuestStep["kind"]): string {
  return `berth ${opId} ${step}`;
}

export function errorName(e: unknown): string {
  return e && typeof e === "object" && "name" in e ? String((e as { name: unknown }).name) : "Error";
}

export function errorText(e: unknown): string {
  return `${errorName(e)}: ${e instanceof Error ? e.message : String(e)}`.slice(0, 300);
}

async function findEarlier(ssm: SSMClient, instanceId: string, comment: string): Promise<string | null> {
  let token: string | undefined;
  for (let page = 0; page < 5; page++) {
    const r = await ssm.send(new ListCommandsCommand({ InstanceId: instanceId, MaxResults: 50, NextToken: token }));
    const hit = (r.Commands ?? []).find((c) => c.Comment === comment && c.CommandId);
    if (hit) return hit.CommandId!;
    token = r.NextToken;
    if (!token) return null;
  }
  return null;
}

async function send(ssm: SSMClient, instanceId: string, program: string, comment: string): Promise<string> {
  const r = await ssm.send(
    new SendCommandCommand({
      InstanceIds: [instanceId],
      DocumentName: "AWS-RunShellScript",
      Comment: comment,
      TimeoutSeconds: DELIVERY_TIMEOUT_S,
      Parameters: { commands: [`echo ${Buffer.from(program, "utf8").toString("base64")} | base64 -d | bash`], executionTimeout: ["120"] },
    }),
  );
  const id = r.Command?.CommandId;
  if (!id) throw new Error("SendCommand answered without a command id");
  return id;
}

/** Waits for one invocation until it ends or the deadline passes. */
async function await_(ssm: SSMClient, instanceId: string, commandId: string, deadline: number, clock: Clock): Promise<GuestOutcome & { retry?: boolean }> {
  for (;;) {
    let status = "Pending";
    let stdout = "";
    try {
      const r = await ssm.send(new GetCommandInvocationCommand({ CommandId: commandId, InstanceId: instanceId }));
      status = r.Status ?? "Pending";
      stdout = r.StandardOutputContent ?? "";
    } catch (e) {
      // Right after SendCommand the invocation may not be visible yet; throttling and transport errors are retried here too.
      if (clock.now() >= deadline) return { kind: "unknown", why: `command ${commandId}: ${errorText(e)}` };
      await clock.sleep(clock.pollMs);
      continue;
    }
    if (!PENDING.has(status)) {
      const reply = parseGuestOutput(stdout);
      if (reply.kind === "result" && status === "Success") return reply;
      if (reply.kind === "refused") return reply;
      // Failed without an answer, timed out, cancelled: it may have run part way; the program is safe to run again.
      return { kind: "unknown", why: `command ${commandId} ended ${status}${reply.kind === "garbled" ? ` (${reply.output.trim().slice(0, 120)})` : ""}`, retry: true };
    }
    if (clock.now() >= deadline) return { kind: "unknown", why: `command ${commandId} is still ${status}` };
    await clock.sleep(clock.pollMs);
  }
}

/** Runs `step` on the instance and returns what the guest answered, or that the answer is unknown by `deadline`. */
export async function runGuest(ssm: SSMClient, target: GuestTarget, step: GuestStep, deadline: number, clock: Clock): Promise<GuestOutcome> {
  const comment = commentFor(target.opId, step.kind);
  const program = guestProgram(target, step);
  let commandId: string | null = null;
  try {
    if (RECORDED.has(step.kind)) commandId = await findEarlier(ssm, target.instanceId, comment);
  } catch (e) {
    return { kind: "unknown", why: `looking up earlier commands: ${errorText(e)}` };
  }
  for (let round = 0; round < 3; round++) {
    if (commandId === null) {
      try {
        commandId = await send(ssm, target.instanceId, program, comment);
      } catch (e) {
        // Maybe sent, maybe not: the next attempt looks it up by comment, and the guest would refuse a second run anyway.
        return { kind: "unknown", why: `SendCommand: ${errorText(e)}` };
      }
    }
    const out = await await_(ssm, target.instanceId, commandId, deadline, clock);
    if (out.kind !== "unknown" || !out.retry || clock.now() >= deadline) return out;
    commandId = null;
  }
  return { kind: "unknown", why: "the guest program did not give an answer in three runs" };
}
