/**
 * The agent's one HTTP pool for its calls of the coordinator (enrollment,
 * src/agent/enroll.ts, and the identity calls, src/agent/identity/coordinator.ts),
 * on berth's shared client (src/http/client.ts): a JSON POST, its answer's
 * status and text. A call that gets no answer fails with a message naming
 * the coordinator and the path, never the request's headers; a refusal is
 * left to the caller, which maps it to its own error.
 */
import { HttpClient } from "../http/client.js";
import { agentRefusal } from "../protocol/agent-api.js";

/** Keep-alive between the agent's calls; a coordinator that does not accept the connection in 10 s is not waited for longer. */
const coordinator = new HttpClient({ connectTimeoutMs: 10_000 });

/**
 * POSTs `body` as JSON to `path` on the coordinator at `coordinatorUrl`.
 * `what` names the call in the error when there is no answer ("the enrollment", "/v1/hosts/session").
 */
export async function postToCoordinator(coordinatorUrl: string, path: string, what: string, headers: Record<string, string>, body: unknown, timeoutMs: number): Promise<{ status: number; text: string }> {
  const url = new URL(path, coordinatorUrl);
  try {
    const r = await coordinator.request("POST", url, `${url.pathname}${url.search}`, { headers, body, timeoutMs });
    return { status: r.status, text: r.text };
  } catch (e) {
    throw new Error(`the coordinator at ${url.origin} did not answer ${what} (${(e as Error).message})`);
  }
}

/** The code and message of a coordinator's refusal body (`{error: {code, message}}`), or the status and the text's start. */
export function refusalOf(status: number, text: string): { code: string; message: string } {
  let code = `http_${status}`;
  let message = text.slice(0, 300);
  try {
    const r = agentRefusal(JSON.parse(text));
    if (r.code !== null) code = r.code;
    if (r.message !== null) message = r.message;
  } catch {
    // not JSON: keep the text
  }
  return { code, message };
}
