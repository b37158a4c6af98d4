/**
 * What the gateway runs inside a machine for the two channel kinds beside
 * exec/shell: the `sftp` subsystem and a forward (`direct-tcpip`) to one of the
 * machine's own ports. Both are ordinary sessions (one runtime exec each), so
 * they are recorded, cut at return and proven gone by the fence like any
 * command. Pure: the decisions and the argv, no I/O.
 */

/**
 * Where SFTP servers live on the common distributions (Debian/Ubuntu, Fedora/RHEL,
 * Arch/Alpine, others). The first executable one inside the machine is exec'd
 * (same pid), so the SFTP server runs as the machine's user, in its working
 * directory (the workspace), with the machine's view of the file system.
 */
export const SFTP_SERVER_PATHS = [
  "/usr/lib/openssh/sftp-server",
  "/usr/libexec/openssh/sftp-server",
  "/usr/lib/ssh/sftp-server",
  "/usr/libexec/sftp-server",
  "/usr/lib/sftp-server",
] as const;

/**
 * Where berth's own SFTP server is inside a machine booted from an image
 * (runtime/sftp-kit.ts: the host's sftp-server, its loader as `ld.so` and the
 * libraries it needs, bound read-only by the gvisor runtime). Used only where
 * none of SFTP_SERVER_PATHS is present.
 */
export const SFTP_KIT_IN = "/run/berth/sftp";

/** Where a pool's SFTP sessions may reach: the machine's whole view (default) or its workspace only. */
export type FilesScope = "machine" | "workspace";

/**
 * The jail a `workspace`-scoped SFTP server runs in, and the file-transfer
 * commands of `scp -O` and `rsync` too (sh, run inside the machine as the
 * machine's user; $1 the workspace, $2 "sftp" or "cmd", $3 the sftp-server or
 * the command line, then the programs to copy in). A private mount
 * namespace (a user namespace too when the user is not root) in which a small
 * read-only tmpfs is mounted over the workspace's own path; into it go the
 * programs (sftp-server; or /bin/sh and scp or rsync) and the libraries `ldd`
 * names (copied), a one-line passwd/group
 * for the user, /dev/null, and the workspace itself bound back at its path
 * (read-write, `mount -c`: the shell's working directory, not the path that
 * the tmpfs now covers). `chroot` into the tmpfs, then exec the server in the
 * workspace (a command: the jail's own sh changes into the workspace and execs
 * the command line, so only the copied programs exist for it). Every path — absolute, `..`, a symbolic link followed by the
 * kernel at open time — resolves inside that root, so there is no check to
 * race: outside the workspace there is nothing but those few read-only files,
 * and a write there fails (read-only file system). Nothing of this is visible
 * outside the session's own mount namespace; it ends with the server.
 */
const JAIL = [
  'ws=$1 run=$2 what=$3; shift 3',
  'mount -t tmpfs -o mode=0755,size=48m,nosuid,nodev berth-files "$ws" || exit 126',
  // berth's own server (run "kit") brings its loader and libraries: its files are copied as they are, no ldd.
  'libs=; [ "$run" = kit ] || libs=$(ldd "$@" 2>/dev/null | sed -n "s/.*=> \\(\\/[^ ]*\\) .*/\\1/p; s/^[[:space:]]*\\(\\/[^ ]*\\) (.*/\\1/p")',
  'for f in "$@" $libs; do mkdir -p "$ws${f%/*}" && cp -L "$f" "$ws$f" || exit 126; done',
  'mkdir -p "$ws/etc" "$ws/dev" "$ws$ws" || exit 126',
  'echo "$(id -un 2>/dev/null || echo user):x:$(id -u):$(id -g)::$ws:/nonexistent" > "$ws/etc/passwd" && echo "$(id -gn 2>/dev/null || echo group):x:$(id -g):" > "$ws/etc/group" || exit 126',
  ': > "$ws/dev/null" && mount --bind /dev/null "$ws/dev/null" && mount -c --bind . "$ws$ws" && mount -o remount,ro,bind "$ws" || exit 126',
  '[ "$run" = sftp ] && exec chroot "$ws" "$what" -d "$ws"',
  '[ "$run" = kit ] && exec chroot "$ws" "$what/ld.so" --library-path "$what" "$what/sftp-server" -d "$ws"',
  `exec chroot "$ws" /bin/sh -c 'cd -- "$1" || exit 126; eval "exec $2"' berth-files "$ws" "$what"`,
].join("\n");

/** The check for what the jail needs, then the jail in its own namespaces ($1 the jail script); `args` follow "$ws". */
function jailed(args: string, needsLdd = true): string {
  return (
    `ws=$(pwd -P); u=; ` +
    `if command -v chroot >/dev/null && ${needsLdd ? "command -v ldd >/dev/null && " : ""}command -v mount >/dev/null; then ` +
    `if unshare -m true 2>/dev/null; then u=-m; elif unshare -rm true 2>/dev/null; then u=-rm; fi; fi; ` +
    `[ -n "$u" ] && { unshare $u --propagation private /bin/sh -c "$1" berth-files "$ws" ${args}; s=$?; } || s=126; ` +
    `[ $s = 126 ] && echo "berth: files_confinement_unavailable: this pool confines files to the workspace, and this machine cannot start its file transfer confined (it needs unshare with a mount or user namespace, mount, chroot and ldd)" >&2; exit $s`
  );
}

/**
 * The server side of a file-transfer command a client sends as an ordinary command: legacy scp
 * (`scp -O`: `scp … -t|-f …`) and rsync (`rsync --server …`). Null for anything else.
 */
export function fileTransferProgram(command: string): "scp" | "rsync" | null {
  const words = command.trim().split(/\s+/);
  const prog = words[0]?.split("/").pop();
  if (prog === "scp" && words.slice(1).some((w) => /^-[A-Za-z]*[tf][A-Za-z]*$/.test(w))) return "scp";
  if (prog === "rsync" && words.includes("--server")) return "rsync";
  return null;
}

/**
 * The argv of a file-transfer command (fileTransferProgram) on a machine whose pool confines files
 * to the workspace: the command line runs in the JAIL, where only /bin/sh and the machine's own
 * scp or rsync (with their libraries) exist besides the workspace.
 */
export function confinedCommandArgv(program: "scp" | "rsync", command: string): string[] {
  const script =
    `p=$(command -v ${program}) || { echo "berth: ${program} is not installed in this machine" >&2; exit 127; }; ` + jailed(`cmd "$2" "$p" /bin/sh`);
  return ["/bin/sh", "-c", script, "berth-files", JAIL, command];
}

/**
 * The argv of an SFTP session: a shell loop that execs the machine's own sftp-server; failing that,
 * berth's own (SFTP_KIT_IN, through its loader); or says there is none (exit 127). With `scope`
 * "workspace" either server runs in the JAIL above; a machine where that cannot be set up (no unshare/mount/chroot, no namespaces) ends the session with
 * `files_confinement_unavailable` (exit 126) rather than serve the whole machine.
 */
export function sftpArgv(scope: FilesScope = "machine"): string[] {
  const list = SFTP_SERVER_PATHS.join(" ");
  const start = scope === "workspace" ? jailed(`sftp "$p" "$p"`) : 'exec "$p"';
  const kit = scope === "workspace" ? jailed(`kit "$k" "$k"/*`, false) : 'exec "$k/ld.so" --library-path "$k" "$k/sftp-server"';
  const script =
    `for p in ${list}; do [ -x "$p" ] && { ${start}; }; done; ` +
    `k=${SFTP_KIT_IN}; [ -x "$k/sftp-server" ] && [ -x "$k/ld.so" ] && { ${kit}; }; ` +
    `echo "berth: sftp_unavailable: this machine has no sftp-server (looked in ${list}, and for berth's own in ${SFTP_KIT_IN}, which an agent whose host has an sftp-server provides to machines of an image); install openssh-sftp-server (or the distribution's equivalent) in the image or on the agent's host" >&2; exit 127`;
  return scope === "workspace" ? ["/bin/sh", "-c", script, "berth-sftp", JAIL] : ["/bin/sh", "-c", script];
}

/** A forward request's verdict: connect to `host:port` inside the machine, or refuse with a stable code and why. */
export type ForwardDecision = { kind: "connect"; host: string; port: number } | { kind: "refuse"; code: string; why: string };

const LOOPBACK: Record<string, string> = { localhost: "127.0.0.1", "127.0.0.1": "127.0.0.1", "::1": "::1", "[::1]": "::1" };

/** `direct-tcpip` (ssh -L / -W): only the machine's own loopback, a real port. */
export function forwardDecision(destIP: unknown, destPort: unknown): ForwardDecision {
  const host = typeof destIP === "string" ? LOOPBACK[destIP.toLowerCase()] : undefined;
  if (!host) {
    return { kind: "refuse", code: "forward_refused", why: `only the machine's own ports are forwarded (localhost, 127.0.0.1, ::1), not ${String(destIP)}` };
  }
  if (typeof destPort !== "number" || !Number.isInteger(destPort) || destPort < 1 || destPort > 65535) {
    return { kind: "refuse", code: "forward_refused", why: `port ${String(destPort)} is not a TCP port (1-65535)` };
  }
  return { kind: "connect", host, port: destPort };
}

/**
 * The connector a forward runs inside the machine: Node (the agent's own
 * binary, visible inside machines that run on the host's root) when present,
 * else `nc` (busybox, netcat-openbsd or traditional). It connects to
 * host:port and copies bytes both ways; it exits when either side closes, and
 * says nothing on a refused connection (the client sees the channel close).
 */
export function forwardArgv(nodePath: string, host: string, port: number): string[] {
  const js =
    'const s=require("net").connect({host:process.argv[1],port:+process.argv[2]});' +
    "s.setNoDelay(true);process.stdin.pipe(s);s.pipe(process.stdout);" +
    's.on("error",()=>process.exit(1));s.on("close",()=>process.exit(0));';
  const script =
    'node=$1; js=$2; h=$3; p=$4; ' +
    'if [ -x "$node" ]; then exec "$node" -e "$js" "$h" "$p"; fi; ' +
    'if command -v nc >/dev/null 2>&1; then exec nc "$h" "$p"; fi; ' +
    'echo "berth: forward_unavailable: neither node nor nc in this machine" >&2; exit 127';
  return ["/bin/sh", "-c", script, "berth-forward", nodePath, js, host, String(port)];
}
