/**
 * The client side of a borrow, shared by `berth borrow/ack/heartbeat/return`
 * and `berth run`: the ephemeral key (portable: generated here, only the
 * public key leaves), the receipt, heartbeats, and the return.
 *
 * Order on the way out: return first; only once the coordinator accepted it
 * is the receipt marked returned, and only then is the private key removed,
 * so a failed return leaves everything needed to retry
 * (`berth return --receipt FILE`).
 */
import { readFileSync } from "node:fs";
import type { Api } from "./api.js";
import { generateSshKeyPair } from "../core/ssh-keys.js";
import { writeFileDurable } from "../store/durable-file.js";
import { removeQuietly, writeReceipt, type Receipt } from "./receipt.js";
import { BerthError } from "../core/errors.js";

interface BorrowReply {
  borrowId: string;
  borrowToken: string;
  grantToken?: string;
  state?: string;
  heartbeatMs: number;
  expiresAt: number;
  ackDeadline?: number;
  machine: Receipt["machine"];
}

export async function borrow(api: Api, opts: { url: string; pool: string; access: "keeper" | "portable"; durationMs?: number; receiptPath: string }): Promise<Receipt> {
  let keyFile: string | null = null;
  let publicKey: string | null = null;
  const body: Record<string, unknown> = { access: opts.access };
  if (opts.access === "portable") {
    const pair = generateSshKeyPair("berth-borrow");
    keyFile = `${opts.receiptPath}.key`;
    writeFileDurable(keyFile, pair.privateKey, 0o600);
    publicKey = pair.publicKey;
    body.publicKey = pair.publicKey;
    if (opts.durationMs !== undefined) body.durationMs = opts.durationMs;
  }
  let r: BorrowReply;
  try {
    r = await api.call<BorrowReply>("POST", `/v1/pools/${encodeURIComponent(opts.pool)}/borrow`, body);
  } catch (e) {
    removeQuietly(keyFile);
    throw e;
  }
  const receipt: Receipt = {
    version: 1,
    url: opts.url,
    access: opts.access,
    pool: opts.pool,
    borrowId: r.borrowId,
    borrowToken: r.borrowToken,
    grantToken: r.grantToken ?? null,
    keyFile,
    publicKey,
    machine: r.machine,
    state: opts.access === "portable" ? "pending" : "active",
    heartbeatMs: r.heartbeatMs,
    expiresAt: r.expiresAt,
    createdAt: Date.now(),
  };
  writeReceipt(opts.receiptPath, receipt);
  return receipt;
}

export async function ack(api: Api, receipt: Receipt, receiptPath: string): Promise<Receipt> {
  if (receipt.access !== "portable") return receipt;
  const r = await api.call<{ state: string; expiresAt: number; machine: Receipt["machine"] & { state: string } }>("POST", `/v1/borrows/${receipt.borrowId}/ack`, {
    token: receipt.borrowToken,
    grantToken: receipt.grantToken,
    publicKey: receipt.publicKey,
  });
  if (r.state !== "active") throw new BerthError("operation_failed", `operation_failed: borrow ${receipt.borrowId} is ${r.state} after acknowledgement, not active`);
  const next: Receipt = { ...receipt, state: "active", expiresAt: r.expiresAt, machine: { id: r.machine.id, generation: r.machine.generation, ssh: r.machine.ssh } };
  writeReceipt(receiptPath, next);
  return next;
}

export async function heartbeat(api: Api, receipt: Receipt): Promise<{ heartbeatDeadline: number; expiresAt: number }> {
  return api.call("POST", `/v1/borrows/${receipt.borrowId}/heartbeat`, { token: receipt.borrowToken, ...(receipt.grantToken ? { grantToken: receipt.grantToken } : {}) });
}

export interface ReturnOutcome {
  state: string;
  cleanup: string | null;
}

export async function giveBack(api: Api, receipt: Receipt, receiptPath: string, disposition: "ready" | "drain"): Promise<ReturnOutcome> {
  const r = await api.call<{ state: string; cleanup?: string }>("POST", `/v1/borrows/${receipt.borrowId}/return`, {
    token: receipt.borrowToken,
    disposition,
    ...(receipt.grantToken ? { grantToken: receipt.grantToken } : {}),
  });
  writeReceipt(receiptPath, { ...receipt, state: "returned" });
  // The key goes only after the return is durable on both sides.
  removeQuietly(receipt.keyFile);
  return { state: r.state, cleanup: r.cleanup ?? null };
}

export function privateKeyFor(receipt: Receipt, keeperKeyFile: string | null): string {
  const file = receipt.access === "portable" ? receipt.keyFile : keeperKeyFile;
  if (!file) throw new BerthError("invalid_request", "invalid_request: no private key for this keeper pool; `berth up` writes one, or set keeperKeyFile in the client config");
  return readFileSync(file, "utf8");
}
