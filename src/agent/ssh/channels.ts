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

/** The argv of an SFTP session: a shell loop that execs the machine's own sftp-server, or says there is none (exit 127). */
export function sftpArgv(): string[] {
  const list = SFTP_SERVER_PATHS.join(" ");
  const script =
    `for p in ${list}; do [ -x "$p" ] && exec "$p"; done; ` +
    `echo "berth: sftp_unavailable: this machine has no sftp-server (looked in ${list}); install openssh-sftp-server (or the distribution's equivalent) in its image" >&2; exit 127`;
  return ["/bin/sh", "-c", script];
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
