/**
 * Borrow receipts: the client's durable record of a borrow, holding the raw
 * borrow (and grant) tokens so that tokens never travel in argv and a lost
 * reply can be retried (`berth return --receipt FILE`). Written whole (temp,
 * fsync, rename, directory fsync) with mode 0600. Reading and checking a
 * receipt file is the CLI's (src/cli/receipt.ts); the library only writes.
 */
import { unlinkSync } from "node:fs";
import { writeFileDurable } from "../io/durable-file.js";

export interface SshEndpoint {
  host: string | null;
  port: number | null;
  user: string | null;
  /** The gateway's host key, one OpenSSH public key line; connections to anything else are refused. */
  hostKey: string | null;
}

/** One borrow as the client holds it. The tokens are secrets: never log or print a Receipt. */
export interface Receipt {
  version: 1;
  url: string;
  access: "keeper" | "portable";
  pool: string;
  borrowId: string;
  borrowToken: string;
  grantToken: string | null;
  /** Portable: the ephemeral private key file (0600), removed after the return. */
  keyFile: string | null;
  publicKey: string | null;
  machine: { id: string; generation: number; ssh: SshEndpoint };
  state: "pending" | "active" | "returned" | "expired";
  heartbeatMs: number;
  expiresAt: number;
  createdAt: number;
}

export function writeReceipt(path: string, r: Receipt): void {
  writeFileDurable(path, JSON.stringify(r, null, 2) + "\n", 0o600);
}

export function removeQuietly(path: string | null): void {
  if (!path) return;
  try {
    unlinkSync(path);
  } catch {
    /* already gone */
  }
}
