/**
 * Borrows whose id and tokens the client chose (keeper and portable), so that
 * a request whose reply was lost can be sent again and answer the same borrow.
 *
 * The first attempt reads nothing extra: it inserts the record with ON
 * CONFLICT DO NOTHING and an expected row count, so a fresh borrow — the
 * common case — costs no statement more. When the id (or a token) is already
 * recorded, the insert fails the transaction, which rolls back whole (no
 * machine taken), and a second attempt reads the earlier record first and
 * answers it. A second collision means the id is not this client's: conflict.
 */
import { BerthError } from "../../core/errors.js";

/** Fails a transaction whose client-chosen id or token is already recorded (an earlier or a concurrent request). */
export class ChosenIdTaken extends Error {}

export const chosenIdTaken = (): Error => new ChosenIdTaken();

/** Runs `attempt(false)`; after ChosenIdTaken, `attempt(true)` (read the earlier record first); then `conflict()`. */
export async function borrowOrRepeat<T>(attempt: (lookFirst: boolean) => Promise<T>, conflict: () => BerthError): Promise<T> {
  try {
    return await attempt(false);
  } catch (e) {
    if (!(e instanceof ChosenIdTaken)) throw e;
  }
  try {
    return await attempt(true);
  } catch (e) {
    if (e instanceof ChosenIdTaken) throw conflict();
    throw e;
  }
}

/** The refusal for an id (or token) that another request recorded. */
export function chosenIdConflict(id: string): BerthError {
  return new BerthError("conflict", `conflict: borrow id ${id} (or one of its tokens) is already taken by another request; choose another id and tokens`);
}
