/**
 * The coordinator's calls to an enrolled agent: the token it presents (the
 * host-call token, bound to the host's identity key once the floor is
 * recorded; docs/host-identity.md) and one JSON request. A host awaiting
 * its agent after an identity reset is never called.
 *
 * One keep-alive pool for every host (berth's shared client,
 * src/http/client.ts): an ack's install call reuses the connection of the
 * call before it.
 */
import { HttpClient } from "../../http/client.js";
import { floorRecorded, identityFingerprint, type HostIdentityState } from "../../core/host-identity.js";
import { hostCallToken } from "../../core/tokens.js";

export interface AgentAddress {
  id: string;
  url: string;
  identity_state: HostIdentityState;
  identity_key: string | null;
}

/** The token this coordinator presents to the host now. */
export function callTokenFor(secret: Uint8Array, host: AgentAddress): string {
  const bound = floorRecorded(host.identity_state) && host.identity_key !== null ? identityFingerprint(host.identity_key) : null;
  return hostCallToken(secret, host.id, bound);
}

/** An agent's answer, its body not yet read by the contract (src/protocol/agent-api.ts parses it). */
export interface AgentReply {
  status: number;
  body: unknown;
}

/** Every agent call; an agent that does not accept the connection within 10 s is not waited for longer. */
const agents = new HttpClient({ connectTimeoutMs: 10_000 });

export async function callAgent(secret: Uint8Array, host: AgentAddress, method: "GET" | "POST", path: string, body: unknown, timeoutMs: number): Promise<AgentReply> {
  // No credential goes to the address of a host whose identity was reset: nothing proven stands behind it.
  if (host.identity_state === "awaiting") throw new Error(`host ${host.id} awaits its agent after an identity reset; it is not called until its agent binds a key again`);
  // Nor to anything but an http(s) address (enrollment admits no other; a row from before that check is not called).
  if (!/^https?:\/\//.test(host.url)) throw new Error(`host ${host.id} has an API address that is not http: or https:; it is not called`);
  const url = new URL(`${host.url}${path}`);
  const r = await agents.request(method, url, `${url.pathname}${url.search}`, {
    headers: { authorization: `Bearer ${callTokenFor(secret, host)}` },
    // Encoded here, so that a string body is sent as a JSON string (the client sends a string as it is); undefined sends none.
    ...(method === "POST" ? { body: JSON.stringify(body) } : {}),
    timeoutMs,
  });
  try {
    return { status: r.status, body: JSON.parse(r.text) as unknown };
  } catch {
    return { status: r.status, body: { error: { code: "bad_reply", message: `agent answered ${r.status} with a body that is not JSON` } } };
  }
}
