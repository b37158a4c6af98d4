/**
 * The enroll token can never take a host's place (docs/host-identity.md,
 * "The threat it closes"): a real `berth serve`, real `berth agent`
 * processes, and an attacker who holds only the shared enroll token (an
 * `agent`-role API token) and runs an agent of its own (a small HTTP server
 * that answers the identity prepare with the attacker's key).
 *
 *   - the timing race: while an operator switches a host, the attacker polls
 *     `GET /v1/hosts` for `prepared` and enrolls under the host's name (and
 *     also fires enrollments blindly all the way through);
 *   - the crash point: the agent is SIGKILLed just after the prepare (the
 *     coordinator holds `prepared`), the attacker enrolls, the agent restarts;
 *   - the escalation: the operator then runs `berth host activate --force`;
 *   - legacy hosts: the attacker enrolls under the name of a host still on
 *     its host-call token.
 *
 * Each ends with the attacker refused (`host_exists`, no token in any
 * answer, nothing changed), the attacker's agent never called, and the real
 * host active on its own key, lending machines at its own SSH address and
 * host key.
 */
import { after, describe, it } from "node:test";
import assert from "node:assert/strict";
import { createPrivateKey, createPublicKey, generateKeyPairSync, sign } from "node:crypto";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { request } from "undici";
import { generateSshKeyPair } from "../../src/core/ssh-keys.js";
import { callProof, identityFingerprint, proofMessage } from "../../src/core/host-identity.js";
import { hashToken } from "../../src/core/tokens.js";
import { Fleet } from "../helpers/identity-fleet.js";
import { sshConnect, sshExec } from "../helpers/portable-e2e.js";

interface Answer {
  status: number;
  body: { hostCallToken?: string; error?: { code: string; message: string }; hosts?: Array<{ name: string; id: string; identity: { state: string } }> };
}

/** The attacker: the enroll token, an agent of its own, and what it tried. */
class Attacker {
  readonly key = generateKeyPairSync("ed25519");
  readonly publicKey = this.key.publicKey.export({ format: "der", type: "spki" }).toString("base64");
  readonly sshKey = generateSshKeyPair("attacker-host");
  /** Every request the attacker's agent received (the Authorization header would be a stolen host-call token). */
  readonly received: Array<{ path: string; auth: string | undefined }> = [];
  readonly answers: Answer[] = [];
  server: Server | null = null;
  url = "";
  /** How the attacker's agent proves the host-call token in its prepare answer (see the last test). */
  callProof: "none" | "wrong" | { tokenHash: string } = "none";

  constructor(
    readonly coordinator: string,
    readonly token: string,
  ) {}

  async start(hostIdOf: () => string): Promise<void> {
    this.server = createServer((req, res) => {
      let body = "";
      req.on("data", (c: Buffer) => (body += c.toString()));
      req.on("end", () => {
        this.received.push({ path: req.url ?? "", auth: req.headers.authorization });
        if (req.url === "/v1/agent/identity/prepare") {
          const { challenge } = JSON.parse(body) as { challenge: string };
          const signature = sign(null, proofMessage("prepare", hostIdOf(), challenge), this.key.privateKey).toString("base64");
          const cp = this.callProof;
          const proof = cp === "none" ? {} : { callProof: callProof(cp === "wrong" ? hashToken("host-call", "bhc_guessed") : cp.tokenHash, "prepare", hostIdOf(), challenge, this.publicKey) };
          res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ publicKey: this.publicKey, signature, step: "prepared", ...proof }));
          return;
        }
        res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ opId: "x", status: "done", result: {} }));
      });
    });
    await new Promise<void>((r) => this.server!.listen(0, "127.0.0.1", () => r()));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  async #call(method: "GET" | "POST", path: string, body?: unknown): Promise<Answer> {
    const r = await request(`${this.coordinator}${path}`, {
      method,
      headers: { "content-type": "application/json", authorization: `Bearer ${this.token}` },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    });
    const text = await r.body.text();
    const a = { status: r.statusCode, body: (text ? JSON.parse(text) : {}) as Answer["body"] };
    this.answers.push(a);
    return a;
  }

  /** GET /v1/hosts with the enroll token. */
  hosts(): Promise<Answer> {
    return this.#call("GET", "/v1/hosts");
  }

  /** Enroll under `name` with the attacker's URL, SSH address and host key (and, optionally, a proof of the attacker's key). */
  async enroll(name: string, withProof = false): Promise<Answer> {
    const body: Record<string, unknown> = {
      name,
      url: this.url,
      runtime: "process",
      capacity: { vcpu: 1, memoryMb: 512, slots: 4 },
      ssh: { host: "127.0.0.1", port: 2, hostKey: this.sshKey.publicKey, fingerprint: "SHA256:attacker" },
    };
    if (withProof) {
      const c = await request(`${this.coordinator}/v1/hosts/challenge`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
      const { challenge } = (await c.body.json()) as { challenge: string };
      body.identity = { publicKey: this.publicKey, challenge, signature: sign(null, proofMessage("enroll", name, challenge), this.key.privateKey).toString("base64") };
    }
    return this.#call("POST", "/v1/hosts/enroll", body);
  }

  /** Every enrollment it tried was refused `host_exists`, and no answer ever carried a host-call token. */
  assertRefused(what: string): void {
    const enrolls = this.answers.filter((a) => a.status !== 403 || a.body.error?.code !== "forbidden");
    assert.ok(enrolls.length > 0, `${what}: the attacker tried at least once`);
    for (const a of this.answers) {
      assert.equal(a.body.hostCallToken, undefined, `${what}: an answer to the attacker carried a host-call token (${a.status})`);
      assert.ok(a.status === 409 || a.status === 403, `${what}: the attacker was answered ${a.status} ${JSON.stringify(a.body).slice(0, 300)}`);
      if (a.status === 409) assert.equal(a.body.error?.code, "host_exists", what);
    }
    assert.deepEqual(this.received, [], `${what}: the attacker's agent was never called`);
  }

  close(): Promise<void> {
    return new Promise((r) => (this.server ? this.server.close(() => r()) : r()));
  }
}

/** The identity key fingerprint of an agent's state directory (what only that agent can prove). */
function agentKeyFingerprint(f: Fleet, name: string): string {
  const priv = createPrivateKey(readFileSync(join(f.dir.path, `agent-${name}`, "identity_ed25519"), "utf8"));
  return identityFingerprint(createPublicKey(priv).export({ format: "der", type: "spki" }).toString("base64"));
}

/** The SSH gateway address and host key fingerprint the agent's ready line names (its last start). */
function gatewayOf(f: Fleet, name: string): { port: number; fingerprint: string } {
  const lines = f.agents.get(name)!.output().split("\n").filter((l) => l.startsWith("{") && l.includes('"berth agent ready"'));
  const last = JSON.parse(lines.at(-1)!) as { ssh: string; hostKeyFingerprint: string };
  return { port: Number(last.ssh.split(":").at(-1)), fingerprint: last.hostKeyFingerprint };
}

async function ensurePool(f: Fleet, n: number, keeperKey: string | null): Promise<void> {
  await f.api.call("POST", "/v1/pools/p/ensure", { minReady: n, maxReady: n, compatibilityKey: "hij", provider: "hosts", keeperKey });
}

async function ready(f: Fleet, n: number): Promise<void> {
  await f.waitFor(`${n} ready`, async () => (await f.api.call<{ counts: { ready: number } }>("GET", "/v1/pools/p")).counts.ready === n, 60_000);
}

/** A dump once the coordinator's background work settled (two dumps a moment apart agree): what "changes nothing" is checked against. */
async function settledDump(f: Fleet): Promise<Record<string, string>> {
  let last = await f.dump();
  return f.waitFor("the coordinator settles", async () => {
    await new Promise((r) => setTimeout(r, 1500));
    const now = await f.dump();
    const same = JSON.stringify(now) === JSON.stringify(last);
    last = now;
    return same ? now : null;
  });
}

/** The real host is active on its own key, and a borrower is sent to its own gateway and gets a shell there. */
async function servesOnItsOwn(f: Fleet, name: string, keeper: { privateKey: string }): Promise<void> {
  const h = await f.api.call<{ hosts: Array<{ name: string; url: string; ssh: { port: number; fingerprint: string }; identity: { state: string; keyFingerprint: string } }> }>("GET", "/v1/hosts");
  const host = h.hosts.find((x) => x.name === name)!;
  assert.equal(host.identity.state, "active");
  assert.equal(host.identity.keyFingerprint, agentKeyFingerprint(f, name), "the host's recorded key is the real agent's");
  const gw = gatewayOf(f, name);
  assert.equal(host.ssh.port, gw.port, "the host's SSH address is the real gateway's");
  assert.equal(host.ssh.fingerprint, gw.fingerprint, "the host's SSH host key is the real gateway's");
  const b = await f.api.call<{ borrowId: string; borrowToken: string; machine: { id: string; ssh: { host: string; port: number; user: string; hostKey: string } } }>("POST", "/v1/pools/p/borrow", {});
  assert.equal(b.machine.ssh.port, gw.port, "the borrower is sent to the real gateway");
  const c = await sshConnect({ id: b.machine.id, generation: 0, ssh: b.machine.ssh }, keeper.privateKey);
  try {
    const r = await sshExec(c, "echo served-by-the-real-host");
    assert.equal(r.out.trim(), "served-by-the-real-host");
  } finally {
    c.end();
  }
  await f.api.call("POST", `/v1/borrows/${b.borrowId}/return`, { token: b.borrowToken });
}

describe("the enroll token never takes a host's place (real coordinator, real agent, an attacker with the enroll token)", () => {
  const fleets: Fleet[] = [];
  const attackers: Attacker[] = [];
  after(async () => {
    for (const a of attackers) await a.close();
    for (const f of fleets) await f.close();
  });
  const setup = async (): Promise<{ f: Fleet; atk: Attacker; keeper: ReturnType<typeof generateSshKeyPair> }> => {
    const f = new Fleet();
    fleets.push(f);
    await f.start();
    const atk = new Attacker(f.coord!.url, f.agentToken);
    attackers.push(atk);
    await atk.start(() => "h_unknown");
    return { f, atk, keeper: generateSshKeyPair("hijack-keeper") };
  };

  it("the timing race: polling /v1/hosts for `prepared` and enrolling under the host's name (and blindly, all through the switch) is refused every time", { timeout: 180_000 }, async () => {
    const { f, atk, keeper } = await setup();
    await f.startAgent("victim", { legacy: true, slots: 2 });
    await ensurePool(f, 2, keeper.publicKey);
    await ready(f, 2);

    let stop = false;
    let sawPrepared = false;
    const race = (async () => {
      while (!stop) {
        const hosts = await atk.hosts();
        const state = hosts.status === 200 ? hosts.body.hosts?.find((h) => h.name === "victim")?.identity.state : undefined;
        if (state === "prepared") sawPrepared = true;
        await atk.enroll("victim");
        await new Promise((r) => setTimeout(r, 5));
      }
    })();
    const act = await f.cli(["host", "activate", "victim", "--wait", "--timeout", "90s"]);
    stop = true;
    await race;
    assert.equal(act.status, 0, act.stderr);
    atk.assertRefused("the race");
    assert.equal(sawPrepared, false, "the enroll token cannot read the hosts (so it cannot watch for `prepared`)");
    assert.ok(atk.answers.some((a) => a.status === 403 && a.body.error?.code === "forbidden"), "GET /v1/hosts is forbidden to the enroll token");
    await ready(f, 2);
    await servesOnItsOwn(f, "victim", keeper);
  });

  it("the crash point: the agent SIGKILLed right after the prepare (the coordinator holds `prepared`); the attacker's enrollment, with or without a key of its own, changes nothing; the agent restarts and commits", { timeout: 180_000 }, async () => {
    const { f, atk, keeper } = await setup();
    await f.startAgent("victim", { legacy: true, crash: "renamed:local", slots: 1 });
    await ensurePool(f, 1, keeper.publicKey);
    await ready(f, 1);
    const act = await f.cli(["host", "activate", "victim"]);
    assert.equal(act.status, 0, act.stderr);
    await f.exited("victim");
    assert.equal((await f.host("victim")).identity.state, "prepared");

    const dump = await settledDump(f);
    await atk.enroll("victim");
    await atk.enroll("victim", true);
    atk.assertRefused("enrollment while prepared");
    assert.deepEqual(await f.dump(), dump, "a refused enrollment changes no table");

    await f.startAgent("victim", { slots: 1 });
    await f.waitFor("active", async () => (await f.host("victim")).identity.state === "active", 60_000);
    await atk.enroll("victim");
    atk.assertRefused("enrollment once active");
    await ready(f, 1);
    await servesOnItsOwn(f, "victim", keeper);
  });

  it("the escalation: with the attacker refused, `berth host activate --force` reaches only the real agent and records only its key", { timeout: 180_000 }, async () => {
    const { f, atk, keeper } = await setup();
    await f.startAgent("victim", { legacy: true, slots: 1 });
    await ensurePool(f, 1, keeper.publicKey);
    await ready(f, 1);
    const hostId = (await f.host("victim")).id;
    // The attacker's agent proves its own key for this host id, should it ever be called.
    await atk.close();
    await atk.start(() => hostId);
    await atk.enroll("victim");
    const forced = await f.cli(["host", "activate", "victim", "--force", "--wait", "--timeout", "30s"]);
    assert.equal(forced.status, 0, forced.stderr);
    atk.assertRefused("the escalation");
    await ready(f, 1);
    await servesOnItsOwn(f, "victim", keeper);
  });

  it("legacy hosts: a host still on its host-call token is not re-pointed by the enroll token, no token is returned, no table changes", { timeout: 120_000 }, async () => {
    const { f, atk, keeper } = await setup();
    await f.startAgent("old", { legacy: true, slots: 1 });
    await ensurePool(f, 1, keeper.publicKey);
    await ready(f, 1);
    const dump = await settledDump(f);
    await atk.enroll("old");
    await atk.enroll("old", true);
    atk.assertRefused("a legacy host");
    assert.deepEqual(await f.dump(), dump, "a refused enrollment changes no table");
    assert.equal((await f.host("old")).identity.state, "legacy");
    // Still serving on its token: a borrower reaches the real gateway.
    const gw = gatewayOf(f, "old");
    const b = await f.api.call<{ borrowId: string; borrowToken: string; machine: { id: string; ssh: { host: string; port: number; user: string; hostKey: string } } }>("POST", "/v1/pools/p/borrow", {});
    assert.equal(b.machine.ssh.port, gw.port);
    const c = await sshConnect({ id: b.machine.id, generation: 0, ssh: b.machine.ssh }, keeper.privateKey);
    assert.equal((await sshExec(c, "echo still-mine")).out.trim(), "still-mine");
    c.end();
  });

  it("the switch never records a key without a proof of the host's current host-call token (an agent of the attacker's own new host, activated)", { timeout: 120_000 }, async () => {
    const { f, atk } = await setup();
    // A new name is the enroll token's to create: the attacker's own host, on its host-call token.
    let ownId = "";
    await atk.close();
    await atk.start(() => ownId);
    const own = await atk.enroll("attackers-own");
    assert.equal(own.status, 200);
    ownId = (await f.host("attackers-own")).id;
    const tokenHash = hashToken("host-call", own.body.hostCallToken!);
    for (const mode of ["none", "wrong"] as const) {
      atk.callProof = mode;
      const act = await f.cli(["host", "activate", "attackers-own"]);
      assert.equal(act.status, 1, act.stdout);
      assert.match(act.stderr, /unauthorized: the agent of host attackers-own answered the prepare without a proof of the host's current host-call token; no key was recorded/);
      const h = await f.host("attackers-own");
      assert.equal(h.identity.state, "legacy", `${mode}: back on its token, nothing recorded`);
      assert.equal((h.identity as { keyFingerprint?: string | null }).keyFingerprint, null);
    }
    const metrics = await (await request(`${f.coord!.url}/metrics`)).body.text();
    assert.match(metrics, /berth_host_identity_refusals_total\{code="proof_invalid"\} 2/);
    // With the proof of its own token, its own key is recorded: the proof is what the switch needs.
    atk.callProof = { tokenHash };
    const ok = await f.cli(["host", "activate", "attackers-own"]);
    assert.equal(ok.status, 0, ok.stderr);
    assert.equal((await f.host("attackers-own")).identity.state, "prepared");
    atk.received.length = 0;
  });
});
