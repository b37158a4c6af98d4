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
 *
 * One connection is connection.ts; the requests on one session channel,
 * session-requests.ts; what they share and how a session starts, live.ts.
 */
import { createServer as createTcpServer, type AddressInfo, type Server as TcpServer } from "node:net";
import ssh2 from "ssh2";
import type { KeyAuthority, SessionRegistry } from "../contracts.js";
import type { Runtime } from "../runtime/types.js";
import { memorySessionStore, type SessionStore } from "../sessions/store.js";
import { recoverSessions, type RecoveryReport } from "../sessions/recovery.js";
import { DEFAULT_TIMING, type Log, type SessionTiming } from "../sessions/types.js";
import { loadOrCreateHostKey } from "./host-key.js";
import { SshAdmission, type SshAdmissionLimits, type SshRefusal } from "./admission.js";
import { acceptConnection } from "./connection.js";
import { endConn, type GatewayContext } from "./live.js";

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

/**
 * The gateway's steps: the host key, recovery of what a previous process left,
 * cutting revoked keys, the SSH server behind admission (connection.ts), the
 * listener, then the session registry and close.
 */
export async function startGateway(opts: GatewayOptions): Promise<Gateway> {
  const g: GatewayContext = {
    keys: opts.keys,
    runtime: opts.runtime,
    store: opts.sessionStore ?? memorySessionStore(),
    now: opts.now ?? Date.now,
    log: opts.log,
    timing: { ...DEFAULT_TIMING, ...opts.timing },
    conns: new Set(),
    live: new Set(),
    closing: false,
  };
  const host = loadOrCreateHostKey(opts.hostKeyPath);

  // Records from a previous process first: nothing is reattached, and nothing
  // new starts on top of a record whose processes might still exist.
  const recovered = await recoverSessions({ store: g.store, runtime: g.runtime, now: g.now, log: g.log });

  cutRevokedKeys(g);
  const admission = new SshAdmission(opts.admission ?? {}, (reason, address) => {
    opts.onAdmissionRefused?.(reason);
    g.log.info({ reason, address }, reason === "auth_timeout" ? "ssh connection closed: not authenticated in time" : "ssh connection refused: too many unauthenticated connections");
  });
  const server = new ssh2.Server({ hostKeys: [host.privateKey], ident: "berth" }, (client, info) => acceptConnection(g, admission, client, info));
  const tcp = await listen(opts.listen, admission, server);
  const port = (tcp.address() as AddressInfo).port;
  g.log.info({ host: opts.listen.host, port, fingerprint: host.fingerprint }, "ssh gateway listening");

  return {
    port,
    hostKey: host.publicKey,
    fingerprint: host.fingerprint,
    sessions: sessionRegistry(g),
    recovered,
    async close() {
      g.closing = true;
      const closed = new Promise<void>((r) => tcp.close(() => r()));
      admission.closeAll();
      const done = [...g.live].map((s) => s.done);
      for (const c of g.conns) endConn(c, "gateway closing");
      await Promise.all(done);
      await closed;
    },
  };
}

/** `keys.onRevoked` ends every connection of that key at once, with its sessions. */
function cutRevokedKeys(g: GatewayContext): void {
  g.keys.onRevoked((machineId, fingerprint, grantId) => {
    for (const c of g.conns) {
      if (c.machineId === machineId && c.key?.fingerprint === fingerprint) {
        g.log.info({ machine: machineId, grant: grantId, fingerprint, sessions: c.sessions.size }, "key revoked: cutting its connection");
        endConn(c, `key revoked (grant ${grantId})`);
      }
    }
  });
}

/** Our own listener, so a connection is admitted (or refused) at TCP accept, before ssh2 reads a byte of it. */
async function listen(at: { host: string; port: number }, admission: SshAdmission, server: ssh2.Server): Promise<TcpServer> {
  const tcp = createTcpServer((socket) => {
    if (admission.admit(socket)) server.injectSocket(socket);
  });
  await new Promise<void>((resolve, reject) => {
    tcp.once("error", reject);
    tcp.listen(at.port, at.host, () => {
      tcp.off("error", reject);
      resolve();
    });
  });
  return tcp;
}

/** The sessions as the agent's operations see them: cut a machine's, count them, sweep retained records. */
function sessionRegistry(g: GatewayContext): GatewaySessions {
  const { store, runtime, now, log } = g;
  return {
    async closeMachine(machineId, why) {
      const cut: Promise<unknown>[] = [];
      let n = 0;
      for (const c of g.conns) {
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
      for (const s of g.live) if (s.spec.machineId === machineId) n++;
      return n;
    },
    sweep() {
      return recoverSessions({ store, runtime, now, log, skip: new Set([...g.live].map((s) => s.spec.sessionId)) });
    },
  };
}
