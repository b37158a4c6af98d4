/**
 * A counting TCP proxy in front of PostgreSQL: it forwards every byte both
 * ways unchanged and reads the protocol's message framing on the way, so a
 * test or benchmark can say exactly what a coordinator (any build, any
 * process) asked of the database:
 *
 *   statements    simple queries ('Q') and executions of extended-protocol
 *                 portals ('E'): what the server parsed/bound and ran;
 *   commits       transactions that ended committed: a COMMIT, or a statement
 *                 run outside a transaction block (an implicit transaction of
 *                 its own, as PostgreSQL counts it in xact_commit);
 *   rollbacks     transactions that ended rolled back (ROLLBACK, or an error);
 *   round trips   client writes that the server answered: a burst of messages
 *                 sent together (pipelined) and answered together is one.
 *
 * Nothing is changed or delayed beyond the extra hop; SSL is not supported
 * (the client must not ask for it: berth's connection strings here have no
 * sslmode).
 */
import { connect, createServer, type AddressInfo, type Server, type Socket } from "node:net";

export interface WireCounts {
  statements: number;
  commits: number;
  rollbacks: number;
  roundTrips: number;
  /** CommandComplete tags seen, by their first word (SELECT, INSERT, BEGIN, COMMIT, …). */
  tags: Record<string, number>;
}

export interface PgWireProxy {
  /** A connection string to the same server and database, through the proxy. */
  url: string;
  counts(): WireCounts;
  reset(): void;
  close(): Promise<void>;
}

function zero(): WireCounts {
  return { statements: 0, commits: 0, rollbacks: 0, roundTrips: 0, tags: {} };
}

/** Splits a byte stream into protocol messages (type byte + int32 length that counts itself). */
class Framer {
  #buf: Buffer = Buffer.alloc(0);
  constructor(
    /** The first client message (startup) has no type byte. */
    private untyped: boolean,
    private readonly onMessage: (type: number, body: Buffer) => void,
  ) {}

  push(chunk: Buffer): void {
    this.#buf = this.#buf.length === 0 ? chunk : Buffer.concat([this.#buf, chunk]);
    for (;;) {
      if (this.untyped) {
        if (this.#buf.length < 4) return;
        const len = this.#buf.readInt32BE(0);
        if (this.#buf.length < len) return;
        const code = this.#buf.readInt32BE(4);
        this.#buf = this.#buf.subarray(len);
        // SSLRequest / GSSENCRequest are followed by another untyped startup; a real startup is not.
        if (code !== 80877103 && code !== 80877104) this.untyped = false;
        continue;
      }
      if (this.#buf.length < 5) return;
      const len = this.#buf.readInt32BE(1);
      if (this.#buf.length < 1 + len) return;
      this.onMessage(this.#buf[0]!, this.#buf.subarray(5, 1 + len));
      this.#buf = this.#buf.subarray(1 + len);
    }
  }
}

export async function startPgWireProxy(pgUrl: string): Promise<PgWireProxy> {
  const target = new URL(pgUrl);
  let c = zero();
  const sockets = new Set<Socket>();
  const server: Server = createServer((down) => {
    const up = connect(Number(target.port || 5432), target.hostname);
    up.setNoDelay(true);
    down.setNoDelay(true);
    sockets.add(down).add(up);
    // Per connection: inside a transaction block, something done since the last idle, an error in it, a burst unanswered.
    let inBlock = false;
    let busy = false;
    let failed = false;
    let awaiting = false;
    const fromClient = new Framer(true, (type) => {
      if (type === 0x51 /* Q */ || type === 0x45 /* E */) c.statements++;
    });
    const fromServer = new Framer(false, (type, body) => {
      if (awaiting) {
        awaiting = false;
        c.roundTrips++;
      }
      if (type === 0x43 /* CommandComplete */) {
        const tag = body.toString("latin1", 0, body.length - 1).split(" ")[0]!;
        c.tags[tag] = (c.tags[tag] ?? 0) + 1;
        busy = true;
        if (tag === "ROLLBACK") failed = true;
      } else if (type === 0x45 /* ErrorResponse */) {
        busy = true;
        failed = true;
      } else if (type === 0x5a /* ReadyForQuery */) {
        const status = body[0];
        if (status === 0x49 /* I: idle */) {
          if (busy) {
            if (failed) c.rollbacks++;
            else c.commits++;
          }
          busy = false;
          failed = false;
          inBlock = false;
        } else {
          inBlock = true;
          if (status === 0x45 /* E: failed block */) failed = true;
        }
      }
    });
    void inBlock;
    down.on("data", (d: Buffer) => {
      fromClient.push(d);
      awaiting = true;
      up.write(d);
    });
    up.on("data", (d: Buffer) => {
      fromServer.push(d);
      down.write(d);
    });
    const end = () => {
      down.destroy();
      up.destroy();
      sockets.delete(down);
      sockets.delete(up);
    };
    down.on("error", end).on("close", end);
    up.on("error", end).on("close", end);
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const via = new URL(pgUrl);
  via.hostname = "127.0.0.1";
  via.port = String((server.address() as AddressInfo).port);
  return {
    url: via.toString(),
    counts: () => ({ ...c, tags: { ...c.tags } }),
    reset: () => {
      c = zero();
    },
    close: () =>
      new Promise<void>((r) => {
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  };
}
