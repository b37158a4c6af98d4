/**
 * The agent's SSH gateway: an ssh2 server in front of the machines on this host.
 *
 * - Host key: one persistent Ed25519 key (host-key.ts), written whole before
 *   first use and reused on restart, so pinned known_hosts lines stay valid.
 * - Who: the SSH user names the machine; only public-key authentication; the
 *   key's SHA256 fingerprint must be authorized by the key authority for that
 *   machine (installed, current generation, `now < expiresAt`) and the
 *   signature must verify. The no-signature probe is answered positively only
 *   for a key that would be authorized. Each channel open re-asks the authority.
 * - What: session channels with exec, shell, pty-req, window-change, env
 *   (allowlist), signal (INT/QUIT/TSTP/TERM/HUP), exit-status/exit-signal; the
 *   `sftp` subsystem (the machine's own sftp-server, as a session); `direct-tcpip`
 *   to the machine's own loopback only (channels.ts), as a session. No remote
 *   (-R) or dynamic (-D) forwarding, no agent or X11 forwarding, no other subsystem.
 * - Cutting access: every session is tagged with its key's grant and
 *   fingerprint. `keys.onRevoked` ends every connection of that key at once and
 *   releases its sessions; independently, each session and connection arms a
 *   timer at the key's `expiresAt`, so access ends at that instant even if the
 *   authority's own timer is late.
 * - Restart: before listening, records a previous process left are recovered
 *   (sessions/recovery.ts): never reattached, cleaned only after absence is
 *   verified, a mismatch retained and reported.
 */
import { randomBytes } from "node:crypto";
import { createServer as createTcpServer, type AddressInfo } from "node:net";
import ssh2 from "ssh2";
import type { Connection, PublicKeyAuthContext, AuthContext, ServerChannel, Session as SshSession } from "ssh2";
import { isId, newId } from "../../core/ids.js";
import type { InstalledKey, KeyAuthority, SessionRegistry } from "../contracts.js";
import type { PtyRequest, Runtime } from "../runtime/types.js";
import { envDecision, validWindow } from "../sessions/events.js";
import { memorySessionStore, type SessionStore } from "../sessions/store.js";
import { recoverSessions, type RecoveryReport } from "../sessions/recovery.js";
import { Session } from "../sessions/session.js";
import { DEFAULT_TIMING, type Log, type SessionTiming } from "../sessions/types.js";
import { loadOrCreateHostKey } from "./host-key.js";
import { SshAdmission, type SshAdmissionLimits, type SshRefusal } from "./admission.js";
import { confinedCommandArgv, fileTransferProgram, forwardArgv, forwardDecision, sftpArgv, type FilesScope } from "./channels.js";
import { fingerprintOf } from "../../core/ssh-public-key.js";

export interface GatewayOptions {
  /** Where the Ed25519 host key lives (created 0600 on first start, reused after). */
  hostKeyPath: string;
  listen: { host: string; port: number };
  /** Which keys may open which machine; tells the gateway when a key stops being valid. */
  keys: KeyAuthority;
  /** Runs each session's command. */
  runtime: Runtime;
  /** The agent's clock (epoch ms); defaults to Date.now. */
  now?: () => number;
  log: Log;
  /** Durable session records; defaults to an in-memory store (nothing survives a restart). */
  sessionStore?: SessionStore;
  /** Release graces and drain bounds. */
  timing?: Partial<SessionTiming>;
  /** The authentication timeout and the caps on unauthenticated connections (admission.ts); unset fields take the defaults. */
  admission?: Partial<SshAdmissionLimits>;
  /** Told of every connection refused by a cap or ended by the authentication timeout (for a metric). */
  onAdmissionRefused?: (reason: SshRefusal) => void;
}

export interface GatewaySessions extends SessionRegistry {
  /** Re-check retained records not owned by a live session (e.g. after a fence); clean the verified ones. */
  sweep(): Promise<RecoveryReport>;
}

export interface Gateway {
  port: number;
  /** The host key as one OpenSSH public key line ("ssh-ed25519 AAAA… berth-host"). */
  hostKey: string;
  /** "SHA256:…" of the host key. */
  fingerprint: string;
  sessions: GatewaySessions;
  /** What recovery did with the records a previous process left. */
  recovered: RecoveryReport;
  close(): Promise<void>;
}

const MAX_AUTH_ATTEMPTS = 6;
const MAX_SESSIONS_PER_CONNECTION = 16;
const MAX_TIMER_MS = 2 ** 31 - 1;

/** One authenticated connection: one machine, one key. */
interface Conn {
  client: Connection;
  machineId: string | null;
  key: InstalledKey | null;
  sessions: Set<Session>;
  /** Fires at the key's expiresAt. */
  timer: { cancel(): void } | null;
  ended: boolean;
}

/** The authority still answers with the key this connection authenticated (same grant; a grant key of the same generation). */
function stillSameKey(authenticated: InstalledKey, now: InstalledKey | null): boolean {
  if (!now || now.grantId !== authenticated.grantId || now.mode !== authenticated.mode) return false;
  return now.mode === "keeper" || now.generation === authenticated.generation;
}

/** Call `fn` once `now() >= at`, re-arming if the timer fires early (clock skew, long delays). */
function armAt(now: () => number, at: number, fn: () => void): { cancel(): void } {
  let t: NodeJS.Timeout | null = null;
  const tick = () => {
    const left = at - now();
    if (left <= 0) {
      t = null;
      fn();
      return;
    }
    t = setTimeout(tick, Math.min(left, MAX_TIMER_MS));
  };
  tick();
  return {
    cancel() {
      if (t) clearTimeout(t);
      t = null;
    },
  };
}

export async function startGateway(opts: GatewayOptions): Promise<Gateway> {
  const now = opts.now ?? Date.now;
  const { keys, runtime, log } = opts;
  const store = opts.sessionStore ?? memorySessionStore();
  const timing: SessionTiming = { ...DEFAULT_TIMING, ...opts.timing };
  const host = loadOrCreateHostKey(opts.hostKeyPath);

  // Records from a previous process first: nothing is reattached, and nothing
  // new starts on top of a record whose processes might still exist.
  const recovered = await recoverSessions({ store, runtime, now, log });

  const conns = new Set<Conn>();
  const live = new Set<Session>();
  let closing = false;

  const endConn = (c: Conn, why: string) => {
    c.timer?.cancel();
    for (const s of c.sessions) void s.cut(why);
    if (!c.ended) {
      c.ended = true;
      try {
        c.client.end();
      } catch {
        /* already gone */
      }
    }
  };

  keys.onRevoked((machineId, fingerprint, grantId) => {
    for (const c of conns) {
      if (c.machineId === machineId && c.key?.fingerprint === fingerprint) {
        log.info({ machine: machineId, grant: grantId, fingerprint, sessions: c.sessions.size }, "key revoked: cutting its connection");
        endConn(c, `key revoked (grant ${grantId})`);
      }
    }
  });

  const admission = new SshAdmission(opts.admission ?? {}, (reason, address) => {
    opts.onAdmissionRefused?.(reason);
    log.info({ reason, address }, reason === "auth_timeout" ? "ssh connection closed: not authenticated in time" : "ssh connection refused: too many unauthenticated connections");
  });
  const server = new ssh2.Server({ hostKeys: [host.privateKey], ident: "berth" }, (client, info) => {
    // Before key exchange: small SSH packets otherwise wait on Nagle + delayed ACK (~40 ms a round trip).
    (client as Connection & { setNoDelay(on: boolean): void }).setNoDelay(true);
    const c: Conn = { client, machineId: null, key: null, sessions: new Set(), timer: null, ended: false };
    conns.add(c);
    let attempts = 0;
    const authTimer = setTimeout(() => {
      if (!c.key) endConn(c, "authentication timeout");
    }, admission.limits.authTimeoutMs);

    client.on("authentication", (ctx: AuthContext) => {
      if (closing || ++attempts > MAX_AUTH_ATTEMPTS) {
        ctx.reject([]);
        endConn(c, "too many authentication attempts");
        return;
      }
      if (ctx.method !== "publickey") return ctx.reject(["publickey"]);
      const pk = ctx as PublicKeyAuthContext;
      if (!isId(pk.username)) return pk.reject(["publickey"]);
      const fp = fingerprintOf(pk.key.data);
      const t = now();
      const key = keys.authorize(pk.username, fp, t);
      // Belt and braces: the authority's answer must be for exactly this machine and key, and unexpired at t.
      if (!key || key.machineId !== pk.username || key.fingerprint !== fp || (key.expiresAt !== null && t >= key.expiresAt)) {
        log.info({ machine: pk.username, fingerprint: fp }, "ssh key refused");
        return pk.reject(["publickey"]);
      }
      if (!pk.signature || !pk.blob) return pk.accept(); // "would this key be accepted?" — yes
      const parsed = ssh2.utils.parseKey(pk.key.data);
      const pub = Array.isArray(parsed) ? parsed[0] : parsed;
      if (!pub || pub instanceof Error || pub.verify(pk.blob, pk.signature, pk.hashAlgo) !== true) {
        log.warn({ machine: pk.username, fingerprint: fp }, "ssh signature did not verify");
        return pk.reject(["publickey"]);
      }
      c.machineId = pk.username;
      c.key = key;
      pk.accept();
    });

    client.on("ready", () => {
      clearTimeout(authTimer);
      admission.authenticated(info.ip, info.port);
      const key = c.key!;
      log.info({ machine: c.machineId, grant: key.grantId, fingerprint: key.fingerprint }, "ssh connection authenticated");
      if (key.expiresAt !== null) {
        c.timer = armAt(now, key.expiresAt, () => endConn(c, `key expired (grant ${key.grantId})`));
      }
      client.on("session", (accept, reject) => {
        if (c.ended || closing || c.sessions.size >= MAX_SESSIONS_PER_CONNECTION) return reject();
        // Re-ask the authority: the key may have been removed since the connection authenticated.
        const still = keys.authorize(c.machineId!, key.fingerprint, now());
        if (!stillSameKey(key, still)) {
          reject();
          endConn(c, "key no longer authorized");
          return;
        }
        wireSession(c, key, accept());
      });
      client.on("tcpip", (accept, reject, info) => {
        void forward(c, key, accept as unknown as () => ServerChannel, reject, info);
      });
    });

    const lost = () => {
      clearTimeout(authTimer);
      conns.delete(c);
      endConn(c, "client connection lost");
    };
    client.on("close", lost);
    client.on("end", lost);
    client.on("error", (e) => log.info({ machine: c.machineId, err: e.message }, "ssh connection error"));
  });

  function wireSession(c: Conn, key: InstalledKey, ss: SshSession): void {
    const env: Record<string, string> = {};
    let pty: PtyRequest | null = null;
    let session: Session | null = null;
    // A subsystem request waiting for the machine's files scope: no second command on this channel.
    let pending = false;

    ss.on("env", (accept, reject, info) => {
      const d = envDecision(String(info.key), String(info.val), Object.keys(env).length);
      if (session || d.kind === "refuse") return reject?.();
      env[info.key] = info.val;
      accept?.();
    });
    ss.on("pty", (accept, reject, info) => {
      const w = validWindow(info.cols, info.rows);
      const term = typeof info.term === "string" && /^[A-Za-z0-9._+-]{1,64}$/.test(info.term) ? info.term : "xterm";
      if (session || pty || !w) return reject?.();
      pty = { cols: w.cols, rows: w.rows, term };
      accept?.();
    });
    ss.on("window-change", (accept, reject, info) => {
      if (!session) {
        // Before the command starts the size is part of the PTY request, not a terminal event.
        const w = validWindow(info.cols, info.rows);
        if (!pty || !w) return reject?.();
        pty = { ...pty, ...w };
        return accept?.();
      }
      if (session.resize(info.cols, info.rows)) accept?.();
      else reject?.();
    });
    // ssh2 refuses every request on a session once the client sent EOF, yet EOF only ends the
    // command's input: a signal after it (Ctrl-C to `berth run` with stdin at EOF) must still
    // arrive, as RFC 4254 allows requests until the channel closes.
    ss.on("eof", () => {
      (ss as unknown as { _ending: boolean })._ending = false;
    });
    ss.on("signal", (accept, reject, info) => {
      if (session && session.signal(String(info.name))) accept?.();
      else reject?.();
    });

    const begin = (argv: string[] | null, acceptCh: () => ServerChannel) => {
      const s = startSession(c, key, argv, { ...env }, pty, acceptCh);
      if (s) session = s;
      return s !== null;
    };

    /**
     * A session whose command depends on the machine's files scope (runtime.filesScope, async). The
     * channel is accepted at once, before the scope is read: a client sends its first bytes without
     * waiting for the reply, and only an accepted channel keeps them (data on a channel not yet
     * accepted is dropped, and the client then waits for an answer forever).
     */
    const beginScoped = (what: string, accept: () => ServerChannel, argvFor: (scope: FilesScope) => string[], ptyOf: PtyRequest | null) => {
      pending = true;
      const channel = accept();
      const unserved = (why: string) => {
        log.info({ machine: c.machineId, what, why }, "session not served");
        channel.close();
      };
      void runtime.filesScope(c.machineId!).then(
        (scope) => {
          const s = startSession(c, key, argvFor(scope), { ...env }, ptyOf, () => channel);
          session = s;
          if (!s) unserved("the connection is ending or its key is no longer valid");
        },
        (e: unknown) => unserved(e instanceof Error ? e.message : String(e)),
      );
    };

    ss.on("exec", (accept, reject, info) => {
      const command = String(info.command);
      // scp -O and rsync send their server side as a command: under `--files workspace` it runs in the same jail as SFTP.
      const program = fileTransferProgram(command);
      if (program && !(session || pending || c.ended || closing)) {
        return beginScoped(program, accept as unknown as () => ServerChannel, (scope) => (scope === "workspace" ? confinedCommandArgv(program, command) : ["/bin/sh", "-c", command]), pty);
      }
      if (session || pending || !begin(["/bin/sh", "-c", command], accept)) reject?.();
    });
    ss.on("shell", (accept, reject) => {
      if (session || pending || !begin(null, accept)) reject?.();
    });
    // SFTP (sftp, scp's default protocol, editors' remote modes): the machine's own sftp-server,
    // run like any command — recorded, cut at return, proven gone by the fence.
    // A pool with `--files workspace` gets the server confined to the workspace (channels.ts).
    ss.on("subsystem", (accept, reject, info) => {
      const refuse = () => {
        log.info({ machine: c.machineId, subsystem: String(info.name) }, "subsystem refused");
        reject?.();
      };
      if (session || pending || info.name !== "sftp" || c.ended || closing) return refuse();
      // Never on a PTY: the SFTP protocol is binary.
      beginScoped("sftp", accept as unknown as () => ServerChannel, sftpArgv, null);
    });
  }

  /** One session on an accepted channel; null (nothing accepted) when the connection is ending or the key is no longer valid. */
  function startSession(c: Conn, key: InstalledKey, argv: string[] | null, env: Record<string, string>, pty: PtyRequest | null, acceptCh: () => ServerChannel): Session | null {
    if (c.ended || closing) return null;
    const still = keys.authorize(c.machineId!, key.fingerprint, now());
    if (!stillSameKey(key, still)) {
      endConn(c, "key no longer authorized");
      return null;
    }
    const channel = acceptCh();
    const s = new Session(
      { runtime, store, now, log, timing },
      {
        sessionId: newId("s", (n) => randomBytes(n)),
        machineId: c.machineId!,
        grantId: key.grantId,
        fingerprint: key.fingerprint,
        argv,
        env,
        pty,
      },
      channel,
    );
    c.sessions.add(s);
    live.add(s);
    const expiry = key.expiresAt !== null ? armAt(now, key.expiresAt, () => void s.cut(`key expired (grant ${key.grantId})`)) : null;
    void s.done.then((out) => {
      expiry?.cancel();
      c.sessions.delete(s);
      live.delete(s);
      log.info({ session: out.sessionId, machine: c.machineId, state: out.state, reason: out.reason }, "session ended");
    });
    void s.start();
    return s;
  }

  /**
   * `direct-tcpip` (ssh -L, ssh -W): a forward to one of the machine's own ports, run as a
   * session whose command connects from inside the machine. Every other destination is refused
   * before a channel exists, as is a machine whose loopback would be the host's.
   */
  async function forward(c: Conn, key: InstalledKey, accept: () => ServerChannel, reject: () => void, info: { destIP: string; destPort: number }): Promise<void> {
    const d = forwardDecision(info.destIP, info.destPort);
    let why: string | null = d.kind === "refuse" ? `${d.code}: ${d.why}` : null;
    if (why === null) {
      try {
        const r = await runtime.forwardRefusal(c.machineId!);
        if (r !== null) why = `forward_refused: ${r}`;
      } catch (e) {
        why = `forward_refused: ${e instanceof Error ? e.message : String(e)}`;
      }
    }
    if (why !== null || d.kind !== "connect" || c.sessions.size >= MAX_SESSIONS_PER_CONNECTION) {
      log.info({ machine: c.machineId, dest: `${String(info.destIP)}:${String(info.destPort)}`, why: why ?? "too many sessions" }, "forward refused");
      reject();
      return;
    }
    if (!startSession(c, key, forwardArgv(process.execPath, d.host, d.port), {}, null, accept)) reject();
  }

  // Our own listener, so a connection is admitted (or refused) at TCP accept, before ssh2 reads a byte of it.
  const tcp = createTcpServer((socket) => {
    if (admission.admit(socket)) server.injectSocket(socket);
  });
  await new Promise<void>((resolve, reject) => {
    tcp.once("error", reject);
    tcp.listen(opts.listen.port, opts.listen.host, () => {
      tcp.off("error", reject);
      resolve();
    });
  });
  const port = (tcp.address() as AddressInfo).port;
  log.info({ host: opts.listen.host, port, fingerprint: host.fingerprint }, "ssh gateway listening");

  const sessions: GatewaySessions = {
    async closeMachine(machineId, why) {
      const cut: Promise<unknown>[] = [];
      let n = 0;
      for (const c of conns) {
        if (c.machineId !== machineId) continue;
        n += c.sessions.size;
        for (const s of c.sessions) cut.push(s.done);
        endConn(c, why);
      }
      await Promise.all(cut);
      return n;
    },
    count(machineId) {
      let n = 0;
      for (const s of live) if (s.spec.machineId === machineId) n++;
      return n;
    },
    sweep() {
      return recoverSessions({ store, runtime, now, log, skip: new Set([...live].map((s) => s.spec.sessionId)) });
    },
  };

  return {
    port,
    hostKey: host.publicKey,
    fingerprint: host.fingerprint,
    sessions,
    recovered,
    async close() {
      closing = true;
      const closed = new Promise<void>((r) => tcp.close(() => r()));
      admission.closeAll();
      const done = [...live].map((s) => s.done);
      for (const c of conns) endConn(c, "gateway closing");
      await Promise.all(done);
      await closed;
    },
  };
}
