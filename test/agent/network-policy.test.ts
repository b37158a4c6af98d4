/** Network policy (pure): parsing, canonical form, fingerprint, the ruleset text, the probe plan, the readiness verdict. */
import { strict as assert } from "node:assert";
import { describe, it } from "node:test";
import { isBerthError } from "../../src/core/errors.js";
import { hostAddressRefusal, makePolicy, parseAllowEntry, parsePolicy, permitsTcp, policyFingerprint, NO_NETWORK } from "../../src/core/network-policy.js";
import { readinessVerdict, type ReadinessEvidence } from "../../src/core/network-evidence.js";
import { machineRuleset } from "../../src/agent/network/ruleset.js";
import { probePlan } from "../../src/agent/network/probe.js";

function refused(f: () => unknown): string {
  try {
    f();
  } catch (e) {
    assert.ok(isBerthError(e));
    assert.equal(e.code, "invalid_request");
    return e.message;
  }
  assert.fail("expected a refusal");
}

describe("network policy", () => {
  it("canonicalises allow entries and refuses what the platform deny list always refuses", () => {
    assert.equal(parseAllowEntry("10.1.2.3/16").text, "10.1.0.0/16");
    assert.equal(parseAllowEntry("203.0.113.7:443").text, "203.0.113.7:443");
    assert.equal(parseAllowEntry("Registry.NPMJS.org:443").text, "registry.npmjs.org:443");
    assert.deepEqual(parseAllowEntry("203.0.113.0/24:8000-8080").ports, [8000, 8080]);
    assert.match(refused(() => parseAllowEntry("169.254.169.254:80")), /platform deny list/);
    assert.match(refused(() => parseAllowEntry("127.0.0.1")), /platform deny list/);
    assert.match(refused(() => parseAllowEntry("example.com")), /without a port/);
    assert.match(refused(() => parseAllowEntry("10.0.0.0/33")), /not a valid IPv4/);
    assert.match(refused(() => parseAllowEntry("1.2.3.4:0")), /invalid port/);
    assert.match(refused(() => makePolicy("none", ["1.2.3.4"])), /need --network egress/);
    assert.match(refused(() => makePolicy("egress", [], ["not-an-ip"])), /not an IPv4 address/);
  });

  it("refuses an allow entry naming exactly an enrolled host's address; one containing it opens the rest and is accepted", () => {
    const hosts = ["192.0.2.10", "e2e.example", "198.51.100.7"];
    assert.match(hostAddressRefusal(makePolicy("egress", ["192.0.2.10:22"]), hosts) ?? "", /names the address of an enrolled host \(192\.0\.2\.10\)/);
    assert.match(hostAddressRefusal(makePolicy("egress", ["203.0.113.1:443", "198.51.100.7/32:80"]), hosts) ?? "", /198\.51\.100\.7/);
    assert.equal(hostAddressRefusal(makePolicy("egress", ["192.0.2.0/24:443", "0.0.0.0/0"]), hosts), null);
    assert.equal(hostAddressRefusal(makePolicy("egress", ["192.0.2.11:22"]), hosts), null);
    assert.equal(hostAddressRefusal(makePolicy("none"), hosts), null);
  });

  it("has one fingerprint per canonical policy; none is 'none'", () => {
    const a = makePolicy("egress", ["b.example:443", "10.0.0.0/8", "b.example:443"], ["10.0.0.53"]);
    const b = makePolicy("egress", ["10.0.0.0/8", "B.example:443"], ["10.0.0.53"]);
    assert.deepEqual(a, b);
    assert.equal(policyFingerprint(a), policyFingerprint(b));
    assert.match(policyFingerprint(a), /^np-[0-9a-f]{16}$/);
    assert.notEqual(policyFingerprint(a), policyFingerprint(makePolicy("egress", ["10.0.0.0/8"], ["10.0.0.53"])));
    assert.equal(policyFingerprint(NO_NETWORK), "none");
    assert.deepEqual(parsePolicy(JSON.parse(JSON.stringify(a))), a);
    assert.deepEqual(parsePolicy(null), NO_NETWORK);
  });

  it("permits: deny list first, private ranges only when opened explicitly, SMTP never", () => {
    const p = makePolicy("egress", ["0.0.0.0/0", "10.9.0.0/16:5432", "pkg.example:443"]);
    assert.equal(permitsTcp(p, "203.0.113.9", 443), true);
    assert.equal(permitsTcp(p, "10.1.2.3", 443), false, "0.0.0.0/0 does not open private ranges");
    assert.equal(permitsTcp(p, "10.9.1.1", 5432), true, "an entry inside a private range opens it");
    assert.equal(permitsTcp(p, "169.254.169.254", 80), false);
    assert.equal(permitsTcp(p, "203.0.113.9", 25), false);
    assert.equal(permitsTcp(p, "10.213.0.6", 443, {}, ["10.213.0.0/16"]), false, "other machines are never reachable");
    assert.equal(permitsTcp(p, "192.168.1.5", 443, { "pkg.example": ["192.168.1.5"] }), true, "a pinned name opens its addresses");
  });

  it("ruleset: refusals before allows, private opens before the private refusal, one table per machine", () => {
    const policy = makePolicy("egress", ["203.0.113.0/24:443", "10.9.0.0/16", "pkg.example:443"], ["10.0.0.53"]);
    const text = machineRuleset({
      table: "berth_ab_cd", hostIf: "bmabcd", guestIp: "10.213.0.2", policy, resolved: { "pkg.example": ["198.51.100.7"] },
      machineRange: "10.213.0.0/16", denyServices: [{ ip: "192.0.2.10", port: 7300 }],
    });
    const order = ["@hard_deny", "@deny_services", "th dport { 25, 465, 587 }", "@explicit accept", "@private jump refuse", "@allow accept"].map((s) => text.indexOf(s));
    assert.ok(order.every((i) => i > 0), text);
    assert.deepEqual([...order].sort((x, y) => x - y), order, "rules in the documented order");
    assert.match(text, /10\.9\.0\.0\/16 \. tcp \. 0-65535/);
    assert.match(text, /198\.51\.100\.7 \. tcp \. 443/);
    assert.match(text, /10\.0\.0\.53 \. udp \. 53/);
    assert.match(text, /192\.0\.2\.10 \. 7300/);
    assert.match(text, /reject with tcp reset/);
    assert.match(text, /reject with icmpx admin-prohibited/);
    assert.ok(text.startsWith("table inet berth_ab_cd {}\ndelete table inet berth_ab_cd\n"), "reloading is one atomic replace");
  });

  it("probe plan: permit target from the allow list, metadata, the canary, agent listeners where they listen, coordinator, resolvers", () => {
    const policy = makePolicy("egress", ["pkg.example:443"], ["10.0.0.53"]);
    const plan = probePlan({
      policy, resolved: { "pkg.example": ["198.51.100.7"] }, gatewayIp: "10.213.0.1", canaryPort: 40001,
      agentPorts: [{ host: "0.0.0.0", port: 7400, why: "agent API" }, { host: "192.0.2.77", port: 7422, why: "agent SSH gateway" }, { host: "127.0.0.1", port: 7500, why: "loopback only" }],
      coordinator: [{ ip: "192.0.2.10", port: 7300 }], settings: { deny: [{ host: "198.51.100.7", port: 443, why: "x" }], refusedResolvers: ["10.0.0.53", "10.255.255.53"] },
      machineRange: "10.213.0.0/16",
    });
    const t = plan.map((x) => `${x.kind} ${x.host}:${x.port}`);
    assert.deepEqual(t, [
      "permit 198.51.100.7:443", "deny 169.254.169.254:80", "deny 10.213.0.1:40001", "deny 10.213.0.1:7400", "deny 192.0.2.77:7422", "deny 192.0.2.10:7300",
      "dns-answer 10.0.0.53:53", "dns-refused 10.255.255.53:53", "pinned pkg.example:0",
    ], "a wildcard listener is probed at the gateway, a bound one at its address, a loopback one not at all; a deny target the policy permits and an allowed resolver are not probed as refused");
  });

  it("probe plan: the permit check never aims at a port the deny list always refuses", () => {
    const policy = makePolicy("egress", ["198.51.100.9:20-30", "203.0.113.5:443"]);
    const plan = probePlan({
      policy, resolved: {}, gatewayIp: "10.213.0.1", canaryPort: null, agentPorts: [], coordinator: [], settings: {}, machineRange: "10.213.0.0/16",
    });
    assert.deepEqual(plan.filter((x) => x.kind === "permit").map((x) => `${x.host}:${x.port}`), ["198.51.100.9:20"], "the range's first port that is open");
    const smtpOnly = probePlan({
      policy: makePolicy("egress", ["198.51.100.9:465"]), resolved: {}, gatewayIp: "10.213.0.1", canaryPort: null, agentPorts: [], coordinator: [],
      settings: { permit: { host: "203.0.113.8", port: 80 } }, machineRange: "10.213.0.0/16",
    });
    assert.deepEqual(smtpOnly.filter((x) => x.kind === "permit").map((x) => `${x.host}:${x.port}`), ["203.0.113.8:80"], "not the SMTP port: the configured target");
  });

  it("readiness verdict: ready only with passing evidence for the machine's policy and generation", () => {
    const e = (o: Partial<ReadinessEvidence> = {}): ReadinessEvidence => ({
      result: "pass", policyFingerprint: "np-1", generation: 4, incarnation: "i", at: 0, durationMs: 1, checks: [], pinned: {}, ...o,
    });
    assert.deepEqual(readinessVerdict("none", "none", 4, null), { kind: "ready" });
    assert.equal(readinessVerdict("none", "np-1", 4, null).kind, "rotate");
    assert.deepEqual(readinessVerdict("np-1", "np-1", 4, e()), { kind: "ready" });
    assert.equal(readinessVerdict("np-1", "np-1", 4, null).kind, "quarantine");
    assert.equal(readinessVerdict("np-1", "np-1", 4, e({ result: "fail" })).kind, "quarantine");
    assert.equal(readinessVerdict("np-1", "np-1", 5, e()).kind, "quarantine", "evidence of another generation proves nothing");
    assert.equal(readinessVerdict("np-1", "np-1", 4, e({ policyFingerprint: "np-2" })).kind, "quarantine");
    assert.equal(readinessVerdict("np-1", "np-2", 4, e()).kind, "rotate", "a policy changed meanwhile rotates the machine out");
  });
});
