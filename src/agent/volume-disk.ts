/**
 * The disk limit of a workspace volume: a sparse ext4 image file of the
 * allocation's disk size (`<volume>/disk.img`), formatted with `mkfs.ext4`
 * and mounted through a loop device on the volume's `data/` directory. Both
 * runtimes see only that directory (gvisor binds it as /workspace; the
 * process runtime runs in it), so a write past the size fails inside with
 * ENOSPC ("No space left on device") and the host's filesystem is untouched.
 *
 * Chosen over project quotas because it needs no particular filesystem or
 * mount option under the agent's state directory (quotas need XFS, or ext4
 * mounted with `prjquota`): only root, a loop device and mkfs.ext4. The image
 * is sparse: it takes on the host only what was written (plus ext4's own
 * metadata), and the coordinator's disk accounting is what keeps the sum of
 * sizes within the host's offer.
 *
 * `--disk-enforce` decides what happens on a host that cannot:
 *   required  the agent refuses to start (`disk_not_enforceable`, naming why),
 *             and a launch whose image cannot be made is refused;
 *   auto      (default) enforced where possible, else accounted only: the
 *             volume is a plain directory and its record says `enforced:
 *             false` with the reason;
 *   off       never enforced (accounted only).
 */
import { spawnSync } from "node:child_process";
import { closeSync, existsSync, openSync, ftruncateSync, statSync } from "node:fs";
import { dirname } from "node:path";
import { BerthError } from "../core/errors.js";

export type DiskEnforceMode = "required" | "auto" | "off";

/** What this host can do, probed once at start-up. */
export type DiskCapability = { can: true } | { can: false; why: string };

/** A volume's disk decision for one launch. */
export type DiskPlan = { enforce: true; sizeMib: number } | { enforce: false; sizeMib: number | null; why: string };

function run(cmd: string, args: string[]): { ok: boolean; out: string } {
  const r = spawnSync(cmd, args, { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], timeout: 120_000 });
  return { ok: r.status === 0, out: `${r.stdout ?? ""}${r.stderr ?? ""}${r.error ? r.error.message : ""}`.trim() };
}

/** Whether images can be made and mounted here: root, a loop device control, mkfs.ext4, mount and umount. */
export function probeDisk(): DiskCapability {
  if (process.getuid?.() !== 0) return { can: false, why: "the agent does not run as root (a loop mount needs root)" };
  if (!existsSync("/dev/loop-control")) return { can: false, why: "no loop devices (/dev/loop-control is missing)" };
  for (const tool of ["mkfs.ext4", "mount", "umount"]) {
    if (!run("sh", ["-c", `command -v ${tool}`]).ok) return { can: false, why: `${tool} is not installed` };
  }
  return { can: true };
}

/** Refuses to start under `required` on a host that cannot enforce. */
export function checkDiskMode(mode: DiskEnforceMode, cap: DiskCapability): void {
  if (mode === "required" && !cap.can) {
    throw new BerthError("disk_not_enforceable", `disk_not_enforceable: --disk-enforce required, but this host cannot limit a volume's disk: ${cap.why}; fix that, or start the agent with --disk-enforce auto (disk accounted only)`);
  }
}

/** The plan for a new volume of `sizeMib` (null: the launch named no size, from a coordinator older than the disk dimension). */
export function planDisk(mode: DiskEnforceMode, cap: DiskCapability, sizeMib: number | null): DiskPlan {
  if (sizeMib === null) {
    if (mode === "required") throw new BerthError("disk_not_enforceable", "disk_not_enforceable: --disk-enforce required, but the launch names no disk size (a coordinator older than the disk dimension); upgrade the coordinator");
    return { enforce: false, sizeMib: null, why: "the launch named no disk size" };
  }
  if (mode === "off") return { enforce: false, sizeMib, why: "--disk-enforce off" };
  if (!cap.can) return { enforce: false, sizeMib, why: cap.why };
  return { enforce: true, sizeMib };
}

/** Whether `dir` is a mount point (its device differs from its parent's). */
export function isMounted(dir: string): boolean {
  try {
    return statSync(dir).dev !== statSync(dirname(dir)).dev;
  } catch {
    return false;
  }
}

/** Makes the sparse image and its ext4 filesystem (every block counted for the workspace: no reserve for root). */
export function makeImage(image: string, sizeMib: number): void {
  const fd = openSync(image, "w", 0o600);
  try {
    ftruncateSync(fd, sizeMib * 2 ** 20);
  } finally {
    closeSync(fd);
  }
  const r = run("mkfs.ext4", ["-q", "-F", "-m", "0", "-E", "nodiscard,lazy_itable_init=1,lazy_journal_init=1", image]);
  if (!r.ok) throw new BerthError("disk_not_enforceable", `disk_not_enforceable: mkfs.ext4 failed on ${image}: ${r.out.slice(0, 300)}`);
}

/** Mounts the image on `dir` through a loop device (released by the kernel when it is unmounted). */
export function mountImage(image: string, dir: string): void {
  const r = run("mount", ["-o", "loop,nodev,nosuid", image, dir]);
  if (!r.ok) throw new BerthError("disk_not_enforceable", `disk_not_enforceable: mounting ${image} on ${dir} failed: ${r.out.slice(0, 300)}`);
}

/** Unmounts `dir` if it is mounted; refuses to answer otherwise (nothing is removed through a mount still in place). */
export function unmountImage(dir: string): void {
  if (!isMounted(dir)) return;
  const r = run("umount", [dir]);
  if (!r.ok || isMounted(dir)) throw new BerthError("operation_failed", `operation_failed: ${dir} could not be unmounted: ${r.out.slice(0, 300)}`);
}
