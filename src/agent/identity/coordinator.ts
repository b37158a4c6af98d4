/**
 * The agent's calls to the coordinator once it has an identity
 * (docs/host-identity.md, docs/api.md):
 *
 *   POST /v1/hosts/challenge            {}                        -> {challenge, expiresAt}
 *   POST /v1/hosts/session              {hostId, challenge, signature}
 *                                                                 -> {credential, expiresAt}
 *   POST /v1/hosts/self/commit          (credential)              -> {hostCallToken}
 *   POST /v1/hosts/self/describe        (credential) {description, step, owed, version}
 *                                                                 -> {hostId, hostCallToken}
 *   POST /v1/hosts/self/active          (credential) {version}    -> {state}
 *   POST /v1/hosts/self/stopped         (credential) {reports}    -> {moot: [{machineId, generation}]}
 *
 * Every call after the session carries the short-lived host credential the
 * coordinator issued against a fresh signed challenge; it is renewed before
 * it expires (a third of its life left) and held only in memory. Nothing
 * here logs or returns the credential.
 */
import type { StoppedReport } from "../../core/host-identity.js";
import type { EnrollRequest } from "../enroll.js";
import { postToCoordinator, refusalOf } from "../coordinator-call.js";
import { parseReply, routePath, type RouteBody, type RouteReply } from "../../protocol/api.js";

/** The coordinator routes an agent calls with its identity. */
type HostRoute = "POST /v1/hosts/challenge" | "POST /v1/hosts/session" | "POST /v1/hosts/self/commit" | "POST /v1/hosts/self/describe" | "POST /v1/hosts/self/active" | "POST /v1/hosts/self/stopped";
import type { IdentityKey } from "./key.js";

/** A refusal (4xx) with the coordinator's stable code. */
export class CoordinatorRefusal extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
    this.name = "CoordinatorRefusal";
  }
}

export interface IdentityClientDeps {
  coordinatorUrl: string;
  key: IdentityKey;
  /** The host id the coordinator knows this agent by (null before the first enrollment). */
  hostId: () => string | null;
  now: () => number;
  timeoutMs?: number;
}

export class IdentityClient {
  readonly #d: IdentityClientDeps;
  #credential: { value: string; issuedAt: number; expiresAt: number } | null = null;
  /** The coordinator last said an operator reset this host's identity (`host_awaiting`): no key is recorded for it. */
  awaitingReset = false;

  constructor(deps: IdentityClientDeps) {
    this.#d = deps;
  }

  /** A credential valid for a while yet: the held one, or a new one against a fresh proof. */
  async credential(): Promise<string> {
    const now = this.#d.now();
    const c = this.#credential;
    if (c !== null && now < c.expiresAt - (c.expiresAt - c.issuedAt) / 3) return c.value;
    return this.renew();
  }

  /** Proves the key again and takes a new credential. */
  async renew(): Promise<string> {
    const hostId = this.#d.hostId();
    if (hostId === null) throw new Error("this agent has no host id yet: it has never enrolled");
    const { challenge } = await this.challenge();
    let got: { credential: string; expiresAt: number };
    try {
      got = await this.#post("POST /v1/hosts/session", null, {
        hostId,
        challenge,
        signature: this.#d.key.prove("session", hostId, challenge),
      });
    } catch (e) {
      if (e instanceof CoordinatorRefusal && e.code === "host_awaiting") this.awaitingReset = true;
      throw e;
    }
    this.awaitingReset = false;
    this.#credential = { value: got.credential, issuedAt: this.#d.now(), expiresAt: got.expiresAt };
    return got.credential;
  }

  /** Forgets the held credential (a call refused it). */
  forget(): void {
    this.#credential = null;
  }

  get credentialExpiresAt(): number | null {
    return this.#credential?.expiresAt ?? null;
  }

  async challenge(): Promise<{ challenge: string; expiresAt: number }> {
    return this.#post("POST /v1/hosts/challenge", null, {});
  }

  /** The identity proof an enrollment carries. */
  async enrollProof(name: string): Promise<{ publicKey: string; challenge: string; signature: string }> {
    const { challenge } = await this.challenge();
    return { publicKey: this.#d.key.publicKey, challenge, signature: this.#d.key.prove("enroll", name, challenge) };
  }

  async commit(): Promise<{ hostCallToken: string }> {
    return this.#self("POST /v1/hosts/self/commit", {});
  }

  async describe(body: { description: Omit<EnrollRequest, "name">; step: string; owed: number; version: string }): Promise<{ hostId: string; hostCallToken: string }> {
    return this.#self("POST /v1/hosts/self/describe", body);
  }

  async active(version: string): Promise<{ state: string }> {
    return this.#self("POST /v1/hosts/self/active", { version });
  }

  async stopped(reports: StoppedReport[]): Promise<{ moot: StoppedReport[] }> {
    return this.#self("POST /v1/hosts/self/stopped", { reports });
  }

  /** A call with the credential; a 401 drops it and proves the key once more. */
  async #self<R extends HostRoute>(route: R, body: RouteBody<R>): Promise<RouteReply<R>> {
    try {
      return await this.#post(route, await this.credential(), body);
    } catch (e) {
      if (!(e instanceof CoordinatorRefusal) || e.status !== 401) throw e;
      this.forget();
      return this.#post(route, await this.credential(), body);
    }
  }

  /** One call of a coordinator route, its answer parsed by the contract (src/protocol/api.ts). */
  async #post<R extends HostRoute>(route: R, bearer: string | null, body: RouteBody<R>): Promise<RouteReply<R>> {
    const path = routePath(route, {});
    const headers: Record<string, string> = {};
    if (bearer !== null) headers.authorization = `Bearer ${bearer}`;
    const res = await postToCoordinator(this.#d.coordinatorUrl, path, path, headers, body, this.#d.timeoutMs ?? 15_000);
    const text = res.text;
    if (res.status < 200 || res.status > 299) {
      const { code, message } = refusalOf(res.status, text);
      const what = `the coordinator refused ${path} (${res.status} ${code}): ${message}`;
      if (res.status >= 400 && res.status < 500) throw new CoordinatorRefusal(res.status, code, what);
      throw new Error(what);
    }
    let raw: unknown;
    try {
      raw = JSON.parse(text);
    } catch {
      throw new Error(`the coordinator's answer to ${path} is not JSON`);
    }
    const parsed = parseReply(route, raw);
    if (!parsed.ok) throw new Error(parsed.why);
    return parsed.reply;
  }
}
