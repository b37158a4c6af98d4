/**
 * Which runsc and gVisor platform the agent uses: the version and platform
 * lists as runsc 0.0~20240729 (Debian trixie) and 0.0~20221219 (bookworm)
 * print them, the choice of the fastest platform, the refusal of a platform
 * this runsc or host lacks, and the one warning for an old runsc. Where those
 * binaries are installed, the real ones are probed too.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { chmodSync, existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { BerthError } from "../../src/core/errors.js";
import { choosePlatform, parsePlatforms, parseRunscVersion, runscWarning } from "../../src/agent/runtime/gvisor-platform.js";
import { findRunsc, kvmTrial, kvmUsable, probeRunsc } from "../../src/agent/runtime/gvisor-runsc.js";

const NEW_VERSION = "runsc version 0.0~20240729.0\nspec: 1.2.0\n";
const OLD_VERSION = "runsc version 0.0~20221219.0\nspec: 1.0.2-dev\n";
const UPSTREAM_VERSION = "runsc version release-20250113.0\nspec: 1.1.0-rc.1\n";
const NEW_FLAGS = '  -platform string\n    \tspecifies which platform to use: systrap (default), ptrace, kvm. (default "systrap")\n  -platform_device_path string\n';
const OLD_FLAGS = '  -platform string\n    \tspecifies which platform to use: ptrace (default), kvm. (default "ptrace")\n';

test("versions: Debian's and gVisor's own release names give the release date; a development build gives none", () => {
  assert.deepEqual(parseRunscVersion(NEW_VERSION), { version: "0.0~20240729.0", date: 20240729 });
  assert.deepEqual(parseRunscVersion(OLD_VERSION), { version: "0.0~20221219.0", date: 20221219 });
  assert.deepEqual(parseRunscVersion(UPSTREAM_VERSION), { version: "release-20250113.0", date: 20250113 });
  assert.deepEqual(parseRunscVersion("runsc version VERSION_MISSING\n"), { version: "VERSION_MISSING", date: null });
  assert.throws(() => parseRunscVersion("Usage: something else"), (e: unknown) => e instanceof BerthError && e.code === "provider_unavailable");
});

test("platforms: the list in `runsc flags`, fastest first; none named means ptrace only", () => {
  assert.deepEqual(parsePlatforms(NEW_FLAGS), ["kvm", "systrap", "ptrace"]);
  assert.deepEqual(parsePlatforms(OLD_FLAGS), ["kvm", "ptrace"]);
  assert.deepEqual(parsePlatforms("no such help"), ["ptrace"]);
});

test("auto picks kvm where /dev/kvm opens, else systrap, else ptrace, and says why", () => {
  assert.equal(choosePlatform(["kvm", "systrap", "ptrace"], true, "auto").platform, "kvm");
  const noKvm = choosePlatform(["kvm", "systrap", "ptrace"], false, "auto");
  assert.equal(noKvm.platform, "systrap");
  assert.match(noKvm.why, /kvm: no \/dev\/kvm/);
  const old = choosePlatform(["kvm", "ptrace"], false, "auto");
  assert.equal(old.platform, "ptrace");
  assert.match(old.why, /systrap: not in this runsc/);
});

test("a named platform is used as named, or refused when this runsc or host lacks it (never replaced)", () => {
  assert.deepEqual(choosePlatform(["kvm", "systrap", "ptrace"], false, "ptrace"), { platform: "ptrace", why: "chosen with --runsc-platform" });
  assert.throws(() => choosePlatform(["kvm", "ptrace"], false, "systrap"), /no systrap platform \(it offers kvm, ptrace\)/);
  assert.throws(() => choosePlatform(["kvm", "systrap", "ptrace"], false, "kvm"), /needs \/dev\/kvm/);
});

test("kvm counts only after its trial sandbox ran and ended: a failed trial makes auto take systrap and a named kvm a refusal, both saying why", () => {
  let asked = 0;
  const hangs = (): string => {
    asked += 1;
    return "a trial sandbox on kvm (runsc do /bin/true) did not end within 10 s";
  };
  const auto = choosePlatform(["kvm", "systrap", "ptrace"], true, "auto", hangs);
  assert.equal(auto.platform, "systrap");
  assert.match(auto.why, /kvm: a trial sandbox on kvm \(runsc do \/bin\/true\) did not end within 10 s/);
  assert.equal(asked, 1, "the trial runs once per choice");
  assert.throws(
    () => choosePlatform(["kvm", "systrap", "ptrace"], true, "kvm", hangs),
    (e: unknown) => e instanceof BerthError && e.code === "provider_unavailable" && /kvm platform does not work on this host: a trial sandbox/.test(e.message),
  );
  assert.equal(choosePlatform(["kvm", "systrap", "ptrace"], true, "auto", () => null).platform, "kvm");
  asked = 0;
  choosePlatform(["kvm", "systrap", "ptrace"], false, "auto", hangs);
  choosePlatform(["systrap", "ptrace"], true, "auto", hangs);
  choosePlatform(["kvm", "systrap", "ptrace"], true, "systrap", hangs);
  assert.equal(asked, 0, "no trial without /dev/kvm, without kvm in this runsc, or when another platform is named");
});

test("kvmTrial: a sandbox that runs and never ends is killed at the bound, nothing it started is left, and the outcome is kept for the next start", () => {
  const dir = mkdtempSync(join(tmpdir(), "berth-kvm-trial-test-"));
  try {
    // A stand-in runsc binary that does what runsc's kvm sandbox did on a nested host: it starts a
    // "sandbox" child that names the private root in its argv and never exits.
    const bin = join(dir, "runsc");
    const runs = join(dir, "runs");
    writeFileSync(bin, `#!/bin/sh\necho run >> ${runs}\n"${process.execPath}" -e 'setInterval(() => {}, 1e9)' runsc-sandbox "--root=$2" &\nwait\n`);
    chmodSync(bin, 0o755);
    const cache = join(dir, "cache");
    const why = kvmTrial(bin, "0.0~20240729.0", cache, 1_000);
    assert.match(why ?? "", /did not end within 1 s/);
    const leftover = readdirSync("/proc").filter((p) => /^\d+$/.test(p)).filter((p) => {
      try {
        return readFileSync(`/proc/${p}/cmdline`, "utf8").includes("berth-kvm-trial-") && readFileSync(`/proc/${p}/cmdline`, "utf8").includes("runsc-sandbox");
      } catch {
        return false;
      }
    });
    assert.deepEqual(leftover, [], "the trial's sandbox was killed");
    assert.equal(readFileSync(runs, "utf8"), "run\n");
    const kept = readdirSync(cache);
    assert.equal(kept.length, 1);
    assert.equal(statSync(join(cache, kept[0]!)).mode & 0o777, 0o600);
    assert.equal(kvmTrial(bin, "0.0~20240729.0", cache, 1_000), why, "the kept outcome is answered");
    assert.equal(readFileSync(runs, "utf8"), "run\n", "without running the trial again");
    writeFileSync(bin, "#!/bin/sh\nexit 0\n");
    assert.equal(kvmTrial(bin, "0.0~20240729.0", cache, 1_000), null, "another binary at the same path is tried again");
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("one warning for a runsc older than 0.0~20240729, naming statx / `ls -l` and the missing systrap; none for newer ones", () => {
  const w = runscWarning(parseRunscVersion(OLD_VERSION), parsePlatforms(OLD_FLAGS));
  assert.ok(w !== null);
  assert.equal(w.includes("\n"), false, "one line");
  assert.match(w, /0\.0~20221219\.0 is older than 0\.0~20240729/);
  assert.match(w, /`ls -l`, `stat` and other statx callers fail/);
  assert.match(w, /no systrap platform/);
  assert.equal(runscWarning(parseRunscVersion(NEW_VERSION), parsePlatforms(NEW_FLAGS)), null);
  assert.equal(runscWarning(parseRunscVersion(UPSTREAM_VERSION), ["kvm", "systrap", "ptrace"]), null);
  assert.equal(runscWarning({ version: "dev", date: null }, ["ptrace"]), null);
});

const installed = findRunsc();
test("the installed runsc, probed: its version, platforms, and the platform auto picks on this host", { skip: installed ? false : "runsc is not installed" }, (t) => {
  const info = probeRunsc(installed!, "auto");
  t.diagnostic(`${info.path}: ${info.version}, platforms ${info.platforms.join(",")}, uses ${info.platform} (${info.platformWhy})`);
  assert.ok(info.platforms.includes("ptrace"));
  const kvmWorks = kvmUsable() && info.platforms.includes("kvm") && kvmTrial(installed!, info.version) === null;
  assert.equal(info.platform, kvmWorks ? "kvm" : info.platforms.includes("systrap") ? "systrap" : "ptrace");
  if (info.date !== null && info.date >= 20240729) {
    assert.ok(info.platforms.includes("systrap"), "a current runsc offers systrap");
    assert.equal(info.warning, null);
  }
});

const OLD = "/opt/runsc-20221219/runsc";
test("the bookworm runsc 0.0~20221219, probed: ptrace, with the warning", { skip: existsSync(OLD) ? false : `${OLD} is not installed (kept for old-vs-new measurements)` }, () => {
  const info = probeRunsc(OLD, "auto");
  assert.equal(info.version, "0.0~20221219.0");
  assert.equal(info.platform, kvmUsable() && kvmTrial(OLD, info.version) === null ? "kvm" : "ptrace");
  assert.match(info.warning ?? "", /statx/);
  assert.throws(() => probeRunsc(OLD, "systrap"), /no systrap platform/);
});
