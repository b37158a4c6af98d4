/**
 * Which runsc this host has and which gVisor platform its sandboxes use.
 * Pure: the agent reads `runsc --version`, `runsc flags` and whether
 * /dev/kvm can be opened (gvisor-runsc.ts `probeRunsc`) and hands the text
 * here, so every decision is tested without runsc (test/agent/gvisor-platform.test.ts).
 *
 * Platforms, fastest first: `kvm` (needs /dev/kvm: bare metal or nested
 * virtualisation), `systrap` (runsc releases since 2023; the default of
 * current ones), `ptrace` (every release; the slowest: each system call of
 * the sandboxed program is a ptrace stop). `auto` takes the fastest this
 * runsc offers and this host can run; a named platform this runsc or host
 * lacks is refused when the agent starts, never silently replaced.
 *
 * An openable /dev/kvm is not proof that kvm works: under some nested
 * virtualisation a kvm sandbox runs its program and then never exits. So kvm
 * counts only after a trial sandbox on it has run and ended (`kvmTrial`,
 * gvisor-runsc.ts); a failed trial makes auto take the next platform and a
 * named kvm a refusal, both saying why.
 */
import { BerthError } from "../../core/errors.js";

export const GVISOR_PLATFORMS = ["kvm", "systrap", "ptrace"] as const;
export type GvisorPlatform = (typeof GVISOR_PLATFORMS)[number];
export type PlatformChoice = GvisorPlatform | "auto";

/**
 * The oldest runsc release berth is tested with (Debian trixie's
 * 0.0~20240729). Older releases still run sandboxes; what breaks is named
 * by `runscWarning`.
 */
export const TESTED_RUNSC_DATE = 20240729;

export interface RunscVersion {
  /** As runsc prints it, e.g. "0.0~20240729.0" (Debian) or "release-20240729.0" (gVisor's own builds). */
  version: string;
  /** The release date as yyyymmdd, or null when the version names none (a development build). */
  date: number | null;
}

/** What the agent knows of its runsc and the platform it picked. */
export interface RunscInfo extends RunscVersion {
  /** The binary the agent runs. */
  path: string;
  /** Platforms this runsc offers (from `runsc flags`), in the order of GVISOR_PLATFORMS. */
  platforms: GvisorPlatform[];
  /** The platform every new sandbox of this agent uses. */
  platform: GvisorPlatform;
  /** Why this platform (auto: what was available; named: the operator's choice). */
  platformWhy: string;
  /** One line naming what does not work with this runsc, or null. */
  warning: string | null;
}

/** Parses `runsc --version` ("runsc version 0.0~20240729.0\nspec: 1.2.0"). */
export function parseRunscVersion(out: string): RunscVersion {
  const m = /runsc version (\S+)/.exec(out);
  if (!m) throw new BerthError("provider_unavailable", `provider_unavailable: runsc --version printed no version (${JSON.stringify(out.trim().slice(0, 120))}); is this runsc?`);
  const version = m[1]!;
  const d = /(?:^|[^0-9])(20\d{6})(?:[^0-9]|$)/.exec(version);
  return { version, date: d ? Number(d[1]) : null };
}

/**
 * Platforms named by `runsc flags` in the help of -platform, e.g.
 * "specifies which platform to use: systrap (default), ptrace, kvm.".
 * A runsc whose help names none is taken to offer ptrace only.
 */
export function parsePlatforms(flagsOut: string): GvisorPlatform[] {
  const m = /platform to use:\s*([^\n.]+)/.exec(flagsOut);
  const named = new Set((m?.[1] ?? "").split(",").map((s) => s.replace(/\(default\)/, "").trim()));
  const found = GVISOR_PLATFORMS.filter((p) => named.has(p));
  return found.length > 0 ? found : ["ptrace"];
}

/**
 * The platform for new sandboxes: the choice if this runsc and host can run it, else a refusal; auto: the fastest available.
 * `kvmTrial` is asked only when kvm is offered and /dev/kvm opens: null when a kvm sandbox ran and ended, else why not.
 */
export function choosePlatform(offered: readonly GvisorPlatform[], kvmDevice: boolean, choice: PlatformChoice, kvmTrial: () => string | null = () => null): { platform: GvisorPlatform; why: string } {
  let kvmFailure: string | null | undefined;
  const kvmWhyNot = (): string | null => {
    if (!kvmDevice) return "no /dev/kvm";
    if (kvmFailure === undefined) kvmFailure = kvmTrial();
    return kvmFailure;
  };
  const usable = (p: GvisorPlatform): boolean => offered.includes(p) && (p !== "kvm" || kvmWhyNot() === null);
  if (choice !== "auto") {
    if (!offered.includes(choice)) {
      throw new BerthError("provider_unavailable", `provider_unavailable: this runsc has no ${choice} platform (it offers ${offered.join(", ")}); install runsc ≥ 0.0~${TESTED_RUNSC_DATE} or choose another --runsc-platform`);
    }
    if (!usable(choice)) {
      const why = kvmWhyNot() === "no /dev/kvm" ? "the kvm platform needs /dev/kvm, which this host does not have (or the agent cannot open)" : `the kvm platform does not work on this host: ${kvmWhyNot()}`;
      throw new BerthError("provider_unavailable", `provider_unavailable: ${why}; use --runsc-platform auto`);
    }
    return { platform: choice, why: "chosen with --runsc-platform" };
  }
  const best = GVISOR_PLATFORMS.find(usable) ?? "ptrace";
  const skipped = GVISOR_PLATFORMS.slice(0, GVISOR_PLATFORMS.indexOf(best)).map((p) => (!offered.includes(p) ? `${p}: not in this runsc` : `${p}: ${kvmWhyNot()}`));
  return { platform: best, why: skipped.length > 0 ? `fastest available (${skipped.join("; ")})` : "fastest available" };
}

/** One line naming what an older runsc breaks, or null for a tested release. */
export function runscWarning(v: RunscVersion, platforms: readonly GvisorPlatform[]): string | null {
  if (v.date === null || v.date >= TESTED_RUNSC_DATE) return null;
  const slow = platforms.includes("systrap") ? "" : "; it has no systrap platform, so sandboxes run on the slower ptrace";
  return (
    `runsc ${v.version} is older than 0.0~${TESTED_RUNSC_DATE}: inside its machines \`ls -l\`, \`stat\` and other statx callers fail with "Invalid argument"${slow}; ` +
    "install runsc ≥ 0.0~20240729 (docs/runtimes.md)"
  );
}
