/**
 * The live stream (`GET /ui/events`, server-sent events). Each open page
 * holds one stream; the server tells it `changed` when what the page's
 * organisation shows moved, and htmx re-fetches the page's live region.
 *
 * One timer serves every stream: each tick reads the change mark
 * (src/store/change-marks.ts) of each organisation that has a stream open
 * (one committed read per organisation, whatever the number of streams) and
 * sends `changed` to the streams whose last mark differs. A page passes the
 * mark it was rendered at (`since`), so a change between render and stream
 * start is reported at once. Streams carry no data beyond the event name:
 * the page fetches its own region, through its own session.
 *
 * A stream ends when its session does: at once on sign-out in this process,
 * and within `recheckMs` otherwise (expiry, revocation of its token, a
 * sign-out through another coordinator); it then sends `signed-out`, which
 * takes the page to the sign-in form. When the coordinator stops, its
 * streams end with no event: the session is still valid, and the page shows
 * the coordinator as unreachable and reconnects (client/script.ts); it is
 * never signed out by a stop.
 */
import type { ServerResponse } from "node:http";
import { createHash } from "node:crypto";
import type { Store } from "../../store/store.js";
import { changeMark } from "../../store/change-marks.js";

interface Stream {
  org: string;
  session: string;
  res: ServerResponse;
  mark: string;
}

export interface LiveDeps {
  store: Store;
  /** Whether a session (by stored hash) is still valid. */
  sessionValid: (hash: string) => Promise<boolean>;
  log: { warn(fields: Record<string, unknown>, msg: string): void };
  intervalMs: number;
  recheckMs: number;
}

/** A short digest of a change mark (what a page passes as `since`). */
export function markDigest(mark: string): string {
  return createHash("sha256").update(mark).digest("base64url").slice(0, 16);
}

export class LiveChanges {
  readonly #streams = new Set<Stream>();
  #timer: NodeJS.Timeout | null = null;
  #busy = false;
  #lastRecheck = 0;
  #lastPing = 0;

  constructor(private readonly d: LiveDeps) {}

  /** The organisation's current mark digest (pages embed it). */
  async digest(org: string): Promise<string> {
    return markDigest(await changeMark(this.d.store, org));
  }

  open(res: ServerResponse, org: string, session: string, since: string): void {
    res.writeHead(200, { "content-type": "text/event-stream; charset=utf-8", "cache-control": "no-store", connection: "keep-alive", "x-accel-buffering": "no" });
    res.write(": berth live changes\n\n");
    const s: Stream = { org, session, res, mark: since };
    this.#streams.add(s);
    res.on("close", () => this.#streams.delete(s));
    if (!this.#timer) {
      this.#timer = setInterval(() => void this.tick(), this.d.intervalMs);
      this.#timer.unref();
    }
    void this.tick();
  }

  /** Ends the streams of a session (signed out here). */
  endSession(session: string): void {
    for (const s of this.#streams) if (s.session === session) this.#end(s);
  }

  get size(): number {
    return this.#streams.size;
  }

  /** One pass: marks of the organisations with streams, `changed` where they moved; sessions re-checked every `recheckMs`. */
  async tick(): Promise<void> {
    if (this.#busy) return;
    this.#busy = true;
    try {
      if (this.#streams.size === 0) {
        if (this.#timer) clearInterval(this.#timer);
        this.#timer = null;
        return;
      }
      const now = Date.now();
      if (now - this.#lastRecheck >= this.d.recheckMs) {
        this.#lastRecheck = now;
        const verdicts = new Map<string, boolean>();
        for (const s of [...this.#streams]) {
          if (!verdicts.has(s.session)) verdicts.set(s.session, await this.d.sessionValid(s.session));
          if (!verdicts.get(s.session)) this.#end(s);
        }
      }
      const orgs = new Set([...this.#streams].map((s) => s.org));
      for (const org of orgs) {
        const digest = await this.digest(org);
        for (const s of this.#streams) {
          if (s.org !== org || s.mark === digest) continue;
          s.mark = digest;
          s.res.write(`event: changed\ndata: ${digest}\n\n`);
        }
      }
      // A named event (not a comment), so the page can tell a quiet stream from a dead one.
      if (now - this.#lastPing >= 5_000) {
        this.#lastPing = now;
        for (const s of this.#streams) s.res.write("event: ping\ndata: 1\n\n");
      }
    } catch (e) {
      this.d.log.warn({ err: e instanceof Error ? e.message : String(e) }, "dashboard live changes: tick failed");
    } finally {
      this.#busy = false;
    }
  }

  #end(s: Stream): void {
    this.#streams.delete(s);
    s.res.end("event: signed-out\ndata: session ended\n\n");
  }

  /** The coordinator stops: every stream ends without a word (its session is not over). */
  stop(): void {
    if (this.#timer) clearInterval(this.#timer);
    this.#timer = null;
    for (const s of [...this.#streams]) {
      this.#streams.delete(s);
      s.res.end();
    }
  }
}
