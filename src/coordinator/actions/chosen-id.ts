/**
 * Borrows whose id and tokens the client chose (keeper and portable), so that
 * a request whose reply was lost can be sent again and answer the same borrow.
 *
 * The borrow itself reads nothing extra: it inserts the record with ON
 * CONFLICT DO NOTHING and an expected row count, so a fresh borrow — the
 * common case — costs no statement more. When the id (or a token) is already
 * recorded, the insert fails the transaction, which rolls back whole (no
 * machine taken); then one more transaction reads the earlier record and
 * answers it. No earlier record under that id (a token collided) is a
 * conflict, as is a record of another client (checked by the caller's
 * `earlier`).
 */
import { BerthError } from "../../core/errors.js";

/** Fails a transaction whose client-chosen id or token is already recorded (an earlier or a concurrent request). */
export class ChosenIdTaken extends Error {}

export const chosenIdTaken = (): Error => new ChosenIdTaken();

/** Runs `borrow`; when its chosen id was taken, answers `earlier()` instead, or conflict when there is none. */
export async function borrowOrRepeat<T>(id: string, borrow: () => Promise<T>, earlier: () => Promise<T | null>): Promise<T> {
  try {
    return await borrow();
  } catch (e) {
    if (!(e instanceof ChosenIdTaken)) throw e;
  }
  const answer = await earlier();
  if (answer === null) throw chosenIdConflict(id);
  return answer;
}

/** The refusal for an id (or token) that another request recorded. */
export function chosenIdConflict(id: string): BerthError {
  return new BerthError("conflict", `conflict: borrow id ${id} (or one of its tokens) is already taken by another request; choose another id and tokens`);
}
