/**
 * One session = one runtime exec behind one SSH channel.
 *
 * Start (what is durable before what):
 *   1. record `intent` (no identities) — before the runtime creates anything;
 *   2. runtime.exec (with a PTY when the client asked for one: exactly one
 *      host PTY, owned by the runtime's ExecHandle);
 *   3. one store transaction `intent -> running` with the exec client's and the
 *      group leader's exact identities;
 *   4. only then are terminal events (input, resize, signal) admitted.
 *   A crash between 1 and 3 leaves an `intent` without identities; recovery
 *   (recovery.ts) cleans it only after runtime absence is verified.
 *
 * Event loop: every session has one serialized loop over bounded queues (the
 * data queues are pump.ts) —
 * close, completion, signal (<= 16 pending), resize (latest wins), input
 * (bounded bytes; the SSH channel is paused, so the client's SSH window closes)
 * and output (bounded bytes; the exec output is paused while the channel's
 * write() reports backpressure, resumed on 'drain'). Control events are taken
 * before data, and the loop yields to the Node event loop regularly, so one
 * session's flood never delays another session's control events.
 *
 * Normal completion (the exec client exited): stop admitting events, forward
 * the remaining output in order until EOF or the drain deadline, wait until the
 * last byte has been handed to the SSH transport, send exactly one exit-status
 * (or exit-signal), then EOF/close, then release.
 *
 * Release (channel closed, client lost, key revoked or expired, PTY lost,
 * exec client lost, gateway closing, or after completion): release.ts.
 */
import { constants as osConstants } from "node:os";
import type { ServerChannel } from "ssh2";
import type { ExecHandle, ExecRequest } from "../runtime/types.js";
import type { SessionRecord } from "./store.js";
import { resumeAllParkedWrites } from "./channel-writes.js";
import { groupSignalFor, sshSignalName, validWindow } from "./events.js";
import { Pump } from "./pump.js";
import { releaseSession } from "./release.js";
import type { SessionDeps, SessionOutcome, SessionSpec } from "./types.js";

const SIGNAL_BOUND = 16;
const YIELD_EVERY = 32;

export class Session {
  readonly spec: SessionSpec;
  /** Resolves once the session is released (clean or retained). Never rejects. */
  readonly done: Promise<SessionOutcome>;

  private readonly deps: SessionDeps;
  private readonly channel: ServerChannel;
  private handle: ExecHandle | null = null;
  private resolveDone!: (o: SessionOutcome) => void;

  /** Terminal events are admitted only between `running` and completion/close. */
  private admitting = false;
  private closeReason: string | null = null;
  private exitInfo: { code: number | null; signal: string | null } | null = null;
  private execLost: string | null = null;

  private readonly signals: NodeJS.Signals[] = [];
  private resizeTo: { cols: number; rows: number } | null = null;
  /** The data path (pump.ts); exists from the exec on. */
  private pump: Pump | null = null;

  private waiter: (() => void) | null = null;
  private releasing: Promise<SessionOutcome> | null = null;
  private channelClosed = false;

  constructor(deps: SessionDeps, spec: SessionSpec, channel: ServerChannel) {
    this.deps = deps;
    this.spec = spec;
    this.channel = channel;
    this.done = new Promise((r) => (this.resolveDone = r));
    // A client slower than the command must get stdout's and stderr's held-back writes alike (channel-writes.ts).
    resumeAllParkedWrites(channel);
    channel.on("error", () => this.cut("channel error"));
    channel.on("close", () => {
      this.channelClosed = true;
      this.cut("client closed the channel");
    });
  }

  /** Steps 1–4 of the start ordering, then the event loop. Never rejects. */
  async start(): Promise<void> {
    const { store, runtime, now, log } = this.deps;
    const s = this.spec;
    let incarnation: string | null = null;
    try {
      // The record only: inspect's process count (a /proc scan, or a `runsc exec`) is not needed here.
      incarnation = await runtime.incarnation(s.machineId);
    } catch {
      /* the record says "unknown"; recovery is then more conservative */
    }
    const t = now();
    store.create({
      sessionId: s.sessionId,
      machineId: s.machineId,
      grantId: s.grantId,
      fingerprint: s.fingerprint,
      pty: s.pty !== null,
      incarnation,
      state: "intent",
      client: null,
      leader: null,
      note: null,
      createdAt: t,
      updatedAt: t,
    });
    if (this.closeReason !== null) {
      // Cut before anything was started: nothing exists, nothing to release.
      this.finish(store.transition(s.sessionId, ["intent"], { state: "clean", note: this.closeReason, updatedAt: now() }), this.closeReason);
      return;
    }
    const req: ExecRequest = { argv: s.argv, env: s.env, ...(s.pty ? { pty: s.pty } : {}) };
    let handle: ExecHandle;
    try {
      handle = await runtime.exec(s.machineId, req);
    } catch (e) {
      const msg = e instanceof Error ? e.message : String(e);
      log.warn({ session: s.sessionId, machine: s.machineId, err: msg }, "session exec failed");
      // The runtime cleans up a failed exec before rejecting; nothing was started for this record.
      const rec = store.transition(s.sessionId, ["intent"], { state: "clean", note: `exec failed: ${msg}`, updatedAt: now() });
      if (!this.channelClosed) {
        this.channel.stderr.write(`berth: could not start the command on machine ${s.machineId}: ${msg}\r\n`);
        this.channel.exit(255);
        this.channel.end();
      }
      this.finish(rec, "exec failed", `exec failed: ${msg}`);
      return;
    }
    this.handle = handle;
    this.wireExec(handle);
    let running: SessionRecord | null = null;
    try {
      running = store.transition(s.sessionId, ["intent"], {
        state: "running",
        client: handle.client,
        leader: handle.leader,
        incarnation: handle.incarnation,
        updatedAt: now(),
      });
    } catch (e) {
      log.error({ session: s.sessionId, err: String(e) }, "could not record the running session; releasing it");
    }
    if (!running) {
      await this.release("could not record running identities");
      return;
    }
    log.info({ session: s.sessionId, machine: s.machineId, grant: s.grantId, leader: handle.leader, client: handle.client, pty: !!s.pty }, "session running");
    if (this.closeReason === null) {
      this.admitting = true;
      this.pump!.wireChannel();
    }
    void this.loop();
  }

  /** SSH window-change. False (refused) when invalid or not admitted. */
  resize(cols: unknown, rows: unknown): boolean {
    const w = validWindow(cols, rows);
    if (!w || !this.admitting || !this.spec.pty) return false;
    this.resizeTo = w;
    this.poke();
    return true;
  }

  /** SSH `signal`: INT/QUIT/TSTP/TERM/HUP only. False when refused. */
  signal(sshName: string): boolean {
    const sig = groupSignalFor(sshName);
    if (!sig || !this.admitting || this.signals.length >= SIGNAL_BOUND) return false;
    this.signals.push(sig);
    this.poke();
    return true;
  }

  /** Cut the session at once (channel closed now) and release its processes. */
  cut(why: string): Promise<SessionOutcome> {
    if (this.closeReason === null) this.closeReason = why;
    this.admitting = false;
    this.closeChannel();
    this.poke();
    return this.done;
  }

  get live(): boolean {
    return this.releasing === null;
  }

  // ---- wiring ---------------------------------------------------------------

  private wireExec(h: ExecHandle): void {
    h.stdin.on("error", () => {
      /* EPIPE after exit: the completion path reports the outcome */
    });
    this.pump = new Pump(h, this.channel, Boolean(this.spec.pty), {
      poke: () => this.poke(),
      discarding: () => this.closeReason !== null || this.releasing !== null,
      admitting: () => this.admitting,
      channelClosed: () => this.channelClosed,
    });
    this.pump.wireExec();
    const lost = (what: string) => (e: Error) => {
      // EIO on a PTY master is how Linux reports "all slave ends closed": that is EOF, not loss.
      if ((e as NodeJS.ErrnoException).code === "EIO") return;
      this.execLost ??= `${what}: ${e.message}`;
      this.poke();
    };
    h.stdout.on("error", lost("output stream lost"));
    h.stderr.on("error", lost("error stream lost"));
    h.exited.then(
      (x) => {
        this.exitInfo = x;
        this.poke();
      },
      (e: unknown) => {
        this.execLost ??= `exec client lost: ${e instanceof Error ? e.message : String(e)}`;
        this.poke();
      },
    );
  }

  // ---- the serialized loop ----------------------------------------------------

  private poke(): void {
    const w = this.waiter;
    this.waiter = null;
    w?.();
  }

  private wait(ms?: number): Promise<void> {
    return new Promise((resolve) => {
      let timer: NodeJS.Timeout | null = null;
      this.waiter = () => {
        if (timer) clearTimeout(timer);
        resolve();
      };
      if (ms !== undefined) timer = setTimeout(() => this.poke(), Math.max(0, ms));
    });
  }

  private async loop(): Promise<void> {
    const h = this.handle!;
    let n = 0;
    for (;;) {
      if (++n % YIELD_EVERY === 0) await new Promise((r) => setImmediate(r));
      if (this.closeReason !== null) {
        await this.release(this.closeReason);
        return;
      }
      if (this.execLost !== null && this.exitInfo === null) {
        await this.release(this.execLost);
        return;
      }
      if (this.exitInfo !== null) {
        await this.complete();
        return;
      }
      const sig = this.signals.shift();
      if (sig) {
        // A terminal signal goes where the keyboard's would: the terminal's foreground group.
        const ok = await h.signalForeground(sig).catch(() => false);
        if (!ok) this.deps.log.warn({ session: this.spec.sessionId, signal: sig }, "signal refused: group leader no longer matches");
        continue;
      }
      if (this.resizeTo) {
        const { cols, rows } = this.resizeTo;
        this.resizeTo = null;
        try {
          h.resize(cols, rows);
        } catch (e) {
          this.deps.log.warn({ session: this.spec.sessionId, err: String(e) }, "resize failed");
        }
        continue;
      }
      if (this.pump!.forwardInput()) continue;
      if (this.pump!.forwardOutput()) continue;
      await this.wait();
    }
  }

  /** Normal completion: drain in order, one exit status after the last byte, close, release. */
  private async complete(): Promise<void> {
    const pump = this.pump!;
    this.admitting = false;
    pump.dropInput();
    this.signals.length = 0;
    this.resizeTo = null;
    const exitedAt = Date.now();
    pump.lastProgress = Math.max(pump.lastProgress, exitedAt);
    const { drainIdleMs, drainMaxMs } = this.deps.timing;
    let reason = "completed";
    for (;;) {
      if (this.closeReason !== null) {
        reason = this.closeReason;
        break;
      }
      const readDone = (pump.outEnded && pump.errEnded) || Date.now() - exitedAt >= drainMaxMs;
      if (readDone && pump.outputFlushed) {
        if (!pump.outEnded || !pump.errEnded) reason = "completed (output drain deadline)";
        this.sendExit();
        break;
      }
      if (pump.outputFlushed && Date.now() - pump.lastProgress >= drainIdleMs) {
        // Everything read has been sent and nothing more came for a while: a writer
        // (a background child) holds the output open. The status follows what was sent.
        this.sendExit();
        reason = "completed (output drain deadline)";
        break;
      }
      // Output waits for a client that is slow to take it (its window is full): it is
      // waited for, as OpenSSH does, until the client takes it or the session is closed
      // (the connection drops, the borrow ends, a fence).
      if (pump.forwardOutput()) continue;
      await this.wait(Math.min(drainIdleMs, 100));
    }
    await this.release(reason);
  }

  private sendExit(): void {
    if (this.channelClosed || !this.exitInfo) return;
    const x = this.exitInfo;
    try {
      if (x.signal) {
        try {
          this.channel.exit(sshSignalName(x.signal), false, "");
        } catch {
          // Not one of RFC 4254's signal names (e.g. SIGBUS): report it as a shell would, 128 + number.
          const num = (osConstants.signals as Record<string, number>)[x.signal];
          this.channel.exit(num ? 128 + num : 255);
        }
      } else this.channel.exit(x.code ?? 255);
      this.channel.end();
    } catch {
      /* the client went away meanwhile */
    }
  }

  private closeChannel(): void {
    if (this.channelClosed) return;
    this.channelClosed = true;
    try {
      this.channel.close();
    } catch {
      /* already closed */
    }
  }

  // ---- release ----------------------------------------------------------------

  private release(reason: string): Promise<SessionOutcome> {
    this.releasing ??= this.doRelease(reason);
    return this.releasing;
  }

  private async doRelease(reason: string): Promise<SessionOutcome> {
    this.admitting = false;
    this.pump?.dropOutput();
    this.pump?.dropInput();
    const { record, note } = await releaseSession(this.deps, {
      sessionId: this.spec.sessionId,
      machineId: this.spec.machineId,
      handle: this.handle!,
      exited: () => this.exitInfo !== null,
      closeChannel: () => this.closeChannel(),
    }, reason);
    return this.finish(record, reason, note);
  }

  private finish(rec: SessionRecord | null, reason: string, note: string = reason): SessionOutcome {
    const out: SessionOutcome = {
      sessionId: this.spec.sessionId,
      state: rec?.state === "clean" ? "clean" : "release_intent",
      reason,
      note: rec?.note ?? note,
    };
    this.releasing ??= Promise.resolve(out);
    this.resolveDone(out);
    return out;
  }
}
