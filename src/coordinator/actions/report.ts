/**
 * A borrower's telemetry (`POST /v1/borrows/{id}/report`): the first command's
 * and the scrub's timings as the client saw them. Recorded as observed, never
 * used as proof of anything, and only from the borrow's own holder: the
 * borrow (or grant) must exist in the caller's organisation and the request
 * must carry its borrow token.
 */
import { BerthError } from "../../core/errors.js";
import { hashToken, sameHash } from "../../core/tokens.js";
import { readBorrowTokenHash } from "../../store/borrows.js";
import type { Principal } from "../auth.js";
import type { Ctx } from "../context.js";

export async function reportTelemetry(ctx: Ctx, p: Principal, borrowId: string, body: { token: string; firstCommandMs?: number; scrubMs?: number }): Promise<{ recorded: true }> {
  const row = await ctx.store.transaction((tx) => readBorrowTokenHash(tx, borrowId));
  if (!row || row.org !== p.org) throw new BerthError("not_found", `not_found: no borrow ${borrowId} in this organisation`);
  if (!sameHash(row.token_hash, hashToken("borrow", body.token))) throw new BerthError("token_mismatch", `token_mismatch: the borrow token does not match borrow ${borrowId}`);
  if (body.firstCommandMs !== undefined) ctx.metrics.clientReports.observe({ kind: "first_command" }, body.firstCommandMs / 1000);
  if (body.scrubMs !== undefined) ctx.metrics.clientReports.observe({ kind: "scrub" }, body.scrubMs / 1000);
  return { recorded: true };
}
