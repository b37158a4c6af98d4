/**
 * Who may hold an SSH connection to the gateway before authenticating
 * (docs/operations.md "Timeouts and limits"). A TCP connection is admitted
 * only while the unauthenticated connections stay under two caps (in total,
 * and per client address); one over a cap gets one line saying so and is
 * closed. An admitted connection that has not authenticated within the
 * authentication timeout (counted from the TCP connection, so a client that
 * never sends its SSH version line is covered too) is destroyed. Once
 * authenticated it no longer counts: it holds a key.
 */
import type { Socket } from "node:net";

export interface SshAdmissionLimits {
  /** A connection must authenticate within this from its TCP connection. */
  authTimeoutMs: number;
  /** Unauthenticated connections at once; 0: no cap. */
  maxUnauthenticated: number;
  /** Unauthenticated connections at once from one client address; 0: no cap. */
  maxUnauthenticatedPerAddress: number;
}

export const DEFAULT_SSH_ADMISSION: SshAdmissionLimits = { authTimeoutMs: 30_000, maxUnauthenticated: 128, maxUnauthenticatedPerAddress: 32 };

export type SshRefusal = "unauthenticated" | "unauthenticated_per_address" | "auth_timeout";

interface Pending {
  socket: Socket;
  address: string;
  timer: NodeJS.Timeout;
}

export class SshAdmission {
  readonly limits: SshAdmissionLimits;
  readonly #pending = new Map<string, Pending>();
  readonly #byAddress = new Map<string, number>();

  constructor(
    limits: Partial<SshAdmissionLimits>,
    private readonly onRefused: (reason: SshRefusal, address: string) => void,
  ) {
    this.limits = { ...DEFAULT_SSH_ADMISSION, ...limits };
  }

  /** Unauthenticated connections held now. */
  get pending(): number {
    return this.#pending.size;
  }

  /** Admits a new TCP connection (true), or refuses and closes it (false). */
  admit(socket: Socket): boolean {
    const address = socket.remoteAddress ?? "";
    const key = `${address}|${socket.remotePort ?? 0}`;
    const mine = this.#byAddress.get(address) ?? 0;
    const { maxUnauthenticated: max, maxUnauthenticatedPerAddress: perAddress } = this.limits;
    const refused: SshRefusal | null =
      max > 0 && this.#pending.size >= max ? "unauthenticated" : perAddress > 0 && mine >= perAddress ? "unauthenticated_per_address" : null;
    if (refused !== null) {
      this.onRefused(refused, address);
      socket.on("error", () => undefined);
      // Lines before the version string are allowed (RFC 4253 4.2); `ssh -v` shows this one.
      socket.end(
        refused === "unauthenticated"
          ? `berth: too many unauthenticated SSH connections (limit ${max}); try again shortly\r\n`
          : `berth: too many unauthenticated SSH connections from this address (limit ${perAddress}); try again shortly\r\n`,
      );
      socket.destroySoon();
      setTimeout(() => socket.destroy(), 1000).unref();
      return false;
    }
    this.#byAddress.set(address, mine + 1);
    const timer = setTimeout(() => {
      if (!this.#pending.has(key)) return;
      this.onRefused("auth_timeout", address);
      socket.destroy();
    }, this.limits.authTimeoutMs);
    timer.unref();
    this.#pending.set(key, { socket, address, timer });
    socket.once("close", () => this.#forget(key));
    return true;
  }

  /** The connection from this address and port authenticated: it no longer counts, and no timeout ends it. */
  authenticated(address: string | undefined, port: number | undefined): void {
    this.#forget(`${address ?? ""}|${port ?? 0}`);
  }

  /** Destroys every connection not yet authenticated (the gateway is closing). */
  closeAll(): void {
    for (const p of [...this.#pending.values()]) p.socket.destroy();
  }

  #forget(key: string): void {
    const p = this.#pending.get(key);
    if (p === undefined) return;
    clearTimeout(p.timer);
    this.#pending.delete(key);
    const n = (this.#byAddress.get(p.address) ?? 1) - 1;
    if (n <= 0) this.#byAddress.delete(p.address);
    else this.#byAddress.set(p.address, n);
  }
}
