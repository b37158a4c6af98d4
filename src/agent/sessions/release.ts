/**
 * Releasing a session's processes: the one way a session ends.
 *
 * Triggers (channel closed, client lost, key revoked or expired, PTY lost,
 * exec client lost, gateway closing, or after completion):
 *   1. record `release_intent`, keeping every identity;
 *   2. while the recorded group still has members and the runtime confirms the
 *      leader identity still matches: SIGHUP, grace, SIGTERM, grace, SIGKILL.
 *      A refused signalGroup (leader gone or mismatched) ends signalling: a
 *      numeric group is never signalled on a mismatch;
 *   3. wait (bounded) for the exec client to be reaped, destroy the PTY/pipe
 *      streams;
 *   4. record `clean` only when group, client and PTY are all gone; otherwise
 *      the record stays `release_intent` with a note (the machine's fence, or
 *      recovery after a fence, finishes it). A child that left the group
 *      (setsid) is not a member and does not block release.
 *
 * A crash anywhere after step 1 leaves `release_intent` with every identity,
 * which recovery (recovery.ts) finishes only after absence is verified.
 */
import type { ExecHandle } from "../runtime/types.js";
import { probeGroup, type GroupPresence } from "./probe.js";
import type { SessionRecord } from "./store.js";
import type { SessionDeps } from "./types.js";

/** The session being released, as the protocol needs to see it. */
export interface ReleaseSubject {
  sessionId: string;
  machineId: string;
  /** The running exec (its identities are in the record). */
  handle: ExecHandle;
  /** Whether the exec client has exited (changes the meaning of a vanished leader). */
  exited: () => boolean;
  /** Close the SSH channel now (idempotent). */
  closeChannel: () => void;
}

/** The record as last written (null if the store refused), and the note it carries. */
export interface ReleaseResult {
  record: SessionRecord | null;
  note: string;
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Steps 1–4 above. Never rejects; store failures are logged and leave the record for recovery. */
export async function releaseSession(deps: SessionDeps, subject: ReleaseSubject, reason: string): Promise<ReleaseResult> {
  const { store, now, log } = deps;
  const s = subject;
  // 1. Durable intent first, identities kept: a crash from here on resumes from it.
  try {
    store.transition(s.sessionId, ["intent", "running"], { state: "release_intent", note: reason, updatedAt: now() });
  } catch (e) {
    log.error({ session: s.sessionId, err: String(e) }, "could not record release intent; releasing anyway");
  }
  if (reason !== "completed") s.closeChannel();
  s.handle.resume(); // let a blocked writer finish or see SIGHUP instead of hanging on a full PTY
  const { group, refused } = await stopGroup(deps, s);
  const reaped = await reapClient(deps, s);
  return recordOutcome(deps, s, reason, group, reaped, refused);
}

const groupPresence = (deps: SessionDeps, s: ReleaseSubject): Promise<GroupPresence> => probeGroup(deps.runtime, s.machineId, s.handle.leader.pgid, s.exited());

/** Whether the exec client was reaped within `ms`. */
const reapedWithin = (h: ExecHandle, ms: number): Promise<boolean> =>
  Promise.race([
    h.exited.then(
      () => true,
      () => true,
    ),
    sleep(ms).then(() => false),
  ]);

/** 2. Stop the exact group: HUP, TERM, KILL, each only while the leader still matches. */
async function stopGroup(deps: SessionDeps, s: ReleaseSubject): Promise<{ group: GroupPresence; refused: boolean }> {
  const { timing } = deps;
  const h = s.handle;
  const waitGroupGone = async (ms: number): Promise<GroupPresence> => {
    const until = Date.now() + ms;
    for (;;) {
      const g = await groupPresence(deps, s);
      if (g === "absent" || Date.now() >= until) return g;
      await sleep(Math.min(25, Math.max(1, until - Date.now())));
    }
  };
  let group: GroupPresence = await groupPresence(deps, s);
  const steps: [NodeJS.Signals, number][] = [
    ["SIGHUP", timing.hupGraceMs],
    ["SIGTERM", timing.termGraceMs],
    ["SIGKILL", timing.killWaitMs],
  ];
  let refused = false;
  for (const [sig, grace] of steps) {
    if (group === "absent") break;
    const ok = await h.signalGroup(sig).catch(() => false);
    if (!ok) {
      refused = true;
      break;
    }
    group = await waitGroupGone(grace);
  }
  if (refused) {
    // A refusal usually means the leader just exited; the runtime knows that for sure once the
    // exec client is reaped (a PTY's client is reaped after its output drained), so wait
    // (bounded) before observing the group again.
    await reapedWithin(h, timing.reapWaitMs / 2);
    group = await groupPresence(deps, s);
  }
  return { group, refused };
}

/**
 * 3. Reap the exec client (bounded; killed only while it is still the exact recorded process),
 *    then close the PTY / pipes.
 */
async function reapClient(deps: SessionDeps, s: ReleaseSubject): Promise<boolean> {
  const h = s.handle;
  let reaped = await reapedWithin(h, deps.timing.reapWaitMs / 2);
  if (!reaped) {
    const killed = h.killClient("SIGKILL");
    deps.log.warn({ session: s.sessionId, killed }, "exec client outlived its group; killed it");
    reaped = await reapedWithin(h, deps.timing.reapWaitMs / 2);
  }
  for (const st of [h.stdin, h.stdout, h.stderr]) st.destroy();
  s.closeChannel();
  return reaped;
}

/** 4. Clean only when everything is verifiably gone. */
function recordOutcome(deps: SessionDeps, s: ReleaseSubject, reason: string, group: GroupPresence, reaped: boolean, refused: boolean): ReleaseResult {
  const { store, now, log } = deps;
  const missing: string[] = [];
  if (group !== "absent") missing.push(group === "present" ? "process group still has members (left for the machine's fence)" : "process group absence could not be verified");
  if (!reaped) missing.push("exec client not reaped");
  const note = missing.length ? `${reason}; ${missing.join("; ")}` : reason;
  let record: SessionRecord | null = null;
  try {
    record = missing.length
      ? store.transition(s.sessionId, ["release_intent"], { state: "release_intent", note, updatedAt: now() })
      : store.transition(s.sessionId, ["release_intent"], { state: "clean", note, updatedAt: now() });
  } catch (e) {
    log.error({ session: s.sessionId, err: String(e) }, "could not record the release outcome");
  }
  if (missing.length) log.warn({ session: s.sessionId, machine: s.machineId, note, refused }, "session released with retained record");
  else log.info({ session: s.sessionId, machine: s.machineId, reason }, "session clean");
  return { record, note };
}
