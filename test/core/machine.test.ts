/**
 * machineTransition, arm by arm: every accepted edge of the machine lifecycle
 * with its effects and what it does to the generation, then every refused
 * (state, event) pair. The two tables together cover the whole state × event
 * matrix, so a new edge (or a lost one) fails here.
 */
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { MACHINE_STATES, machineTransition, type Effect, type MachineCore, type MachineEvent, type MachineState } from "../../src/core/machine.js";

const NOW = 1_000_000;

function machine(state: MachineState, patch: Partial<MachineCore> = {}): MachineCore {
  return { state, generation: 7, stateSince: 10, readySince: state === "ready" ? 10 : null, reason: null, ...patch };
}

interface Accepted {
  title: string;
  from: MachineState;
  event: MachineEvent;
  to: MachineState;
  effects: Effect["kind"][];
  /** Generation after the edge (default: unchanged, 7). */
  generation?: number;
  /** Reason after the edge (default: null). */
  reason?: string | null;
  fromReason?: string | null;
}

const ACCEPTED: Accepted[] = [
  { title: "registered: provisioning -> ready", from: "provisioning", event: { kind: "registered" }, to: "ready", effects: [] },
  { title: "[I4] reserve (keeper): ready -> busy, generation advances", from: "ready", event: { kind: "reserve", mode: "keeper" }, to: "busy", effects: [], generation: 8 },
  { title: "[I4] reserve (portable): ready -> reserved, generation advances", from: "ready", event: { kind: "reserve", mode: "portable" }, to: "reserved", effects: [], generation: 8 },
  { title: "install_started: reserved -> installing, install the key", from: "reserved", event: { kind: "install_started" }, to: "installing", effects: ["install_key"] },
  { title: "[I2] install_confirmed: installing -> busy", from: "installing", event: { kind: "install_confirmed" }, to: "busy", effects: [] },
  { title: "[I5] return (portable) from busy: revoking, remove the key", from: "busy", event: { kind: "return", mode: "portable", scrub: true }, to: "revoking", effects: ["remove_key"] },
  { title: "[I5] return (portable) from installing: revoking, remove the key", from: "installing", event: { kind: "return", mode: "portable", scrub: true }, to: "revoking", effects: ["remove_key"] },
  { title: "[I5] return (portable) from reserved: revoking, remove the key", from: "reserved", event: { kind: "return", mode: "portable", scrub: false }, to: "revoking", effects: ["remove_key"] },
  { title: "[I5] return (keeper, with scrub): busy -> fencing, fence", from: "busy", event: { kind: "return", mode: "keeper", scrub: true }, to: "fencing", effects: ["fence"] },
  { title: "return (keeper, no scrub step): busy -> ready", from: "busy", event: { kind: "return", mode: "keeper", scrub: false }, to: "ready", effects: [] },
  { title: "[I5] revoked: revoking -> fencing, fence", from: "revoking", event: { kind: "revoked" }, to: "fencing", effects: ["fence"] },
  { title: "[I5] fenced: fencing -> scrubbing, scrub", from: "fencing", event: { kind: "fenced" }, to: "scrubbing", effects: ["scrub"] },
  { title: "[I5] scrubbed: scrubbing -> ready", from: "scrubbing", event: { kind: "scrubbed" }, to: "ready", effects: [] },
  ...(["provisioning", "ready", "reserved", "installing", "busy", "revoking", "fencing", "scrubbing"] as const).map((from): Accepted => ({
    title: `[I5] quarantine: ${from} -> quarantined, destroy, reason kept`,
    from,
    event: { kind: "quarantine", reason: "doubt" },
    to: "quarantined",
    effects: ["destroy"],
    reason: "doubt",
  })),
  ...(["ready", "quarantined", "provisioning", "busy"] as const).map((from): Accepted => ({
    title: `drain: ${from} -> draining, destroy, reason kept`,
    from,
    event: { kind: "drain", reason: "ttl" },
    to: "draining",
    effects: ["destroy"],
    reason: "ttl",
  })),
  { title: "destroy_started: draining -> destroying, the drain reason stays", from: "draining", fromReason: "ttl", event: { kind: "destroy_started" }, to: "destroying", effects: [], reason: "ttl" },
  { title: "destroy_started: quarantined -> destroying, the quarantine reason stays", from: "quarantined", fromReason: "doubt", event: { kind: "destroy_started" }, to: "destroying", effects: [], reason: "doubt" },
  { title: "destroyed: destroying -> destroyed, the reason stays", from: "destroying", fromReason: "doubt", event: { kind: "destroyed" }, to: "destroyed", effects: [], reason: "doubt" },
];

describe("machineTransition: accepted edges", () => {
  for (const c of ACCEPTED) {
    it(c.title, () => {
      const m = machine(c.from, { reason: c.fromReason ?? null });
      const r = machineTransition(m, c.event, NOW);
      assert.ok(r.ok, r.ok ? "" : r.why);
      assert.equal(r.machine.state, c.to);
      assert.deepEqual(r.effects.map((e) => e.kind), c.effects);
      assert.equal(r.machine.generation, c.generation ?? 7);
      assert.equal(r.machine.reason, c.reason ?? null);
      assert.equal(r.machine.stateSince, NOW);
      assert.equal(r.machine.readySince, c.to === "ready" ? NOW : null, "readySince is set exactly when the machine becomes ready");
    });
  }
});

const EVENTS: MachineEvent[] = [
  { kind: "registered" },
  { kind: "reserve", mode: "keeper" },
  { kind: "reserve", mode: "portable" },
  { kind: "install_started" },
  { kind: "install_confirmed" },
  { kind: "return", mode: "keeper", scrub: true },
  { kind: "return", mode: "keeper", scrub: false },
  { kind: "return", mode: "portable", scrub: true },
  { kind: "return", mode: "portable", scrub: false },
  { kind: "revoked" },
  { kind: "fenced" },
  { kind: "scrubbed" },
  { kind: "quarantine", reason: "doubt" },
  { kind: "drain", reason: "ttl" },
  { kind: "destroy_started" },
  { kind: "destroyed" },
];

const same = (a: MachineEvent, b: MachineEvent) => JSON.stringify(a) === JSON.stringify(b);
const acceptedFrom = (s: MachineState, e: MachineEvent) =>
  ACCEPTED.some((c) => c.from === s && (same(c.event, e) || (e.kind === "return" && c.event.kind === "return" && e.mode === "portable" && c.event.mode === "portable")));

describe("machineTransition: refused pairs (every pair not accepted above)", () => {
  for (const s of MACHINE_STATES) {
    for (const e of EVENTS) {
      if (acceptedFrom(s, e)) continue;
      const label = e.kind === "return" || e.kind === "reserve" ? `${e.kind} (${e.mode}${e.kind === "return" ? (e.scrub ? ", scrub" : ", no scrub") : ""})` : e.kind;
      it(`${s} refuses ${label}, naming the state and the event`, () => {
        const m = machine(s);
        const r = machineTransition(m, e, NOW);
        assert.equal(r.ok, false);
        if (!r.ok) assert.equal(r.why, `a ${s} machine cannot take '${e.kind}'`);
      });
    }
  }
});

describe("machineTransition: properties over the whole matrix", () => {
  it("[I5] only registration, a keeper return without scrub step and a finished scrub reach ready", () => {
    for (const s of MACHINE_STATES) {
      for (const e of EVENTS) {
        const r = machineTransition(machine(s), e, NOW);
        if (!r.ok || r.machine.state !== "ready") continue;
        const edge = `${s} --${e.kind}-->`;
        assert.ok(
          (s === "provisioning" && e.kind === "registered") ||
            (s === "busy" && e.kind === "return" && e.mode === "keeper" && !e.scrub) ||
            (s === "scrubbing" && e.kind === "scrubbed"),
          `${edge} ready`,
        );
      }
    }
  });

  it("[I5] a quarantined, draining, destroying or destroyed machine never reaches ready, reserved or busy by any event", () => {
    for (const s of ["quarantined", "draining", "destroying", "destroyed"] as const) {
      for (const e of EVENTS) {
        const r = machineTransition(machine(s), e, NOW);
        if (r.ok) assert.ok(["draining", "destroying", "destroyed"].includes(r.machine.state), `${s} --${e.kind}--> ${r.machine.state}`);
      }
    }
  });

  it("[I4] only a reservation changes the generation", () => {
    for (const s of MACHINE_STATES) {
      for (const e of EVENTS) {
        const r = machineTransition(machine(s), e, NOW);
        if (r.ok) assert.equal(r.machine.generation, e.kind === "reserve" ? 8 : 7, `${s} --${e.kind}-->`);
      }
    }
  });

  it("the input record is never modified", () => {
    const m = machine("busy");
    const copy = { ...m };
    machineTransition(m, { kind: "return", mode: "portable", scrub: true }, NOW);
    assert.deepEqual(m, copy);
  });
});
