/**
 * The request bodies the coordinator accepts are the API contract's
 * (src/protocol/api.ts); here, the checks a schema cannot say alone.
 */
import type { z } from "zod";
import { BerthError } from "../../core/errors.js";
import type { borrowSchema } from "../../protocol/api.js";

export {
  ensureSchema,
  registerSchema,
  borrowSchema,
  drainSchema,
  returnSchema,
  ackSchema,
  heartbeatSchema,
  reportSchema,
  enrollSchema,
  emptySchema,
  hostSessionSchema,
  hostDescribeSchema,
  hostActiveSchema,
  stoppedReportsSchema,
  activateSchema,
  removeHostSchema,
  createAllocationSchema,
  planSchema,
  releaseAllocationSchema,
  resolveAllocationSchema,
  budgetSchema,
  standingSchema,
  removeImageSchema,
  idSchema,
} from "../../protocol/api.js";

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
