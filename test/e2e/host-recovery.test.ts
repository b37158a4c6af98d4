/**
 * An operator recovers a host (docs/host-identity.md, "Recovery by an
 * operator"), with a real `berth serve`, a real `berth agent` and the CLI:
 * `berth host reset-identity NAME` puts the host back to `awaiting` and
 * prints a one-time enroll token; until the real agent uses it nothing else
 * binds the host (the shared enroll token is refused `host_exists`, the old
 * credentials are gone); the agent, given the token, binds its key, the host
 * is `active` again and serves borrowers at its own gateway, the token is
 * spent, and both steps are in the audit.
 *
 * Seen failing before the command existed: `berth host reset-identity`
 * was an unknown command (exit 2), so a stranded host had no way back.
 * Seen failing later: the agent removed its enroll token file on every
 * tick while the coordinator refused it `host_awaiting`, so the one-time
 * token written there was gone before the rebind read it (ENOENT, never
 * active again).
 */
import { after, describe, it } from "node:test";
import assert from "node:assert/strict";
import { existsSync, writeFileSync } from "node:fs";
import { request } from "undici";
import { generateSshKeyPair } from "../../src/core/ssh-keys.js";
import { Fleet } from "../helpers/identity-fleet.js";
import { sshConnect, sshExec } from "../helpers/portable-e2e.js";

interface HostView {
  name: string;
  id: string;
  ssh: { port: number; fingerprint: string };
  identity: { state: string; keyFingerprint: string | null };
}

async function hostView(f: Fleet, name: string): Promise<HostView> {
  const r = await f.api.call<{ hosts: HostView[] }>("GET", "/v1/hosts");
  return r.hosts.find((h) => h.name === name)!;
}

async function enrollWith(f: Fleet, token: string, name: string): Promise<{ status: number; body: { hostCallToken?: string; error?: { code: string } } }> {
  const r = await request(`${f.coord!.url}/v1/hosts/enroll`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${token}` },
    body: JSON.stringify({
      name,
      url: "http://127.0.0.1:9",
      runtime: "process",
      capacity: { vcpu: 1, memoryMb: 512, slots: 1 },
      ssh: { host: "127.0.0.1", port: 2, hostKey: generateSshKeyPair("intruder").publicKey, fingerprint: "SHA256:intruder" },
    }),
  });
  return { status: r.statusCode, body: (await r.body.json()) as { hostCallToken?: string; error?: { code: string } } };
}

describe("berth host reset-identity (real coordinator, real agent, the CLI)", () => {
  const fleets: Fleet[] = [];
  after(async () => {
    for (const f of fleets) await f.close();
  });

  it("the host awaits its agent; only the one-time token binds it; the agent binds its key and serves again; audited", { timeout: 240_000 }, async () => {
    const f = new Fleet();
    fleets.push(f);
    await f.start();
    const keeper = generateSshKeyPair("recovery-keeper");
    await f.startAgent("h1", { slots: 1 });
    await f.waitFor("h1 active", async () => (await hostView(f, "h1")).identity.state === "active", 60_000);
    await f.api.call("POST", "/v1/pools/p/ensure", { minReady: 1, maxReady: 1, compatibilityKey: "rec", provider: "hosts", keeperKey: keeper.publicKey });
    await f.waitFor("1 ready", async () => (await f.api.call<{ counts: { ready: number } }>("GET", "/v1/pools/p")).counts.ready === 1, 60_000);
    const before = await hostView(f, "h1");

    const reset = await f.cli(["host", "reset-identity", "h1"]);
    assert.equal(reset.status, 0, reset.stderr);
    const oneTime = reset.stdout.trim();
    assert.match(oneTime, /^bat_[A-Za-z0-9_-]{43}$/, "the one-time enroll token is printed alone on stdout");
    assert.match(reset.stderr, /awaits its agent/);
    const awaiting = await hostView(f, "h1");
    assert.equal(awaiting.identity.state, "awaiting");
    assert.equal(awaiting.identity.keyFingerprint, null, "the recorded key is forgotten");
    assert.equal((await f.audit("host_identity_reset")).length, 1);

    // The shared enroll token still cannot take the host.
    const shared = await enrollWith(f, f.agentToken, "h1");
    assert.equal(shared.status, 409);
    assert.equal(shared.body.error?.code, "host_exists");
    assert.equal(shared.body.hostCallToken, undefined);
    // Neither can the one-time token without a proof of a key.
    const unproven = await enrollWith(f, oneTime, "h1");
    assert.equal(unproven.status, 409);
    assert.equal(unproven.body.hostCallToken, undefined);
    assert.equal((await hostView(f, "h1")).identity.state, "awaiting");

    // The real agent is restarted (its session is refused \`host_awaiting\`, so it looks for the reset's
    // token on every tick) and given the one-time token in its --enroll-token-file: it binds its key.
    await f.stopAgent("h1");
    await f.startAgent("h1", { slots: 1 });
    writeFileSync(f.agents.get("h1")!.tokenFile, oneTime + "\n", { mode: 0o600 });
    await f.waitFor("h1 active again", async () => (await hostView(f, "h1")).identity.state === "active", 90_000).catch((e: unknown) => {
      throw new Error(`${String(e)}; the agent said:\n${f.agents.get("h1")!.output().slice(-3000)}`);
    });
    // The spent one-time token does not stay on the host's disk.
    const tokenFile = f.agents.get("h1")!.tokenFile;
    await f.waitFor("the token file removed", async () => !existsSync(tokenFile), 10_000);
    const after_ = await hostView(f, "h1");
    assert.equal(after_.id, before.id, "the same host");
    assert.ok(after_.identity.keyFingerprint !== null);
    assert.equal((await f.audit("host_identity_bound")).length, 1);
    // The one-time token is spent.
    const again = await enrollWith(f, oneTime, "h9");
    assert.equal(again.status, 401);

    // And the host serves a borrower at its own gateway.
    await f.waitFor("1 ready again", async () => (await f.api.call<{ counts: { ready: number } }>("GET", "/v1/pools/p")).counts.ready === 1, 90_000);
    const b = await f.api.call<{ borrowId: string; borrowToken: string; machine: { id: string; ssh: { host: string; port: number; user: string; hostKey: string } } }>("POST", "/v1/pools/p/borrow", {});
    assert.equal(b.machine.ssh.port, after_.ssh.port);
    const c = await sshConnect({ id: b.machine.id, generation: 0, ssh: b.machine.ssh }, keeper.privateKey);
    try {
      assert.equal((await sshExec(c, "echo recovered")).out.trim(), "recovered");
    } finally {
      c.end();
    }
    await f.api.call("POST", `/v1/borrows/${b.borrowId}/return`, { token: b.borrowToken });
  });
});
