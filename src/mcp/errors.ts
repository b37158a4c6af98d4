/**
 * Tool errors of `berth mcp`. A refusal is never a protocol failure: it is a
 * tool result with `isError: true` whose text starts with a stable code, then
 * what happened, then one line saying what to do — written for a model that
 * reads it and tries again.
 *
 * Codes: every code of berth's API (src/core/errors.ts: `pool_exhausted`,
 * `borrow_expired`, …) passes through unchanged, plus the ones only this
 * server can give (below).
 */
import { BerthError, isBerthError } from "../core/errors.js";
import { ApiError } from "../client/http.js";

/** Codes only `berth mcp` gives (the API's own codes pass through as they are). */
type McpOnlyCode =
  /** The handle is not a machine this session borrowed (another session's, another organisation's, or made up). */
  | "unknown_handle"
  /** The handle was returned by this session; a returned machine is never used again. */
  | "machine_returned"
  /** The command ran past its timeout and was ended. */
  | "command_timeout"
  /** A path resolves outside the machine's workspace. */
  | "path_outside_workspace"
  /** The file is larger than the tool's limit for one call. */
  | "file_too_large"
  /** The path does not exist, or is not the kind of file the tool needs. */
  | "file_not_found"
  /** read_output: no such output in this session (or it was deleted with its machine's return). */
  | "unknown_output";

/** A hint for every code only `berth mcp` gives, and for the API codes a tool meets most. */
const HINTS: Record<McpOnlyCode, string> & Record<string, string> = {
  unknown_handle: "use a handle returned by borrow_machine in this session, or borrow a new machine",
  machine_returned: "borrow a new machine with borrow_machine",
  command_timeout: "run it with a larger timeout_seconds, or in the background (shell: true, `nohup CMD >log 2>&1 &`) and poll",
  path_outside_workspace: "use a path relative to the workspace (or an absolute path under it) without .. leaving it, and no symbolic link out of it",
  file_too_large: "read it in parts with offset and length, or compress it on the machine first",
  file_not_found: "list the directory with list_files",
  unknown_output: "use the output_id a run_command result gave in this session (outputs are kept until the session ends)",
  pool_exhausted: "wait a few seconds and borrow again, or pass wait_seconds",
  borrow_expired: "the machine's hard deadline passed; borrow a new machine",
  duration_too_long: "ask a shorter duration: the pool's machines do not live that long",
  grant_expired: "the machine's hard deadline passed; borrow a new machine",
  not_found: "call list_pools for the pools you may borrow from",
  forbidden: "this token may not do that; ask an operator",
  unauthorized: "the token of `berth mcp` is not accepted; check BERTH_TOKEN_FILE",
  provider_unavailable: "the machine or coordinator could not be reached; try again, or return the machine and borrow another",
  operation_failed: "return the machine and borrow another",
  namespace_conflict: "borrow from a pool of the access mode list_pools shows",
  invalid_request: "check the arguments against the tool's schema",
};

export class ToolError extends Error {
  constructor(
    readonly code: string,
    message: string,
    /** Extra fields for the result (e.g. a timed-out command's partial output). */
    readonly details: Record<string, unknown> = {},
  ) {
    super(message);
    this.name = "ToolError";
  }
}

export interface ToolErrorResult {
  [k: string]: unknown;
  isError: true;
  content: { type: "text"; text: string }[];
}

/** The code and message of any refusal; an unexpected error is `internal` with its message only. */
export function codeOf(e: unknown): { code: string; message: string } {
  if (e instanceof ToolError) return { code: e.code, message: e.message };
  if (e instanceof ApiError || isBerthError(e)) return { code: e.code, message: e.message };
  const err = e as NodeJS.ErrnoException;
  if (err?.code === "ECONNREFUSED") return { code: "provider_unavailable", message: `provider_unavailable: cannot reach the coordinator (${err.message})` };
  return { code: "internal", message: `internal: ${err instanceof Error ? err.message : String(e)}` };
}

/** The tool result for a refusal: `code: message` on the first line, `hint: …` on the second, then details as JSON. */
export function toolError(e: unknown): ToolErrorResult {
  const { code, message } = codeOf(e);
  const text = message.startsWith(`${code}:`) ? message : `${code}: ${message}`;
  const hint = HINTS[code];
  const details = e instanceof ToolError && Object.keys(e.details).length > 0 ? `\n${JSON.stringify({ code, ...e.details }, null, 2)}` : "";
  return { isError: true, content: [{ type: "text", text: `${text}${hint ? `\nhint: ${hint}` : ""}${details}` }] };
}

export function invalid(message: string): BerthError {
  return new BerthError("invalid_request", `invalid_request: ${message}`);
}

/** A base64 argument decoded, or `invalid_request` naming it. */
export function decodeBase64(s: string, what: string): Buffer {
  if (!/^[A-Za-z0-9+/\s]*={0,2}\s*$/.test(s)) throw invalid(`${what} is not base64`);
  return Buffer.from(s, "base64");
}
