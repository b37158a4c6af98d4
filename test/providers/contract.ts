/**
 * The provider contract: what the coordinator relies on from any provider
 * that serves portable pools, checked through `Provider.run` alone with the
 * operation requests the executor sends, and through real SSH to the
 * machine. Each provider runs it with its own harness (hosts: a real berth
 * agent; aws: the EC2/SSM emulator).
 *
 *   - provision returns an SSH endpoint and a pinned host key;
 *   - an installed grant key gives usable access; a replay of the same op id
 *     answers again without a second key;
 *   - remove_key ends new logins with that key;
 *   - fence ends an already-open session and reports a new incarnation;
 *   - scrub leaves nothing of the borrower; the next generation's key works
 *     and the old one does not;
 *   - a late install for an older generation changes nothing;
 *   - destroy is confirmed, idempotent, and leaves no resource.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import type { OperationOutcome, OperationRequest, Provider } from "../../src/providers/provider.js";
import { parseOpRowArgs } from "../../src/protocol/operations.js";
import type { MachineRow } from "../../src/store/machines.js";
import { generateSshKeyPair } from "../../src/core/ssh-keys.js";
import { connect, execStreaming, type ExecResult } from "../../src/cli/ssh-client.js";
import { Writable } from "node:stream";

export interface ContractHarness {
  provider: Provider;
  machine(id: string): MachineRow;
  /** The SSH user that reaches the machine. */
  userOf(m: MachineRow): string;
  /** The provider's resource for the machine no longer exists. */
  gone(m: MachineRow): Promise<boolean>;
  close(): Promise<void>;
}

let seq = 0;

/** Runs an operation as the executor does: the same op id again while the outcome is ambiguous. */
export async function settle(p: Provider, req: OperationRequest, max = 12): Promise<OperationOutcome> {
  for (let i = 1; ; i++) {
    const o = await p.run(req);
    if (o.kind !== "ambiguous" || i >= max) return o;
  }
}

function req(kind: OperationRequest["kind"], m: MachineRow, generation: number, args: Record<string, unknown> = {}): OperationRequest {
  // Read as the executor reads an operation row (protocol/operations.ts).
  return { opId: `op_contract_${process.pid}_${++seq}`, ...parseOpRowArgs(kind, JSON.stringify(args)), machine: m, generation };
}

function ok(o: OperationOutcome, what: string): Record<string, unknown> {
  assert.equal(o.kind, "done", `${what}: ${o.kind === "done" ? "" : o.error}`);
  return (o as { result: Record<string, unknown> }).result;
}

const devNull = () =>
  new Writable({
    write(_c, _e, cb) {
      cb();
    },
  });

export async function ssh(t: { host: string; port: number; user: string; hostKey: string }, key: string, command: string): Promise<{ ok: boolean; out: string; code: number | null; error?: string }> {
  let c;
  try {
    c = await connect({ ...t, privateKey: key }, 5_000);
  } catch (e) {
    return { ok: false, out: "", code: null, error: e instanceof Error ? e.message : String(e) };
  }
  try {
    let out = "";
    const r = await execStreaming(c, command, {
      stdout: new Writable({
        write(chunk: Buffer, _e, cb) {
          out += chunk.toString();
          cb();
        },
      }),
      stderr: devNull(),
    });
    return { ok: true, out, code: r.code };
  } finally {
    c.end();
  }
}

export function grantArgs(publicKey: string, grantId: string, expiresAt: number): Record<string, unknown> {
  return { publicKey, mode: "grant", grantId, expiresAt };
}

export function providerContract(name: string, make: () => Promise<ContractHarness>, opts: { skip?: string | false; timeout?: number } = {}): void {
  test(`${name}: provider contract — access, revoke, fence of an open session, scrub, reborrow, stale install refused, confirmed destroy`, { skip: opts.skip, timeout: opts.timeout ?? 180_000 }, async () => {
    const h = await make();
    try {
      const p = h.provider;
      const m = h.machine(`m_contract${process.pid}${Date.now() % 100000}`);
      const prov = ok(await settle(p, req("provision", m, 0)), "provision");
      const target = { host: String(prov.sshHost), port: Number(prov.sshPort), user: h.userOf(m), hostKey: String(prov.hostKey) };
      assert.ok(target.host && target.port > 0 && /^ssh-ed25519 /.test(target.hostKey), JSON.stringify(prov));

      // Generation 1: a grant key gives usable access; the replay of its op id does not add a key.
      const k1 = generateSshKeyPair("b1");
      const g1 = { ...m, generation: 1 };
      const install1 = req("install_key", g1, 1, grantArgs(k1.publicKey, "g_one", Date.now() + 10 * 60_000));
      ok(await settle(p, install1), "install gen 1");
      ok(await settle(p, install1), "install gen 1 replayed");
      const used = await ssh(target, k1.privateKey, "echo secret > ~/b1.txt; echo usable");
      assert.deepEqual([used.ok, used.out], [true, "usable\n"]);

      // An open session of borrower 1, still running when its access is revoked and fenced.
      const c = await connect({ ...target, privateKey: k1.privateKey }, 5_000);
      const open: Promise<ExecResult> = execStreaming(c, "sleep 300", { stdout: devNull(), stderr: devNull() });
      open.catch(() => undefined);
      ok(await settle(p, req("remove_key", g1, 1, { grantId: "g_one" })), "remove_key gen 1");
      assert.equal((await ssh(target, k1.privateKey, "true")).ok, false, "a removed key logs in no more");
      const fenced = ok(await settle(p, req("fence", g1, 1)), "fence gen 1");
      assert.notEqual(String(fenced.incarnation ?? fenced.incarnationAfter), String(prov.incarnation), "fence reports a new incarnation");
      const ended = await Promise.race([open.then(() => "ended", () => "ended"), new Promise((r) => setTimeout(() => r("still open"), 15_000))]);
      c.end();
      assert.equal(ended, "ended", "the session open before the fence is gone");
      ok(await settle(p, req("scrub", g1, 1)), "scrub gen 1");

      // Generation 2: a new borrower on the same machine.
      const k2 = generateSshKeyPair("b2");
      const g2 = { ...m, generation: 2 };
      ok(await settle(p, req("install_key", g2, 2, grantArgs(k2.publicKey, "g_two", Date.now() + 10 * 60_000))), "install gen 2");
      const r2 = await ssh(target, k2.privateKey, "ls ~ | grep -c b1.txt; true");
      assert.deepEqual([r2.ok, r2.out], [true, "0\n"], "borrower 2 sees nothing of borrower 1");
      assert.equal((await ssh(target, k1.privateKey, "true")).ok, false, "borrower 1's key stays refused");

      // A late install for generation 1 (a new op id, as a delayed duplicate would be) changes nothing.
      const late = await settle(p, req("install_key", g1, 1, grantArgs(k1.publicKey, "g_one", Date.now() + 10 * 60_000)));
      assert.equal(late.kind, "failed", "a stale-generation install is refused");
      assert.equal((await ssh(target, k1.privateKey, "true")).ok, false, "and restores no key");
      assert.equal((await ssh(target, k2.privateKey, "echo still")).out, "still\n", "and leaves the current borrower alone");

      ok(await settle(p, req("remove_key", g2, 2, { grantId: "g_two" })), "remove_key gen 2");
      ok(await settle(p, req("fence", g2, 2)), "fence gen 2");
      ok(await settle(p, req("destroy", g2, 2)), "destroy");
      ok(await settle(p, req("destroy", g2, 2)), "destroy again (already gone)");
      assert.equal(await h.gone(m), true, "no resource is left");
    } finally {
      await h.close();
    }
  });
}
