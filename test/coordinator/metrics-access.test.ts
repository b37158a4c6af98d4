/**
 * `/metrics` names no token: owners are shown by their tokens' label, and
 * `berth serve --metrics-token-file` makes the scrape need that token. A real
 * `berth serve` process; an owner admitted and charged through the API.
 */
import { after, describe, it } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { request } from "undici";
import { Api } from "../../src/cli/api.js";
import { newToken } from "../../src/core/tokens.js";
import { berthSync, startProcess, stopProcess, type Proc } from "../helpers/cluster.js";
import { tempDir } from "../helpers/env.js";

async function scrape(url: string, bearer: string | null): Promise<{ status: number; text: string }> {
  const r = await request(`${url}/metrics`, { headers: bearer ? { authorization: `Bearer ${bearer}` } : {} });
  return { status: r.statusCode, text: await r.body.text() };
}

describe("/metrics: no token ids, and a scrape token when asked for", () => {
  const dir = tempDir("berth-metrics-");
  let coord: (Proc & { url: string }) | null = null;
  after(async () => {
    await stopProcess(coord);
    dir.cleanup();
  });

  it("owners appear by their tokens' label; without --metrics-token-file the scrape is open, with it only the scrape token reads it", { timeout: 120_000 }, async () => {
    const state = join(dir.path, "coord");
    const token = (role: string, label: string | null) => {
      const out = join(dir.path, `${role}-${label ?? "none"}.token`);
      const r = berthSync(["token", "create", "--state-dir", state, "--org", "mx", "--role", role, "--out", out, "--json", ...(label ? ["--label", label] : [])]);
      assert.equal(r.status, 0, r.stderr);
      return { token: readFileSync(out, "utf8").trim(), id: (JSON.parse(r.stdout) as { id: string }).id };
    };
    const scrapeToken = newToken("api", (n) => new Uint8Array(n).fill(7));
    writeFileSync(join(dir.path, "scrape.token"), scrapeToken + "\n", { mode: 0o600 });

    const start = async (extra: string[]) => {
      const p = await startProcess(["serve", "--state-dir", state, "--listen", "127.0.0.1:0", ...extra], {}, /listening on (http:\/\/\S+)/);
      coord = { ...p, url: p.match[1]! };
      return coord.url;
    };
    let url = await start([]);
    const admin = token("admin", null);
    const ci = token("member", "ci-runner");
    const agent = token("agent", null);
    const api = new Api(url, admin.token);
    try {
      await api.call("POST", `/v1/owners/${ci.id}/admit`, { vcpu: 4, memoryMib: 8192, count: 2 });
      const enrolled = await request(`${url}/v1/hosts/enroll`, {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${agent.token}` },
        body: JSON.stringify({ name: "h", url: "http://127.0.0.1:1", runtime: "process", capacity: { vcpu: 8, memoryMb: 16384, slots: 4 }, ssh: { host: "127.0.0.1", port: 2, hostKey: "ssh-ed25519 AAAA", fingerprint: "SHA256:x" } }),
      });
      assert.equal(enrolled.statusCode, 200, await enrolled.body.text());
      const member = new Api(url, ci.token);
      await member.call("POST", "/v1/allocations", { id: "a1", size: "small" });
      await member.close();
    } finally {
      await api.close();
    }
    const open = await scrape(url, null);
    assert.equal(open.status, 200);
    assert.match(open.text, /berth_allocation_budget_used_ratio\{org="mx",owner="ci-runner",dimension="vcpu"\} 0.5/);
    for (const t of [admin, ci, agent]) assert.equal(open.text.includes(t.id), false, `no token id (${t.id}) in /metrics`);
    assert.doesNotMatch(open.text, /tok_[A-Za-z0-9]/, "no token id of any kind");

    await stopProcess(coord);
    url = await start(["--metrics-token-file", join(dir.path, "scrape.token")]);
    const none = await scrape(url, null);
    assert.equal(none.status, 401);
    assert.match(none.text, /"code":"unauthorized".*metrics-token-file/);
    assert.equal((await scrape(url, admin.token)).status, 401, "an API token is not the scrape token");
    const ok = await scrape(url, scrapeToken);
    assert.equal(ok.status, 200);
    assert.match(ok.text, /owner="ci-runner"/);
    assert.equal((await request(`${url}/v1/health`)).statusCode, 200, "health stays open");

    await stopProcess(coord);
    writeFileSync(join(dir.path, "empty.token"), "\n");
    const bad = berthSync(["serve", "--state-dir", state, "--listen", "127.0.0.1:0", "--metrics-token-file", join(dir.path, "empty.token")]);
    assert.notEqual(bad.status, 0);
    assert.match(bad.stderr, /--metrics-token-file .*exactly one token/);
  });
});
