/**
 * Pulling from a registry over the OCI distribution API (`/v2/`): the
 * manifest by tag or digest (an index resolved to this host's platform),
 * then blobs by digest. Authentication as registries ask for it in their
 * `WWW-Authenticate` challenge: `Bearer` (a token from the named realm,
 * fetched with the registry's credentials when there are some, anonymously
 * otherwise) or `Basic`.
 *
 * Credentials come from a file (`berth agent --registry-auth FILE`, Docker's
 * config.json shape), read on every pull and never put in argv, logs or
 * errors. The file must not be readable by group or others.
 *
 * HTTPS, except for a registry on loopback (localhost, 127.0.0.0/8, ::1) or
 * one named with `--insecure-registry` (plain HTTP), as Docker does.
 *
 * Errors: a registry that cannot be reached, answers 5xx or refuses the
 * credentials is `image_unavailable` (the provision is retried); an image
 * it does not have, a document that is not what its digest says, or a
 * blob longer than its descriptor is `image_invalid`.
 */
import { readFileSync, statSync } from "node:fs";
import { Readable, Transform } from "node:stream";
import type { ReadableStream as WebReadableStream } from "node:stream/web";
import { BerthError } from "../../core/errors.js";
import { MANIFEST_ACCEPT, type Descriptor } from "./oci.js";
import { manifestOf, sha256, verifyDocument, type ImageSource, type ResolvedManifest } from "./source.js";

export interface RegistryOptions {
  /** Docker config.json-shaped credentials file; absent: anonymous. */
  authFile?: string;
  /** Registries (HOST[:PORT]) reached over plain HTTP. */
  insecure?: readonly string[];
  /** Per-request timeout for documents, and the longest a blob download may stall. */
  timeoutMs?: number;
}

interface Credentials {
  username: string;
  password: string;
}

/** The registry's entry of a config.json-shaped file, or null. Throws for an unreadable or too-open file. */
export function readCredentials(file: string, registry: string): Credentials | null {
  let raw: string;
  try {
    const st = statSync(file);
    if ((st.mode & 0o077) !== 0) {
      throw new BerthError("image_unavailable", `image_unavailable: the registry credentials file ${file} is readable by group or others (mode ${(st.mode & 0o777).toString(8)}); chmod 600 it`);
    }
    raw = readFileSync(file, "utf8");
  } catch (e) {
    if (e instanceof BerthError) throw e;
    throw new BerthError("image_unavailable", `image_unavailable: the registry credentials file ${file} could not be read (${(e as NodeJS.ErrnoException).code ?? "error"})`);
  }
  let doc: { auths?: Record<string, { auth?: string; username?: string; password?: string }> };
  try {
    doc = JSON.parse(raw) as typeof doc;
  } catch {
    throw new BerthError("image_unavailable", `image_unavailable: the registry credentials file ${file} is not JSON ({"auths": {"HOST:PORT": {"auth": "base64(user:password)"}}})`);
  }
  const names = registry === "registry-1.docker.io" ? [registry, "docker.io", "index.docker.io"] : [registry];
  for (const [key, entry] of Object.entries(doc.auths ?? {})) {
    const host = key.replace(/^https?:\/\//, "").replace(/\/.*$/, "");
    if (!names.includes(host) || entry === null || typeof entry !== "object") continue;
    if (typeof entry.username === "string" && typeof entry.password === "string") return { username: entry.username, password: entry.password };
    if (typeof entry.auth === "string") {
      const plain = Buffer.from(entry.auth, "base64").toString("utf8");
      const i = plain.indexOf(":");
      if (i > 0) return { username: plain.slice(0, i), password: plain.slice(i + 1) };
    }
  }
  return null;
}

function isLoopback(registry: string): boolean {
  const host = registry.replace(/:\d+$/, "").replace(/^\[|\]$/g, "");
  return host === "localhost" || host === "::1" || /^127\.\d+\.\d+\.\d+$/.test(host);
}

/** Parses `Bearer realm="…",service="…",scope="…"` (or `Basic realm="…"`). */
export function parseChallenge(h: string): { scheme: string; params: Record<string, string> } | null {
  const m = /^\s*(\w+)\s*(.*)$/.exec(h);
  if (!m) return null;
  const params: Record<string, string> = {};
  for (const p of m[2]!.matchAll(/(\w+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^,\s]+))/g)) params[p[1]!.toLowerCase()] = p[2] ?? p[3] ?? "";
  return { scheme: m[1]!.toLowerCase(), params };
}

export class RegistrySource implements ImageSource {
  readonly what: string;
  private readonly base: string;
  private authorization: string | null = null;
  private readonly timeoutMs: number;

  constructor(
    private readonly registry: string,
    private readonly repository: string,
    private readonly reference: { tag: string | null; digest: string | null },
    private readonly opts: RegistryOptions,
    what: string,
  ) {
    this.what = what;
    const plain = isLoopback(registry) || (opts.insecure ?? []).includes(registry);
    this.base = `${plain ? "http" : "https"}://${registry}`;
    this.timeoutMs = opts.timeoutMs ?? 30_000;
  }

  private credentials(): Credentials | null {
    return this.opts.authFile === undefined ? null : readCredentials(this.opts.authFile, this.registry);
  }

  private async send(path: string, accept: string | null, signal: AbortSignal): Promise<Response> {
    const headers: Record<string, string> = {};
    if (accept !== null) headers.accept = accept;
    if (this.authorization !== null) headers.authorization = this.authorization;
    try {
      return await fetch(this.base + path, { headers, signal, redirect: "follow" });
    } catch (e) {
      const cause = (e as { cause?: { code?: string; message?: string } }).cause;
      const why = signal.aborted ? `no answer within ${Math.round(this.timeoutMs / 1000)} s` : (cause?.code ?? cause?.message ?? (e as Error).message);
      throw new BerthError("image_unavailable", `image_unavailable: registry ${this.registry} could not be reached (${why}) while pulling ${this.what}`);
    }
  }

  /** Answers the registry's challenge once (a token, or basic credentials). */
  private async authenticate(res: Response, signal: AbortSignal): Promise<void> {
    const ch = parseChallenge(res.headers.get("www-authenticate") ?? "");
    const creds = this.credentials();
    if (ch?.scheme === "basic") {
      if (creds === null) throw new BerthError("image_unavailable", `image_unavailable: registry ${this.registry} asks for credentials and the agent has none for it (berth agent --registry-auth FILE)`);
      this.authorization = `Basic ${Buffer.from(`${creds.username}:${creds.password}`).toString("base64")}`;
      return;
    }
    if (ch?.scheme !== "bearer" || !ch.params.realm) {
      throw new BerthError("image_unavailable", `image_unavailable: registry ${this.registry} refused the pull of ${this.what} (401) without a challenge berth can answer`);
    }
    const url = new URL(ch.params.realm);
    if (ch.params.service) url.searchParams.set("service", ch.params.service);
    url.searchParams.set("scope", ch.params.scope ?? `repository:${this.repository}:pull`);
    const headers: Record<string, string> = {};
    if (creds !== null) headers.authorization = `Basic ${Buffer.from(`${creds.username}:${creds.password}`).toString("base64")}`;
    let r: Response;
    try {
      r = await fetch(url, { headers, signal });
    } catch (e) {
      throw new BerthError("image_unavailable", `image_unavailable: the token service of registry ${this.registry} (${url.origin}) could not be reached (${(e as { cause?: { code?: string } }).cause?.code ?? (e as Error).message})`);
    }
    if (r.status === 401 || r.status === 403) {
      throw new BerthError("image_unavailable", `image_unavailable: the token service of registry ${this.registry} refused ${creds === null ? "an anonymous pull" : "the agent's credentials"} of ${this.repository} (${r.status})`);
    }
    if (!r.ok) throw new BerthError("image_unavailable", `image_unavailable: the token service of registry ${this.registry} answered ${r.status}`);
    const body = (await r.json().catch(() => ({}))) as { token?: unknown; access_token?: unknown };
    const token = typeof body.token === "string" ? body.token : typeof body.access_token === "string" ? body.access_token : null;
    if (token === null) throw new BerthError("image_unavailable", `image_unavailable: the token service of registry ${this.registry} gave no token`);
    this.authorization = `Bearer ${token}`;
  }

  /** GET with one authentication round; `stream`: the caller reads the body (its stall bound is theirs). */
  private async get(path: string, accept: string | null, what: string, given?: AbortSignal): Promise<Response> {
    for (let attempt = 0; ; attempt++) {
      const signal = given ?? AbortSignal.timeout(this.timeoutMs);
      const res = await this.send(path, accept, signal);
      if (res.status === 401 && attempt === 0) {
        await res.body?.cancel();
        await this.authenticate(res, signal);
        continue;
      }
      if (res.ok) return res;
      const text = (await res.text().catch(() => "")).slice(0, 300);
      let code = "";
      try {
        code = ((JSON.parse(text) as { errors?: Array<{ code?: string }> }).errors ?? []).map((e) => e.code).join(",");
      } catch {
        // not JSON
      }
      const detail = `${res.status}${code ? ` ${code}` : ""}`;
      if (res.status === 401 || res.status === 403) throw new BerthError("image_unavailable", `image_unavailable: registry ${this.registry} refused the pull of ${this.what} (${detail}); check the agent's --registry-auth credentials`);
      if (res.status === 404) throw new BerthError("image_invalid", `image_invalid: registry ${this.registry} has no ${what} (${detail})`);
      if (res.status >= 500 || res.status === 429) throw new BerthError("image_unavailable", `image_unavailable: registry ${this.registry} answered ${detail} for ${what}`);
      throw new BerthError("image_invalid", `image_invalid: registry ${this.registry} answered ${detail} for ${what}`);
    }
  }

  private async readDocument(path: string, accept: string | null, max: number, what: string): Promise<{ bytes: Buffer; mediaType: string | undefined; digestHeader: string | null }> {
    const res = await this.get(path, accept, what);
    const declared = Number(res.headers.get("content-length") ?? NaN);
    if (Number.isFinite(declared) && declared > max) throw new BerthError("image_invalid", `image_invalid: ${what} is ${declared} bytes, more than the ${max} a document may have`);
    const chunks: Buffer[] = [];
    let n = 0;
    try {
      for await (const c of res.body as unknown as AsyncIterable<Uint8Array>) {
        n += c.length;
        if (n > max) throw new BerthError("image_invalid", `image_invalid: ${what} is more than the ${max} bytes a document may have`);
        chunks.push(Buffer.from(c));
      }
    } catch (e) {
      if (e instanceof BerthError) throw e;
      throw new BerthError("image_unavailable", `image_unavailable: registry ${this.registry} broke off ${what} (${(e as Error).message})`);
    }
    const type = res.headers.get("content-type")?.split(";")[0]?.trim();
    return { bytes: Buffer.concat(chunks), mediaType: type === "" ? undefined : type, digestHeader: res.headers.get("docker-content-digest") };
  }

  async manifest(): Promise<ResolvedManifest> {
    const ref = this.reference.digest ?? this.reference.tag ?? "latest";
    const top = await this.readDocument(`/v2/${this.repository}/manifests/${ref}`, MANIFEST_ACCEPT, 4 << 20, `manifest ${this.repository}:${ref}`);
    const digest = sha256(top.bytes);
    if (this.reference.digest !== null && digest !== this.reference.digest) {
      throw new BerthError("image_invalid", `image_invalid: registry ${this.registry} answered ${this.what} with a manifest whose digest is ${digest}, not ${this.reference.digest}`);
    }
    if (top.digestHeader !== null && /^sha256:/.test(top.digestHeader) && top.digestHeader !== digest) {
      throw new BerthError("image_invalid", `image_invalid: the manifest of ${this.what} hashes to ${digest}, the registry says ${top.digestHeader}`);
    }
    const resolved = await manifestOf(top.bytes, top.mediaType, this.what, async (d) => {
      const r = await this.readDocument(`/v2/${this.repository}/manifests/${d.digest}`, MANIFEST_ACCEPT, 4 << 20, `manifest ${d.digest}`);
      return { bytes: verifyDocument(r.bytes, d, "manifest"), mediaType: r.mediaType ?? d.mediaType };
    });
    return resolved;
  }

  /** The blob's body; a download that stalls for the timeout is aborted (however long the whole takes). */
  async blob(d: Descriptor): Promise<Readable> {
    const ac = new AbortController();
    let timer = setTimeout(() => ac.abort(), this.timeoutMs);
    const res = await this.get(`/v2/${this.repository}/blobs/${d.digest}`, null, `blob ${d.digest}`, ac.signal).catch((e: unknown) => {
      clearTimeout(timer);
      throw e;
    });
    if (res.body === null) {
      clearTimeout(timer);
      throw new BerthError("image_unavailable", `image_unavailable: registry ${this.registry} sent no body for blob ${d.digest}`);
    }
    const registry = this.registry;
    const ms = this.timeoutMs;
    const watch = new Transform({
      transform(chunk: Buffer, _enc, cb) {
        clearTimeout(timer);
        timer = setTimeout(() => ac.abort(), ms);
        cb(null, chunk);
      },
      flush(cb) {
        clearTimeout(timer);
        cb();
      },
    });
    const body = Readable.fromWeb(res.body as unknown as WebReadableStream<Uint8Array>);
    body.once("error", (e) => {
      clearTimeout(timer);
      watch.destroy(new BerthError("image_unavailable", `image_unavailable: registry ${registry} broke off blob ${d.digest} (${ac.signal.aborted ? `stalled for ${Math.round(ms / 1000)} s` : e.message})`));
    });
    watch.once("close", () => clearTimeout(timer));
    return body.pipe(watch);
  }

  async document(d: Descriptor, max: number): Promise<Buffer> {
    if (d.size > max) throw new BerthError("image_invalid", `image_invalid: the config of ${this.what} is ${d.size} bytes, more than ${max}`);
    const r = await this.readDocument(`/v2/${this.repository}/blobs/${d.digest}`, null, max, `config ${d.digest}`);
    return verifyDocument(r.bytes, d, `config of ${this.what}`);
  }

  async close(): Promise<void> {
    this.authorization = null;
  }
}
