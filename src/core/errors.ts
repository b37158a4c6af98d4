/**
 * Every refusal in berth is a BerthError: a stable `code` that scripts match
 * on, a message written for the person reading it, and the HTTP status the
 * API answers with. Messages never carry secrets (tokens, private keys).
 */
export type ErrorCode =
  | "invalid_id"
  | "invalid_request"
  | "body_too_large"
  | "rate_limited"
  | "too_many_connections"
  | "request_timeout"
  | "unauthorized"
  | "forbidden"
  | "not_found"
  | "conflict"
  | "pool_exhausted"
  | "borrow_not_active"
  | "borrow_expired"
  | "duration_too_long"
  | "generation_mismatch"
  | "claim_consumed"
  | "claim_expired"
  | "claim_not_found"
  | "namespace_conflict"
  | "portable_unsupported"
  | "grant_expired"
  | "grant_not_pending"
  | "token_mismatch"
  | "key_mismatch"
  | "provider_unavailable"
  | "operation_failed"
  | "store_busy"
  | "method_not_allowed"
  | "not_admitted"
  | "budget_exhausted"
  | "no_capacity"
  | "host_activated"
  | "host_exists"
  | "host_awaiting"
  | "host_busy"
  | "host_switching"
  | "host_withdrawn"
  | "image_invalid"
  | "image_unavailable"
  | "image_too_large"
  | "network_tampered"
  | "sftp_unavailable"
  | "transfer_cut"
  | "disk_full"
  | "disk_not_enforceable"
  | "aborted"
  | "invalid_agent_reply"
  | "internal";

const STATUS: Record<ErrorCode, number> = {
  invalid_id: 400,
  invalid_request: 400,
  body_too_large: 413,
  /** Too many requests without a token from one client address (`retry-after` says when to come back). */
  rate_limited: 429,
  /** A connection over the server's caps (total, per client address). */
  too_many_connections: 503,
  /** A request that did not arrive whole within the server's header or request deadline. */
  request_timeout: 408,
  unauthorized: 401,
  forbidden: 403,
  not_found: 404,
  conflict: 409,
  pool_exhausted: 503,
  borrow_not_active: 409,
  borrow_expired: 409,
  /** A keeper borrow asked for longer than any machine of its pool lives (hard TTL less the rotation margin). */
  duration_too_long: 400,
  generation_mismatch: 409,
  claim_consumed: 409,
  claim_expired: 409,
  claim_not_found: 404,
  namespace_conflict: 409,
  portable_unsupported: 400,
  grant_expired: 409,
  grant_not_pending: 409,
  token_mismatch: 403,
  key_mismatch: 403,
  provider_unavailable: 503,
  operation_failed: 502,
  store_busy: 503,
  method_not_allowed: 405,
  not_admitted: 403,
  budget_exhausted: 409,
  no_capacity: 503,
  host_activated: 403,
  host_exists: 409,
  host_awaiting: 401,
  host_busy: 409,
  host_switching: 409,
  host_withdrawn: 409,
  /** The image is malformed, fails its digests, escapes its root, or is for another platform: retrying will not help. */
  image_invalid: 422,
  /** A machine's network rules are not the ones recorded with its evidence: it is never lent again. */
  network_tampered: 409,
  /** The image's registry or file could not be reached or read: retried. */
  image_unavailable: 502,
  /** The image (or a layer of it) is over the agent's image cache limit. */
  image_too_large: 413,
  /** The machine has no SFTP server (an image without openssh-sftp-server). */
  sftp_unavailable: 422,
  /** A file transfer ended before it was complete: the borrow was returned or expired, or the connection was lost. */
  transfer_cut: 502,
  /** A write on the machine failed and its file system has less free space than the file needs. */
  disk_full: 507,
  /** A volume's disk limit was asked for (`--disk-enforce required`) and this host cannot make or mount its image. */
  disk_not_enforceable: 409,
  /** The caller stopped the transfer (MachineFiles.abort, Ctrl-C in `berth cp`). */
  aborted: 499,
  /** An agent answered the coordinator with a body off the coordinator↔agent contract (src/protocol/agent-api.ts). */
  invalid_agent_reply: 502,
  internal: 500,
};

export class BerthError extends Error {
  readonly code: ErrorCode;
  readonly status: number;
  constructor(code: ErrorCode, message: string) {
    super(message);
    this.name = "BerthError";
    this.code = code;
    this.status = STATUS[code];
  }
}

/** Whether `code` is one of berth's stable codes (e.g. one an agent answered with). */
export function isErrorCode(code: string): code is ErrorCode {
  return Object.hasOwn(STATUS, code);
}

export function isBerthError(e: unknown): e is BerthError {
  return e instanceof BerthError;
}

/** Exhaustiveness guard for closed unions: a new arm fails to compile. */
export function assertNever(x: never, what = "value"): never {
  throw new Error(`unexpected ${what}: ${JSON.stringify(x)}`);
}
