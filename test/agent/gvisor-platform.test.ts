/**
 * Which runsc and gVisor platform the agent uses: the version and platform
 * lists as runsc 0.0~20240729 (Debian trixie) and 0.0~20221219 (bookworm)
 * print them, the choice of the fastest platform, the refusal of a platform
 * this runsc or host lacks, and the one warning for an old runsc. Where those
 * binaries are installed, the real ones are probed too.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { BerthError } from "../../src/core/errors.js";
import { choosePlatform, parsePlatforms, parseRunscVersion, runscWarning } from "../../src/agent/runtime/gvisor-platform.js";
import { findRunsc, kvmUsable, probeRunsc } from "../../src/agent/runtime/gvisor-runsc.js";

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
  assert.equal(info.platform, kvmUsable() && info.platforms.includes("kvm") ? "kvm" : info.platforms.includes("systrap") ? "systrap" : "ptrace");
  if (info.date !== null && info.date >= 20240729) {
    assert.ok(info.platforms.includes("systrap"), "a current runsc offers systrap");
    assert.equal(info.warning, null);
  }
});

const OLD = "/opt/runsc-20221219/runsc";
test("the bookworm runsc 0.0~20221219, probed: ptrace, with the warning", { skip: existsSync(OLD) ? false : `${OLD} is not installed (kept for old-vs-new measurements)` }, () => {
  const info = probeRunsc(OLD, "auto");
  assert.equal(info.version, "0.0~20221219.0");
  assert.equal(info.platform, kvmUsable() ? "kvm" : "ptrace");
  assert.match(info.warning ?? "", /statx/);
  assert.throws(() => probeRunsc(OLD, "systrap"), /no systrap platform/);
});
