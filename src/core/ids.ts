/**
 * The one id constructor. Every id that appears in a URL path or a stored
 * record (pools, machines, borrows, grants, hosts, operations, claims,
 * allocations, orgs) goes through `parseId`, for requests and for records
 * read back alike: one path segment of `[A-Za-z0-9_-]{1,128}`.
 */
import { BerthError } from "./errors.js";

declare const idBrand: unique symbol;
export type Id = string & { readonly [idBrand]: true };

export const ID_PATTERN = /^[A-Za-z0-9_-]{1,128}$/;

export function isId(s: unknown): s is Id {
  return typeof s === "string" && ID_PATTERN.test(s);
}

export function parseId(s: unknown, what = "id"): Id {
  if (!isId(s)) {
    const shown = typeof s === "string" ? JSON.stringify(s.length > 40 ? s.slice(0, 40) + "…" : s) : typeof s;
    throw new BerthError(
      "invalid_id",
      `invalid_id: ${what} ${shown} is not a valid id; use 1 to 128 characters of A-Z, a-z, 0-9, '_' or '-'`,
    );
  }
  return s;
}

const ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789";

/** A fresh id `<prefix>_<20 random base36 chars>`, from the given random bytes source. */
export function newId(prefix: string, randomBytes: (n: number) => Uint8Array): Id {
  const bytes = randomBytes(20);
  let s = prefix + "_";
  for (const b of bytes) s += ALPHABET[b % 36];
  return parseId(s);
}
