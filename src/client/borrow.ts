/**
 * One borrow as the client library holds it: the coordinator's answer (the
 * machine, its SSH endpoint and pinned host key, the hard deadline), the
 * borrow's secret tokens, and for portable access the per-borrow private key.
 *
 * The tokens and key stay inside: `toJSON()` and `inspect` show only what is
 * safe to print. When the borrow has a receipt file, every change of state
 * is written to it (whole, 0600) before the caller sees it.
 */
import { inspect } from "node:util";
import { removeQuietly, writeReceipt, type Receipt } from "./receipt.js";
import type { SshConnection } from "./ssh.js";

export type Access = "keeper" | "portable";

export class Borrow {
  #receipt: Receipt;
  readonly #privateKey: string | null;
  /** The SSH connection `BerthClient.ssh()` opened for this borrow (closed on return). */
  connection: Promise<SshConnection> | null = null;

  constructor(
    receipt: Receipt,
    /** The receipt file, or null for a borrow held only in memory. */
    readonly receiptPath: string | null,
    /** Portable: the per-borrow private key, when it is held in memory. */
    privateKey: string | null = null,
  ) {
    this.#receipt = receipt;
    this.#privateKey = privateKey;
  }

  get id(): string {
    return this.#receipt.borrowId;
  }
  get access(): Access {
    return this.#receipt.access;
  }
  get pool(): string {
    return this.#receipt.pool;
  }
  get machine(): Receipt["machine"] {
    return this.#receipt.machine;
  }
  /** pending (portable, before ack) · active · returned · expired */
  get state(): Receipt["state"] {
    return this.#receipt.state;
  }
  /** The hard deadline (epoch ms), fixed at issue; heartbeats never move it. */
  get expiresAt(): number {
    return this.#receipt.expiresAt;
  }
  get heartbeatMs(): number {
    return this.#receipt.heartbeatMs;
  }
  /** The whole record, tokens included: keep it secret. */
  get receipt(): Receipt {
    return this.#receipt;
  }
  get privateKey(): string | null {
    return this.#privateKey;
  }

  /** Record a new state (written to the receipt file first, when there is one). */
  update(next: Receipt): void {
    if (this.receiptPath) writeReceipt(this.receiptPath, next);
    this.#receipt = next;
  }

  /**
   * After the coordinator accepted the return: the receipt is marked returned
   * (or removed), and only then the private key file goes.
   */
  returned(opts: { keepReceipt: boolean }): void {
    const next: Receipt = { ...this.#receipt, state: "returned" };
    if (this.receiptPath && opts.keepReceipt) writeReceipt(this.receiptPath, next);
    else removeQuietly(this.receiptPath);
    this.#receipt = next;
    removeQuietly(next.keyFile);
  }

  toJSON(): Record<string, unknown> {
    const r = this.#receipt;
    return { id: r.borrowId, access: r.access, pool: r.pool, state: r.state, machine: r.machine, expiresAt: r.expiresAt, heartbeatMs: r.heartbeatMs, receipt: this.receiptPath };
  }

  [inspect.custom](): string {
    return `Borrow ${inspect(this.toJSON())}`;
  }
}
