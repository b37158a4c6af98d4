/**
 * The first commands a user types work inside a gvisor machine: `ls -l /`
 * (statx), `stat`, `find` and an interpreter of the root (perl, python3),
 * through `berth up` and `berth run` on a real agent; `berth host ls` shows
 * the runtime with the runsc release and platform the agent detected. With
 * the bookworm runsc 0.0~20221219 (where installed) machines still run, the
 * agent prints one warning naming what breaks, and `ls -l` shows that it does.
 */
import { test, describe } from "node:test";
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { berth, berthSync, startProcess, stopProcess } from "../helpers/cluster.js";
import { tempDir } from "../helpers/env.js";
import { gvisorAvailability } from "../../src/agent/runtime/index.js";
import { findRunsc, probeRunsc } from "../../src/agent/runtime/gvisor-runsc.js";

const gv = gvisorAvailability();
const skip = gv.ok ? false : `gvisor runtime unavailable: ${(gv as { why: string }).why}`;

describe("tools inside a gvisor machine", { timeout: 240_000, skip }, () => {
  test("ls -l /, stat, find and perl/python3 run; host ls shows runtime, runsc release and platform", async () => {
    const d = tempDir("berth-gvtools-");
    const up = await startProcess(["up", "--state-dir", join(d.path, "s"), "--listen", "127.0.0.1:0", "--runtime", "gvisor", "--min-ready", "1"], {}, /berth is up/);
    try {
      const config = join(d.path, "s", "client.json");
      const script = [
        "set -e",
        "ls -l / > /workspace/ls.txt",
        "grep -q ' usr$' /workspace/ls.txt && echo ls-ok",
        "test \"$(stat -c '%F %s' /etc/passwd)\" = \"regular file $(wc -c < /etc/passwd)\" && echo stat-ok",
        "test \"$(find /usr/lib -maxdepth 2 -type f | wc -l)\" -gt 10 && echo find-ok",
        "perl -e 'print 6*7, qq(\\n)'",
        "if [ -x /usr/bin/python3 ]; then python3 -c 'print(2**10)'; else echo 1024; fi",
      ].join("\n");
      const r = berthSync(["run", "--config", config, "--pool", "default", "-q", "--", "sh", "-c", script]);
      assert.equal(r.status, 0, r.stderr);
      assert.deepEqual(r.stdout.trim().split("\n"), ["ls-ok", "stat-ok", "find-ok", "42", "1024"]);
      // The failure an old runsc gives (statx refused) is absent.
      assert.doesNotMatch(r.stderr, /Invalid argument/);

      const hosts = berthSync(["host", "ls", "--config", config, "--json"]);
      assert.equal(hosts.status, 0, hosts.stderr);
      const [h] = JSON.parse(hosts.stdout) as Array<{ runtime: string; runsc: { version: string; platform: string } | null; runtimeWarning: string | null }>;
      const expected = probeRunsc(findRunsc()!, "auto");
      assert.equal(h!.runtime, "gvisor");
      assert.deepEqual(h!.runsc, { version: expected.version, platform: expected.platform });
      assert.equal(h!.runtimeWarning, expected.warning);
      const table = berthSync(["host", "ls", "--config", config]);
      assert.match(table.stdout, new RegExp(`gvisor ${expected.platform} \\(runsc ${expected.version.replace(/[.~]/g, "\\$&")}\\)`));
    } finally {
      await stopProcess(up, "SIGINT");
      d.cleanup();
    }
  });

  test("`berth up -- ls -l /` exits 0", async () => {
    const d = tempDir("berth-gvtools-");
    try {
      const r = await berth(["up", "--state-dir", join(d.path, "s"), "--listen", "127.0.0.1:0", "--runtime", "gvisor", "--min-ready", "1", "-q", "--", "ls", "-l", "/"], { cwd: d.path });
      assert.equal(r.status, 0, r.stderr);
      assert.match(r.stdout, /^d\S+ +\d+ root +root .* usr$/m);
    } finally {
      d.cleanup();
    }
  });

  const OLD = "/opt/runsc-20221219/runsc";
  test("an old runsc (0.0~20221219) still runs machines, with one warning naming statx / `ls -l`", { skip: existsSync(OLD) ? false : `${OLD} is not installed` }, async () => {
    const d = tempDir("berth-gvtools-");
    try {
      const r = await berth(
        ["up", "--state-dir", join(d.path, "s"), "--listen", "127.0.0.1:0", "--runtime", "gvisor", "--runsc", OLD, "--min-ready", "1", "--", "sh", "-c", "echo still-works; ls -l / >/dev/null; echo ls-exit=$?"],
        { cwd: d.path },
      );
      assert.equal(r.status, 0, r.stderr);
      assert.equal(r.stdout, "still-works\nls-exit=2\n");
      const warnings = r.stderr.split("\n").filter((l) => l.startsWith("berth agent: warning:"));
      assert.equal(warnings.length, 1, r.stderr);
      assert.match(warnings[0]!, /runsc 0\.0~20221219\.0 is older than 0\.0~20240729: .*`ls -l`, `stat` and other statx callers fail/);
      assert.match(r.stderr, /runtime=gvisor runsc=0\.0~20221219\.0 platform=(ptrace|kvm)/);
      // What the warning names: ls -l fails inside.
      assert.match(r.stderr, /ls: cannot access '\/': Invalid argument/);
    } finally {
      d.cleanup();
    }
  });
});
