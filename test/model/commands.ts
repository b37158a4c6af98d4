/**
 * fast-check commands over a World: each one is a client action, a
 * reconciler tick with scripted provider faults, a delivery of a parked
 * reply, a clock move, or a coordinator crash; every one is followed by the
 * invariant checks. Targets are chosen by index modulo what exists, so a
 * shrunk sequence still runs.
 */
import fc from "fast-check";
import type { World, PoolName } from "./world.js";
import type { Fault } from "./simulated-agent-provider.js";

type Model = Record<string, never>;

abstract class Step implements fc.AsyncCommand<Model, World> {
  check(): boolean {
    return true;
  }
  abstract act(w: World): Promise<void>;
  async run(_m: Model, w: World): Promise<void> {
    await this.act(w);
    await w.checks.afterStep();
  }
  abstract toString(): string;
}

const mk = (name: string, act: (w: World) => Promise<void>) =>
  new (class extends Step {
    act = act;
    toString = () => name;
  })();

const pool = fc.constantFrom<PoolName>("ext", "kp", "pp");
const fault = fc.constantFrom<Fault>("none", "none", "none", "fail", "fail_permanent", "timeout_applied", "timeout_lost", "lost_reply", "park_applied", "park_unapplied");
const idx = fc.nat(7);

export const commandArbs = [
  fc.tuple(pool, fc.integer({ min: 0, max: 3 }), fc.integer({ min: 0, max: 4 })).map(([p, a, b]) => mk(`ensure(${p},${Math.min(a, b)},${Math.max(a, b)})`, (w) => w.ensure(p, Math.min(a, b), Math.max(a, b)))),
  fc.tuple(idx, fc.boolean()).map(([i, reuse]) => mk(`register(${i},${reuse})`, (w) => w.register(i, reuse && i % 3 === 0))),
  fc.tuple(pool, fc.nat(9), idx, fc.constantFrom<number | null>(null, null, 5_000, 30_000, 200_000)).map(([p, cross, k, d]) =>
    mk(`borrow(${p},${cross === 0},${k},${d})`, (w) => w.borrow(p, cross === 0, k, d)),
  ),
  fc.tuple(pool, idx).map(([p, k]) => mk(`borrow(${p})`, (w) => w.borrow(p, false, k, null))),
  idx.map((k) => mk(`borrow(pp)`, (w) => w.borrow("pp", false, k, null))),
  idx.map((k) => mk(`borrow(pp)`, (w) => w.borrow("pp", false, k, null))),
  idx.map((i) => mk(`ack(${i})`, (w) => w.ack(i, "none", false))),
  idx.map((i) => mk(`ack(${i})`, (w) => w.ack(i, "none", false))),
  idx.map((i) => mk(`return(${i})`, (w) => w.return(i, false))),
  idx.map((i) => mk(`connect(${i})`, (w) => w.connect(i))),
  idx.map((i) => mk(`heartbeat(${i})`, (w) => w.heartbeat(i))),
  fc.constant(mk("tick()", (w) => w.tick([], false))),
  fc.constant(mk("tick()", (w) => w.tick([], false))),
  fc.tuple(idx, fault, fc.nat(9)).map(([i, f, wrong]) => mk(`ack(${i},${f},${wrong === 0})`, (w) => w.ack(i, f, wrong === 0))),
  idx.map((i) => mk(`heartbeat(${i})`, (w) => w.heartbeat(i))),
  fc.tuple(idx, fc.nat(4)).map(([i, d]) => mk(`return(${i},${d === 0 ? "drain" : "ready"})`, (w) => w.return(i, d === 0))),
  idx.map((i) => mk(`connect(${i})`, (w) => w.connect(i))),
  fc.tuple(fc.array(fault, { maxLength: 4 }), fc.nat(5)).map(([fs, dup]) => mk(`tick([${fs.join(",")}],${dup === 0})`, (w) => w.tick(fs, dup === 0))),
  fc.tuple(fc.array(fault, { maxLength: 4 }), fc.nat(5)).map(([fs, dup]) => mk(`tick([${fs.join(",")}],${dup === 0})`, (w) => w.tick(fs, dup === 0))),
  fc.constant(mk("tick()", (w) => w.tick([], false))),
  idx.map((i) => mk(`deliver(${i})`, (w) => w.deliver(i))),
  idx.map((i) => mk(`deliverOrphan(${i})`, (w) => w.deliverOrphan(i))),
  fc.constantFrom(1, 999, 1_000, 5_000, 10_000, 20_000, 31_000, 61_000).map((ms) => mk(`advance(${ms})`, (w) => w.advance(ms))),
  idx.map((i) => mk(`advanceToDeadline(${i})`, (w) => w.advanceToDeadline(i))),
  idx.map((i) => mk(`advanceToDeadline(${i})`, (w) => w.advanceToDeadline(i))),
  fc.constant(mk("crash()", (w) => w.crash())),
  fc.tuple(pool, idx).map(([p, k]) => mk(`cycle(${p})`, (w) => w.cycle(p, k))),
  fc.tuple(pool, idx).map(([p, k]) => mk(`cycle(${p})`, (w) => w.cycle(p, k))),
  fc.tuple(fc.constantFrom<PoolName>("kp", "pp"), fc.boolean()).map(([p, force]) => mk(`drain(${p},${force})`, (w) => w.drain(p, force))),
];

/** Pools start filled through ensure, so most sequences reach borrows quickly. */
export const prelude = [
  mk("ensure(pp,2,3)", (w) => w.ensure("pp", 2, 3)),
  mk("ensure(kp,1,2)", (w) => w.ensure("kp", 1, 2)),
  mk("ensure(ext,1,2)", (w) => w.ensure("ext", 1, 2)),
  mk("register(0)", (w) => w.register(0, false)),
  mk("tick()", (w) => w.tick([], false)),
  mk("warmUp()", (w) => w.warmUp()),
];
