/**
 * The one refusal formatter: a zod failure becomes a BerthError whose message
 * names the first offending field by its full path, for every reader of
 * untrusted input (HTTP bodies of coordinator and agent, an operation's
 * arguments, a receipt on disk). Unknown fields are named with their full
 * path ("identity.tag"), so a nested one is found at once; a field that must
 * be an id fails as `invalid_id`, the way a path id does.
 *
 * Pure: no I/O, no server code; the HTTP layer, the protocol and the CLI use it.
 */
import { BerthError } from "./errors.js";

/** The parts of a zod issue the formatter reads (zod 4's `$ZodIssue`). */
export interface IssueLike {
  readonly code: string;
  readonly path: ReadonlyArray<PropertyKey>;
  readonly message: string;
  readonly keys?: readonly string[];
  readonly params?: Record<string, unknown>;
}

export interface RefusalContext {
  /** What was being read, when it is not the request body: "receipt ./r.json", "install_key". */
  what?: string;
  /** Path prefix of the value inside its document ("args"); the name used when the value itself is wrong. */
  at?: string;
  /** What to send instead, after "; ". */
  hint?: string;
  /** The name of the value itself when it is wrong as a whole (default "body"). */
  root?: string;
}

/** Marks a zod refinement whose failure is an `invalid_id` refusal. */
export const INVALID_ID_PARAMS = { berth: "invalid_id" } as const;

export function refusalFromIssues(issues: readonly IssueLike[], c: RefusalContext = {}): BerthError {
  const issue = issues[0];
  const base = c.at ? [c.at] : [];
  const at = [...base, ...(issue?.path ?? []).map(String)];
  const field = at.length > 0 ? at.join(".") : (c.root ?? "body");
  let code: "invalid_id" | "invalid_request" = "invalid_request";
  let what: string;
  if (issue === undefined) what = `${field} is invalid`;
  else if (issue.code === "unrecognized_keys") {
    what = `unknown field ${(issue.keys ?? []).map((k) => [...at, k].join(".")).join(", ")}`;
  } else if (issue.code === "custom" && issue.params?.berth === INVALID_ID_PARAMS.berth) {
    code = "invalid_id";
    what = `field ${field} ${issue.message}`;
  } else what = at.length > 0 ? `field ${field}: ${issue.message}` : `${field}: ${issue.message}`;
  const prefix = c.what ? `${c.what}: ` : "";
  const hint = c.hint ? `; ${c.hint}` : "";
  return new BerthError(code, `${code}: ${prefix}${what}${hint}`);
}

/** A zod error (`safeParse(...).error`) as a refusal. */
export function zodRefusal(error: { readonly issues: readonly IssueLike[] }, c: RefusalContext = {}): BerthError {
  return refusalFromIssues(error.issues, c);
}
