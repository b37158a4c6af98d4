/** Due rows of portable grants (ack deadlines, heartbeat and hard expiry). */
import type { Ctx } from "../context.js";
import type { Tx } from "../../store/store.js";
import { handleGrantDueRow } from "./grants.js";

export async function handleGrantDue(tx: Tx, ctx: Ctx, kind: "ack" | "grant", ref: string, now: number, seed: Uint8Array): Promise<void> {
  const work = await handleGrantDueRow(tx, ctx, kind, ref, now, Buffer.from(seed.subarray(0, 8)).toString("hex"));
  if (work) ctx.kick();
}
