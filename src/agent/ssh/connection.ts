/**
 * One connection to the SSH gateway (gateway.ts), in its order:
 *
 * 1. accepted: counted as live, with an authentication timer;
 * 2. authentication: public key only, asked of the key authority, the
 *    signature verified (the no-signature probe answered for a key that would
 *    be authorized), at most MAX_AUTH_ATTEMPTS tries;
 * 3. ready: the key's expiry timer armed; each session channel
 *    (session-requests.ts) and each `direct-tcpip` forward re-asks the
 *    authority before a session starts;
 * 4. lost or ended: its sessions cut and the connection forgotten.
 */
import ssh2 from "ssh2";
import type { AuthContext, ClientInfo, Connection, PublicKeyAuthContext, ServerChannel } from "ssh2";
import { isId } from "../../core/ids.js";
import { fingerprintOf } from "../../core/ssh-public-key.js";
import type { InstalledKey } from "../contracts.js";
import type { SshAdmission } from "./admission.js";
import { forwardArgv, forwardDecision } from "./channels.js";
import { armAt, endConn, MAX_SESSIONS_PER_CONNECTION, startSession, stillSameKey, type Conn, type GatewayContext } from "./live.js";
import { wireSession } from "./session-requests.js";

const MAX_AUTH_ATTEMPTS = 6;

/** Step 1: a connection ssh2 accepted; authentication, readiness and loss are wired to it. */
export function acceptConnection(g: GatewayContext, admission: SshAdmission, client: Connection, info: ClientInfo): void {
  // Before key exchange: small SSH packets otherwise wait on Nagle + delayed ACK (~40 ms a round trip).
  (client as Connection & { setNoDelay(on: boolean): void }).setNoDelay(true);
  const c: Conn = { client, machineId: null, key: null, sessions: new Set(), timer: null, ended: false };
  g.conns.add(c);
  let attempts = 0;
  const authTimer = setTimeout(() => {
    if (!c.key) endConn(c, "authentication timeout");
  }, admission.limits.authTimeoutMs);

  client.on("authentication", (ctx: AuthContext) => authenticate(g, c, ctx, ++attempts));
  client.on("ready", () => {
    clearTimeout(authTimer);
    admission.authenticated(info.ip, info.port);
    onReady(g, c);
  });

  const lost = () => {
    clearTimeout(authTimer);
    g.conns.delete(c);
    endConn(c, "client connection lost");
  };
  client.on("close", lost);
  client.on("end", lost);
  client.on("error", (e) => g.log.info({ machine: c.machineId, err: e.message }, "ssh connection error"));
}

/** Step 2: one authentication request; the connection takes the machine and key once a signature verifies. */
function authenticate(g: GatewayContext, c: Conn, ctx: AuthContext, attempt: number): void {
  if (g.closing || attempt > MAX_AUTH_ATTEMPTS) {
    ctx.reject([]);
    endConn(c, "too many authentication attempts");
    return;
  }
  if (ctx.method !== "publickey") return ctx.reject(["publickey"]);
  const pk = ctx as PublicKeyAuthContext;
  if (!isId(pk.username)) return pk.reject(["publickey"]);
  const fp = fingerprintOf(pk.key.data);
  const t = g.now();
  const key = g.keys.authorize(pk.username, fp, t);
  // Belt and braces: the authority's answer must be for exactly this machine and key, and unexpired at t.
  if (!key || key.machineId !== pk.username || key.fingerprint !== fp || (key.expiresAt !== null && t >= key.expiresAt)) {
    g.log.info({ machine: pk.username, fingerprint: fp }, "ssh key refused");
    return pk.reject(["publickey"]);
  }
  if (!pk.signature || !pk.blob) return pk.accept(); // "would this key be accepted?" — yes
  const parsed = ssh2.utils.parseKey(pk.key.data);
  const pub = Array.isArray(parsed) ? parsed[0] : parsed;
  if (!pub || pub instanceof Error || pub.verify(pk.blob, pk.signature, pk.hashAlgo) !== true) {
    g.log.warn({ machine: pk.username, fingerprint: fp }, "ssh signature did not verify");
    return pk.reject(["publickey"]);
  }
  c.machineId = pk.username;
  c.key = key;
  pk.accept();
}

/** Step 3: an authenticated connection; its key's expiry is armed, and its channels open sessions. */
function onReady(g: GatewayContext, c: Conn): void {
  const key = c.key!;
  g.log.info({ machine: c.machineId, grant: key.grantId, fingerprint: key.fingerprint }, "ssh connection authenticated");
  if (key.expiresAt !== null) {
    c.timer = armAt(g.now, key.expiresAt, () => endConn(c, `key expired (grant ${key.grantId})`));
  }
  c.client.on("session", (accept, reject) => {
    if (c.ended || g.closing || c.sessions.size >= MAX_SESSIONS_PER_CONNECTION) return reject();
    // Re-ask the authority: the key may have been removed since the connection authenticated.
    const still = g.keys.authorize(c.machineId!, key.fingerprint, g.now());
    if (!stillSameKey(key, still)) {
      reject();
      endConn(c, "key no longer authorized");
      return;
    }
    wireSession(g, c, key, accept());
  });
  c.client.on("tcpip", (accept, reject, info) => {
    void forward(g, c, key, accept as unknown as () => ServerChannel, reject, info);
  });
}

/**
 * `direct-tcpip` (ssh -L, ssh -W): a forward to one of the machine's own ports, run as a
 * session whose command connects from inside the machine. Every other destination is refused
 * before a channel exists, as is a machine whose loopback would be the host's.
 */
async function forward(g: GatewayContext, c: Conn, key: InstalledKey, accept: () => ServerChannel, reject: () => void, info: { destIP: string; destPort: number }): Promise<void> {
  const d = forwardDecision(info.destIP, info.destPort);
  let why: string | null = d.kind === "refuse" ? `${d.code}: ${d.why}` : null;
  if (why === null) {
    try {
      const r = await g.runtime.forwardRefusal(c.machineId!);
      if (r !== null) why = `forward_refused: ${r}`;
    } catch (e) {
      why = `forward_refused: ${e instanceof Error ? e.message : String(e)}`;
    }
  }
  if (why !== null || d.kind !== "connect" || c.sessions.size >= MAX_SESSIONS_PER_CONNECTION) {
    g.log.info({ machine: c.machineId, dest: `${String(info.destIP)}:${String(info.destPort)}`, why: why ?? "too many sessions" }, "forward refused");
    reject();
    return;
  }
  if (!startSession(g, c, key, forwardArgv(process.execPath, d.host, d.port), {}, null, accept)) reject();
}
