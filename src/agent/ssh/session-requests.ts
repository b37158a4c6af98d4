/**
 * The requests on one SSH session channel (connection.ts), in two kinds:
 *
 * - terminal requests, before or while its command runs: env (allowlist),
 *   pty-req, window-change, signal; EOF ends only the command's input;
 * - the one command request that starts the session: exec, shell, or the
 *   `sftp` subsystem. scp -O and rsync sent as exec, and SFTP, wait for the
 *   machine's files scope (channels.ts) with the channel already accepted.
 *
 * At most one command per channel: a second is refused.
 */
import type { ServerChannel, Session as SshSession } from "ssh2";
import type { InstalledKey } from "../contracts.js";
import type { PtyRequest } from "../runtime/types.js";
import { envDecision, validWindow } from "../sessions/events.js";
import type { Session } from "../sessions/session.js";
import { confinedCommandArgv, fileTransferProgram, sftpArgv, type FilesScope } from "./channels.js";
import { startSession, type Conn, type GatewayContext } from "./live.js";

/** One channel's requests so far. */
interface ChannelState {
  env: Record<string, string>;
  pty: PtyRequest | null;
  /** The session its command started; null before. */
  session: Session | null;
  /** A subsystem request waiting for the machine's files scope: no second command on this channel. */
  pending: boolean;
}

export function wireSession(g: GatewayContext, c: Conn, key: InstalledKey, ss: SshSession): void {
  const st: ChannelState = { env: {}, pty: null, session: null, pending: false };
  wireTerminalRequests(ss, st);
  wireCommandRequests(g, c, key, ss, st);
}

/** env, pty-req, window-change, EOF and signal. */
function wireTerminalRequests(ss: SshSession, st: ChannelState): void {
  ss.on("env", (accept, reject, info) => {
    const d = envDecision(String(info.key), String(info.val), Object.keys(st.env).length);
    if (st.session || d.kind === "refuse") return reject?.();
    st.env[info.key] = info.val;
    accept?.();
  });
  ss.on("pty", (accept, reject, info) => {
    const w = validWindow(info.cols, info.rows);
    const term = typeof info.term === "string" && /^[A-Za-z0-9._+-]{1,64}$/.test(info.term) ? info.term : "xterm";
    if (st.session || st.pty || !w) return reject?.();
    st.pty = { cols: w.cols, rows: w.rows, term };
    accept?.();
  });
  ss.on("window-change", (accept, reject, info) => {
    if (!st.session) {
      // Before the command starts the size is part of the PTY request, not a terminal event.
      const w = validWindow(info.cols, info.rows);
      if (!st.pty || !w) return reject?.();
      st.pty = { ...st.pty, ...w };
      return accept?.();
    }
    if (st.session.resize(info.cols, info.rows)) accept?.();
    else reject?.();
  });
  // ssh2 refuses every request on a session once the client sent EOF, yet EOF only ends the
  // command's input: a signal after it (Ctrl-C to `berth run` with stdin at EOF) must still
  // arrive, as RFC 4254 allows requests until the channel closes.
  ss.on("eof", () => {
    (ss as unknown as { _ending: boolean })._ending = false;
  });
  ss.on("signal", (accept, reject, info) => {
    if (st.session && st.session.signal(String(info.name))) accept?.();
    else reject?.();
  });
}

/** exec, shell and subsystem: the command that starts the channel's session. */
function wireCommandRequests(g: GatewayContext, c: Conn, key: InstalledKey, ss: SshSession, st: ChannelState): void {
  const { log, runtime } = g;
  const begin = (argv: string[] | null, acceptCh: () => ServerChannel) => {
    const s = startSession(g, c, key, argv, { ...st.env }, st.pty, acceptCh);
    if (s) st.session = s;
    return s !== null;
  };

  /**
   * A session whose command depends on the machine's files scope (runtime.filesScope, async). The
   * channel is accepted at once, before the scope is read: a client sends its first bytes without
   * waiting for the reply, and only an accepted channel keeps them (data on a channel not yet
   * accepted is dropped, and the client then waits for an answer forever).
   */
  const beginScoped = (what: string, accept: () => ServerChannel, argvFor: (scope: FilesScope) => string[], ptyOf: PtyRequest | null) => {
    st.pending = true;
    const channel = accept();
    const unserved = (why: string) => {
      log.info({ machine: c.machineId, what, why }, "session not served");
      channel.close();
    };
    void runtime.filesScope(c.machineId!).then(
      (scope) => {
        const s = startSession(g, c, key, argvFor(scope), { ...st.env }, ptyOf, () => channel);
        st.session = s;
        if (!s) unserved("the connection is ending or its key is no longer valid");
      },
      (e: unknown) => unserved(e instanceof Error ? e.message : String(e)),
    );
  };

  ss.on("exec", (accept, reject, info) => {
    const command = String(info.command);
    // scp -O and rsync send their server side as a command: under `--files workspace` it runs in the same jail as SFTP.
    const program = fileTransferProgram(command);
    if (program && !(st.session || st.pending || c.ended || g.closing)) {
      return beginScoped(program, accept as unknown as () => ServerChannel, (scope) => (scope === "workspace" ? confinedCommandArgv(program, command) : ["/bin/sh", "-c", command]), st.pty);
    }
    if (st.session || st.pending || !begin(["/bin/sh", "-c", command], accept)) reject?.();
  });
  ss.on("shell", (accept, reject) => {
    if (st.session || st.pending || !begin(null, accept)) reject?.();
  });
  // SFTP (sftp, scp's default protocol, editors' remote modes): the machine's own sftp-server,
  // run like any command — recorded, cut at return, proven gone by the fence.
  // A pool with `--files workspace` gets the server confined to the workspace (channels.ts).
  ss.on("subsystem", (accept, reject, info) => {
    const refuse = () => {
      log.info({ machine: c.machineId, subsystem: String(info.name) }, "subsystem refused");
      reject?.();
    };
    if (st.session || st.pending || info.name !== "sftp" || c.ended || g.closing) return refuse();
    // Never on a PTY: the SFTP protocol is binary.
    beginScoped("sftp", accept as unknown as () => ServerChannel, sftpArgv, null);
  });
}
