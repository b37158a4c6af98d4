/**
 * What the gvisor runtime hands to runsc: the OCI bundle spec of a machine's
 * sandbox, the process spec of one `runsc exec`, and the small shell scripts
 * that run inside the sandbox. Pure (no I/O, no runsc), so the spec and the
 * scripts are tested on any host (test/agent/gvisor-oci.test.ts).
 *
 * Sandbox spec: the host's `/` as root (made read-only-underneath by runsc's
 * `--overlay2=root:memory`), /workspace bound read-write, /tmp a tmpfs,
 * /run/berth (the boot id) bound read-only (for a machine of an image, berth's
 * own SFTP server bound read-only beneath it at /run/berth/sftp), the agent's state directory masked
 * by an empty read-only tmpfs, and private pid/ipc/uts/mount/network
 * namespaces. Its init only sleeps and reaps, so no borrower command ever
 * joins init's process group (pgid 1).
 */
import { IDENTITY_PREFIX } from "./streams.js";
import { SFTP_KIT_IN } from "../ssh/channels.js";

const CAPS = [
  "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW", "CAP_SETGID",
  "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
];
export const CAPABILITIES = { bounding: CAPS, effective: CAPS, permitted: CAPS, inheritable: CAPS };

/** PATH inside the sandbox. */
export const PATH_IN = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/** The sandbox's init: sleeps and reaps; exits on TERM. */
export const INIT = ["/bin/sh", "-c", 'trap "exit 0" TERM; while :; do sleep 3600 & wait; done'];

/**
 * The in-sandbox half of the exec identity handshake (host half:
 * gvisor-identity.ts): print one identity line — this shell's own
 * /proc/self/stat — on stderr, then become the command (same pid).
 */
export const EXEC_WRAPPER = `read -r s < /proc/$$/stat; printf '${IDENTITY_PREFIX.replace("\x1e", "\\036")}%s\\n' "$s" >&2; exec "$@"`;

/**
 * Signal the group only if the leader is still exactly the recorded process.
 * Arguments: pid start-time pgid signal-name. Exit 3: no such process; 4: a
 * different process (start time or group); 5: kill failed; 0: signalled.
 */
export const SIGNAL_SCRIPT = `p=$1; st=$2; g=$3; sig=$4
read -r s < /proc/$p/stat 2>/dev/null || exit 3
r=\${s##*) }
set -- $r
[ "$3" = "$g" ] && [ "\${20}" = "$st" ] || exit 4
kill -$sig -$g || exit 5`;

/**
 * Prints the number of live processes outside init's group (pgid 1), outside
 * this counting shell's own group, and other than a terminal session's relay
 * (berth-pty-relay: the runtime's plumbing, like the exec client on the host).
 */
export const COUNT_SCRIPT = `n=0
for f in /proc/[0-9]*/stat; do
  read -r s < "$f" 2>/dev/null || continue
  case $s in *" (berth-pty-relay) "*) continue;; esac
  r=\${s##*) }
  set -- $r
  [ "$1" = Z ] && continue
  [ "$3" = 1 ] && continue
  [ "$3" = "$$" ] && continue
  n=$((n+1))
done
echo $n`;

export interface SandboxSpecInput {
  machineId: string;
  /** The boot id of this start (env BERTH_INCARNATION). */
  incarnation: string;
  /** Host directory bound at /workspace. */
  workspace: string;
  /** Host directory bound read-only at /run/berth (holds the `incarnation` file). */
  runDir: string;
  /** The agent's state directory, masked inside the sandbox when the root holds it. */
  stateDir: string;
  /** Host path of the root filesystem (default "/": the host's own root). */
  root?: string;
  /** Limits to enforce (OCI linux.resources under `cgroupsPath`); absent: cgroups are not used. */
  resources?: { vcpu: number; memoryMib: number; cgroupsPath: string };
  /**
   * Network policy `egress`: the sandbox shares the network namespace runsc
   * starts in (the machine's own, `--network=host`), so the spec asks for no
   * new one; these files are bound read-only over /etc/hosts and /etc/resolv.conf.
   */
  network?: { hosts: string; resolvConf: string };
  /**
   * Host directory of berth's own SFTP server (sftp-kit.ts), bound read-only
   * at SFTP_KIT_IN for a machine whose image may have none; its mount point
   * (`sftp` under `runDir`) must exist.
   */
  sftpKit?: string;
}

/** OCI resources of a size: CFS quota of `vcpu` CPUs, a hard memory limit (runsc sizes the sandbox from both). */
export function ociResources(r: { vcpu: number; memoryMib: number }): Record<string, unknown> {
  return { cpu: { quota: r.vcpu * 100_000, period: 100_000 }, memory: { limit: r.memoryMib * 1024 * 1024 } };
}

/** The OCI runtime spec (config.json) of one sandbox incarnation. */
export function sandboxSpec(i: SandboxSpecInput): Record<string, unknown> {
  const mounts: unknown[] = [
    { destination: "/proc", type: "proc", source: "proc" },
    { destination: "/dev", type: "tmpfs", source: "tmpfs", options: ["nosuid", "mode=755"] },
    { destination: "/sys", type: "sysfs", source: "sysfs", options: ["nosuid", "noexec", "nodev", "ro"] },
    { destination: "/tmp", type: "tmpfs", source: "tmpfs", options: ["nosuid", "nodev", "mode=1777"] },
    { destination: "/workspace", type: "bind", source: i.workspace, options: ["rbind", "rw"] },
    { destination: "/run/berth", type: "bind", source: i.runDir, options: ["rbind", "ro"] },
  ];
  if (i.sftpKit) mounts.push({ destination: SFTP_KIT_IN, type: "bind", source: i.sftpKit, options: ["rbind", "ro"] });
  const root = i.root ?? "/";
  // Mask the agent's state (records, runsc state, other machines' workspaces) where the root holds it.
  const rel = root === "/" ? i.stateDir : i.stateDir.startsWith(root + "/") ? i.stateDir.slice(root.length) : null;
  if (rel !== null) mounts.push({ destination: rel, type: "tmpfs", source: "tmpfs", options: ["ro", "size=4k"] });
  if (i.network) {
    mounts.push({ destination: "/etc/hosts", type: "bind", source: i.network.hosts, options: ["rbind", "ro"] });
    mounts.push({ destination: "/etc/resolv.conf", type: "bind", source: i.network.resolvConf, options: ["rbind", "ro"] });
  }
  const namespaces = [{ type: "pid" }, { type: "ipc" }, { type: "uts" }, { type: "mount" }, ...(i.network ? [] : [{ type: "network" }])];
  return {
    ociVersion: "1.0.2",
    process: {
      terminal: false,
      user: { uid: 0, gid: 0 },
      args: INIT,
      env: [`PATH=${PATH_IN}`, "HOME=/workspace", `BERTH_MACHINE=${i.machineId}`, `BERTH_INCARNATION=${i.incarnation}`],
      cwd: "/workspace",
      capabilities: CAPABILITIES,
    },
    root: { path: root, readonly: false },
    hostname: i.machineId.slice(0, 63),
    mounts,
    linux: {
      namespaces,
      ...(i.resources ? { cgroupsPath: i.resources.cgroupsPath, resources: ociResources(i.resources) } : {}),
    },
  };
}

/**
 * The process spec of one `runsc exec --process` (written to a file, so the
 * environment never appears in argv): the identity wrapper, then `argv`, as
 * the image's user in its working directory (default: root in /workspace).
 */
export function execProcessSpec(
  argv: string[],
  env: Record<string, string>,
  terminal: boolean,
  as: { uid: number; gid: number; additionalGids?: number[]; cwd?: string } = { uid: 0, gid: 0 },
): Record<string, unknown> {
  const gids = as.additionalGids ?? [];
  return {
    terminal,
    user: { uid: as.uid, gid: as.gid, ...(gids.length > 0 ? { additionalGids: gids } : {}) },
    args: ["/bin/sh", "-c", EXEC_WRAPPER, "berth-exec", ...argv],
    env: Object.entries(env).map(([k, v]) => `${k}=${v}`),
    cwd: as.cwd ?? "/workspace",
    // A non-root image user gets no capabilities (as with docker's USER); root keeps the runtime's set.
    capabilities: as.uid === 0 ? CAPABILITIES : { bounding: CAPS, effective: [], permitted: [], inheritable: [] },
  };
}
