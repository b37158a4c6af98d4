/**
 * The machine lifecycle as a pure transition function.
 *
 *   provisioning -> ready                                   (registered, claim consumed)
 *   ready -> reserved -> installing -> busy                 (portable: grant pending, key install, active)
 *   ready -> busy                                           (keeper borrow)
 *   busy -> revoking -> fencing -> scrubbing -> ready       (return: key removed, sessions fenced, scrubbed)
 *   busy -> scrubbing -> ready                              (keeper return with a provider scrub step)
 *   reserved | installing | busy | revoking | fencing | scrubbing -> quarantined
 *   ready | busy | quarantined | provisioning -> draining -> destroying -> destroyed
 *   destroyed -> (retention) -> pruned (row deleted)
 *
 * Every call is `(machine, event, now) -> Transition`: either the new record
 * and the effects the edge must carry out (outside any transaction), or a
 * refusal naming why. The generation advances on every reservation, so a
 * late provider completion carrying an old generation is recognisable.
 */
import { assertNever } from "./errors.js";

export type MachineState =
  | "provisioning"
  | "ready"
  | "reserved"
  | "installing"
  | "busy"
  | "revoking"
  | "fencing"
  | "scrubbing"
  | "quarantined"
  | "draining"
  | "destroying"
  | "destroyed";

export const MACHINE_STATES: readonly MachineState[] = [
  "provisioning",
  "ready",
  "reserved",
  "installing",
  "busy",
  "revoking",
  "fencing",
  "scrubbing",
  "quarantined",
  "draining",
  "destroying",
  "destroyed",
];

export type MachineEvent =
  | { kind: "registered" }
  | { kind: "reserve"; mode: "keeper" | "portable" }
  | { kind: "install_started" }
  | { kind: "install_confirmed" }
  | { kind: "return"; mode: "keeper" | "portable"; scrub: boolean }
  | { kind: "revoked" }
  | { kind: "fenced" }
  | { kind: "scrubbed" }
  | { kind: "quarantine"; reason: string }
  | { kind: "drain"; reason: string }
  | { kind: "destroy_started" }
  | { kind: "destroyed" };

export interface MachineCore {
  state: MachineState;
  generation: number;
  stateSince: number;
  readySince: number | null;
  reason: string | null;
}

export type Effect =
  | { kind: "remove_key" }
  | { kind: "fence" }
  | { kind: "scrub" }
  | { kind: "destroy" }
  | { kind: "install_key" };

export type Transition<M extends MachineCore> =
  | { ok: true; machine: M; effects: Effect[] }
  | { ok: false; why: string };

function refuse<M extends MachineCore>(m: M, e: MachineEvent): Transition<M> {
  return { ok: false, why: `a ${m.state} machine cannot take '${e.kind}'` };
}

function to<M extends MachineCore>(m: M, state: MachineState, now: number, effects: Effect[], patch: Partial<MachineCore> = {}): Transition<M> {
  return {
    ok: true,
    machine: { ...m, state, stateSince: now, readySince: state === "ready" ? now : null, reason: null, ...patch },
    effects,
  };
}

export function machineTransition<M extends MachineCore>(m: M, e: MachineEvent, now: number): Transition<M> {
  switch (e.kind) {
    case "registered":
      return m.state === "provisioning" ? to(m, "ready", now, []) : refuse(m, e);
    case "reserve":
      if (m.state !== "ready") return refuse(m, e);
      // The generation advances on every reservation: completions of older
      // generations can never act on this borrow.
      return to(m, e.mode === "keeper" ? "busy" : "reserved", now, [], { generation: m.generation + 1 });
    case "install_started":
      return m.state === "reserved" ? to(m, "installing", now, [{ kind: "install_key" }]) : refuse(m, e);
    case "install_confirmed":
      return m.state === "installing" ? to(m, "busy", now, []) : refuse(m, e);
    case "return":
      if (e.mode === "portable") {
        // The grant is invalidated first; then the key is removed and the
        // sessions fenced as two proven steps.
        if (m.state === "busy" || m.state === "installing" || m.state === "reserved") return to(m, "revoking", now, [{ kind: "remove_key" }]);
        return refuse(m, e);
      }
      if (m.state !== "busy") return refuse(m, e);
      return e.scrub ? to(m, "fencing", now, [{ kind: "fence" }]) : to(m, "ready", now, []);
    case "revoked":
      return m.state === "revoking" ? to(m, "fencing", now, [{ kind: "fence" }]) : refuse(m, e);
    case "fenced":
      return m.state === "fencing" ? to(m, "scrubbing", now, [{ kind: "scrub" }]) : refuse(m, e);
    case "scrubbed":
      return m.state === "scrubbing" ? to(m, "ready", now, []) : refuse(m, e);
    case "quarantine":
      if (m.state === "destroyed" || m.state === "destroying" || m.state === "draining" || m.state === "quarantined") return refuse(m, e);
      // Quarantine never returns a machine to ready: it is destroyed.
      return to(m, "quarantined", now, [{ kind: "destroy" }], { reason: e.reason });
    case "drain":
      // Draining a lent machine destroys it: destruction is the proof that the borrower's sessions are gone.
      if (m.state !== "ready" && m.state !== "quarantined" && m.state !== "provisioning" && m.state !== "busy") return refuse(m, e);
      return to(m, "draining", now, [{ kind: "destroy" }], { reason: e.reason });
    case "destroy_started":
      return m.state === "draining" || m.state === "quarantined" ? to(m, "destroying", now, [], { reason: m.reason }) : refuse(m, e);
    case "destroyed":
      return m.state === "destroying" ? to(m, "destroyed", now, [], { reason: m.reason }) : refuse(m, e);
    default:
      return assertNever(e, "machine event");
  }
}
