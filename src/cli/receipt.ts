/**
 * Reading a borrow receipt file (written by the client library,
 * src/client/receipt.ts): mode 0600 required, checked against a strict
 * schema; a receipt that cannot be read is an error, never "no borrow".
 */
import { readFileSync, statSync } from "node:fs";
import { z } from "zod";
import { BerthError } from "../core/errors.js";
import { ID_PATTERN } from "../core/ids.js";
import { zodRefusal } from "../core/refusal.js";
import type { Receipt } from "../client/receipt.js";

export { removeQuietly, writeReceipt, type Receipt } from "../client/receipt.js";

const receiptSchema = z.strictObject({
  version: z.literal(1),
  url: z.string().url(),
  access: z.enum(["keeper", "portable"]),
  pool: z.string().regex(ID_PATTERN, "not a valid id"),
  borrowId: z.string().regex(ID_PATTERN, "not a valid id"),
  borrowToken: z.string().min(1).max(200),
  grantToken: z.string().min(1).max(200).nullable(),
  /** Portable: the ephemeral private key file (0600), removed after cleanup. */
  keyFile: z.string().nullable(),
  publicKey: z.string().nullable(),
  machine: z.strictObject({
    id: z.string().regex(ID_PATTERN, "not a valid id"),
    generation: z.number().int(),
    ssh: z.strictObject({ host: z.string().nullable(), port: z.number().int().nullable(), user: z.string().nullable(), hostKey: z.string().nullable() }),
  }),
  state: z.enum(["pending", "active", "returned", "expired"]),
  heartbeatMs: z.number().int(),
  expiresAt: z.number().int(),
  createdAt: z.number().int(),
});

// The schema and the library's Receipt type describe the same record.
type Parsed = z.infer<typeof receiptSchema>;
const sameShape: [Parsed, Receipt] extends [Receipt, Parsed] ? true : never = true;
void sameShape;

export function readReceipt(path: string): Receipt {
  let text: string;
  try {
    const st = statSync(path);
    if ((st.mode & 0o077) !== 0) {
      throw new BerthError("invalid_request", `invalid_request: receipt ${path} is readable by others (mode ${(st.mode & 0o777).toString(8)}); it holds borrow tokens: chmod 600 it`);
    }
    text = readFileSync(path, "utf8");
  } catch (e) {
    if (e instanceof BerthError) throw e;
    throw new BerthError("invalid_request", `invalid_request: cannot read receipt ${path}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
  }
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch {
    throw new BerthError("invalid_request", `invalid_request: receipt ${path} is not valid JSON; it may be damaged (keep it: it is the only record of the borrow's tokens)`);
  }
  const parsed = receiptSchema.safeParse(raw);
  if (!parsed.success) throw zodRefusal(parsed.error, { what: `receipt ${path} is not a berth receipt`, root: "content" });
  return parsed.data;
}
