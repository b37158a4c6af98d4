/**
 * The agent's image cache: each image unpacked once, by the digest of its
 * config (its image id), into `<stateDir>/images/<id>/rootfs`, which every
 * machine of it boots from read-only under its own writable memory overlay
 * (docs/images.md).
 *
 * A pull, step by step, and what each failure leaves:
 *   1. the manifest of this host's platform, then the config, each checked
 *      against its digest (a reference by digest: the manifest too);
 *   2. declared layer sizes against the cache limit: a layer (or image)
 *      over it is refused before a byte of it is read;
 *   3. every layer streamed through its digest and size check, gunzip, its
 *      uncompressed digest (the config's diff_id) and the unpacker
 *      (layer.ts, unpack.ts) into a private `.tmp-*` directory;
 *   4. /bin/sh and sleep present, the image's User resolved, its WorkingDir
 *      made (boot.ts), `image.json` written and synced;
 *   5. one rename makes `.tmp-*` the cached `<id>`.
 *   Any failure before 5 removes the temporary directory; a crash leaves a
 *   `.tmp-*` that the next start removes. A directory named by an id is
 *   therefore always a whole, verified image. Removal renames it back to a
 *   `.tmp-*` name first, for the same reason.
 *
 * Pull policy: an image is pulled the first time a reference is used; later
 * machines of the same reference boot from the cache without asking the
 * registry (an `oci:` layout or archive whose files changed is read again).
 * Concurrent provisions of one reference share one pull.
 *
 * Eviction: whenever an image is taken from the cache or added to it, the
 * least recently used images no machine uses are removed until the cache is
 * within `--image-cache-max`.
 */
import { randomBytes } from "node:crypto";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, realpathSync, renameSync, rmSync, statSync } from "node:fs";
import { join, resolve, sep } from "node:path";
import { BerthError } from "../../core/errors.js";
import { formatImageRef, parseImageRef, type ImageRef } from "../../core/image-ref.js";
import { writeFileDurable } from "../../io/durable-file.js";
import type { AgentLog } from "../log.js";
import type { BootImage } from "../runtime/types.js";
import { checkConfigPlatform, configSchema, parseDocument } from "./oci.js";
import { envMap } from "./image-user.js";
import { LayoutSource, openDockerArchive } from "./layout.js";
import { RegistrySource, type RegistryOptions } from "./registry.js";
import type { ImageSource } from "./source.js";
import { Unpacker } from "./unpack.js";
import { bootOf } from "./boot.js";
import { streamLayer } from "./layer.js";
import { formatBytes } from "../../core/bytes.js";

export interface ImageCacheOptions {
  stateDir: string;
  /** The most bytes the cache may hold (unpacked); also the bound of one image. */
  maxBytes: number;
  registry?: RegistryOptions;
  /** Machines per image id this agent runs now: never evicted or removed. */
  inUse: () => Map<string, number>;
  log: AgentLog;
  now?: () => number;
}

/** What the cache keeps of an image (image.json). */
export interface ImageRecord {
  v: 1;
  id: string;
  configDigest: string;
  /** Digests of the manifests (or indexes) it was pulled by. */
  manifestDigests: string[];
  /** References that resolved to it, with what the source looked like then (files' size and time; null for a registry). */
  refs: Array<{ ref: string; stamp: string | null }>;
  /** Bytes unpacked (file contents plus 512 per entry). */
  size: number;
  layers: number;
  createdAt: number;
  lastUsedAt: number;
  pullMs: number;
  boot: Pick<BootImage, "env" | "workingDir" | "user" | "shell">;
}

export interface ImageView {
  id: string;
  refs: string[];
  manifestDigests: string[];
  size: number;
  layers: number;
  createdAt: number;
  lastUsedAt: number;
  pullMs: number;
  machines: number;
}

const CONFIG_MAX = 4 << 20;

export class ImageCache {
  readonly dir: string;
  private readonly inflight = new Map<string, Promise<BootImage>>();
  private readonly now: () => number;

  constructor(private readonly o: ImageCacheOptions) {
    this.dir = join(resolve(o.stateDir), "images");
    this.now = o.now ?? Date.now;
    mkdirSync(this.dir, { recursive: true, mode: 0o700 });
  }

  get maxBytes(): number {
    return this.o.maxBytes;
  }

  /** Removes what an interrupted pull or removal left (`.tmp-*`, `.archive-*`); call once at start. */
  sweep(): number {
    let n = 0;
    for (const name of readdirSync(this.dir)) {
      if (name.startsWith(".tmp-") || name.startsWith(".archive-")) {
        rmSync(join(this.dir, name), { recursive: true, force: true });
        n++;
      }
    }
    return n;
  }

  private recordPath(id: string): string {
    return join(this.dir, id, "image.json");
  }

  private read(id: string): ImageRecord | null {
    try {
      return JSON.parse(readFileSync(this.recordPath(id), "utf8")) as ImageRecord;
    } catch {
      return null;
    }
  }

  private records(): ImageRecord[] {
    return readdirSync(this.dir)
      .filter((n) => /^[a-f0-9]{64}$/.test(n))
      .map((n) => this.read(n))
      .filter((r): r is ImageRecord => r !== null);
  }

  private write(r: ImageRecord, dir = join(this.dir, r.id)): void {
    writeFileDurable(join(dir, "image.json"), JSON.stringify(r, null, 2) + "\n", 0o600);
  }

  private boot(r: ImageRecord, ref: string): BootImage {
    return { id: r.id, ref, digest: r.manifestDigests[0] ?? null, rootfs: join(this.dir, r.id, "rootfs"), ...r.boot };
  }

  list(): ImageView[] {
    const used = this.o.inUse();
    return this.records()
      .sort((a, b) => b.lastUsedAt - a.lastUsedAt)
      .map((r) => ({ id: r.id, refs: r.refs.map((x) => x.ref), manifestDigests: r.manifestDigests, size: r.size, layers: r.layers, createdAt: r.createdAt, lastUsedAt: r.lastUsedAt, pullMs: r.pullMs, machines: used.get(r.id) ?? 0 }));
  }

  /** Removes a cached image no machine uses; `conflict` while one does. Accepts the id or a unique prefix of it (or `sha256:…`). */
  remove(idOrPrefix: string): { id: string; size: number } {
    const want = idOrPrefix.replace(/^sha256:/, "");
    if (!/^[a-f0-9]{4,64}$/.test(want)) throw new BerthError("invalid_request", `invalid_request: ${JSON.stringify(idOrPrefix.slice(0, 80))} is not an image id (see berth image ls)`);
    const matches = this.records().filter((r) => r.id.startsWith(want));
    if (matches.length === 0) throw new BerthError("not_found", `not_found: no cached image ${idOrPrefix} on this host`);
    if (matches.length > 1) throw new BerthError("invalid_request", `invalid_request: ${idOrPrefix} names ${matches.length} images; give more of the id`);
    const r = matches[0]!;
    const n = this.o.inUse().get(r.id) ?? 0;
    if (n > 0) throw new BerthError("conflict", `conflict: image ${r.id.slice(0, 12)} is used by ${n} machine(s) on this host; drain their pools (or change the pools' image) first`);
    this.discard(r.id);
    return { id: r.id, size: r.size };
  }

  /** Out of the cache in one rename, then deleted. */
  private discard(id: string): void {
    const gone = join(this.dir, `.tmp-rm-${id.slice(0, 12)}-${randomBytes(4).toString("hex")}`);
    renameSync(join(this.dir, id), gone);
    rmSync(gone, { recursive: true, force: true });
  }

  /** The image to boot for `refText`: from the cache, or pulled, verified and unpacked now. */
  ensure(refText: string): Promise<BootImage> {
    const ref = parseImageRef(refText);
    const key = formatImageRef(ref);
    if (ref.kind === "ami") return Promise.reject(new BerthError("invalid_request", `invalid_request: ${key} is an AMI; only pools of the aws provider boot AMIs`));
    if (ref.kind === "dir") return Promise.resolve(this.directory(ref.path, key));
    let p = this.inflight.get(key);
    if (!p) {
      p = this.obtain(ref, key).finally(() => this.inflight.delete(key));
      this.inflight.set(key, p);
    }
    return p;
  }

  /** A root directory used as it is (`dir:PATH`): nothing is copied; the agent's own state directory is never one. */
  private directory(path: string, ref: string): BootImage {
    let real: string;
    try {
      real = realpathSync(path);
      if (!statSync(real).isDirectory()) throw new Error("not a directory");
    } catch (e) {
      throw new BerthError("image_invalid", `image_invalid: ${ref}: ${path} is not a directory on this host (${(e as Error).message})`);
    }
    const state = realpathSync(resolve(this.o.stateDir));
    if (real === state || real.startsWith(state + sep)) throw new BerthError("image_invalid", `image_invalid: ${ref} is inside the agent's state directory, which no machine may see`);
    const boot = bootOf(real, {}, null, null, ref);
    return { id: null, ref, digest: null, rootfs: real, ...boot };
  }

  /** What the source looked like (for files on this host), so a changed layout or archive is read again. */
  private stamp(ref: ImageRef): string | null {
    const f = ref.kind === "oci" ? join(ref.dir, "index.json") : ref.kind === "docker-archive" ? ref.file : null;
    if (f === null) return null;
    try {
      const st = statSync(f);
      return `${st.size}:${st.mtimeMs}:${st.ino}`;
    } catch {
      return "missing";
    }
  }

  private async obtain(ref: ImageRef, key: string): Promise<BootImage> {
    const stamp = this.stamp(ref);
    const digest = ref.kind === "registry" ? ref.digest : null;
    const cached = this.records().find((r) => r.refs.some((x) => x.ref === key && x.stamp === stamp) || (digest !== null && r.manifestDigests.includes(digest)));
    if (cached) return this.touch(cached, key, stamp, null);
    const t0 = this.now();
    const src = await this.open(ref, key);
    try {
      const { manifest, digest: manifestDigest } = await src.manifest();
      const config = parseDocument(configSchema, await src.document(manifest.config, CONFIG_MAX), `the config of ${key}`);
      checkConfigPlatform(config, key);
      if (config.rootfs.diff_ids.length !== manifest.layers.length) {
        throw new BerthError("image_invalid", `image_invalid: ${key} lists ${manifest.layers.length} layers and its config ${config.rootfs.diff_ids.length}`);
      }
      const id = manifest.config.digest.slice("sha256:".length);
      const have = this.read(id);
      if (have && existsSync(join(this.dir, id, "rootfs"))) return this.touch(have, key, stamp, manifestDigest);
      const max = this.o.maxBytes;
      let declared = 0;
      for (const l of manifest.layers) {
        if (l.size > max) throw new BerthError("image_too_large", `image_too_large: layer ${l.digest} of ${key} is ${formatBytes(l.size)}, over this agent's image cache limit (--image-cache-max ${formatBytes(max)}); nothing was downloaded`);
        declared += l.size;
      }
      if (declared > max) throw new BerthError("image_too_large", `image_too_large: the layers of ${key} are ${formatBytes(declared)} compressed, over this agent's image cache limit (--image-cache-max ${formatBytes(max)}); nothing was downloaded`);
      const tmp = mkdtempSync(join(this.dir, ".tmp-"));
      try {
        const rootfs = join(tmp, "rootfs");
        mkdirSync(rootfs, { mode: 0o755 });
        const unpacker = new Unpacker(rootfs, { max, used: 0 }, key);
        for (let i = 0; i < manifest.layers.length; i++) await streamLayer(src, unpacker, manifest.layers[i]!, config.rootfs.diff_ids[i]!, key);
        unpacker.finish();
        const c = config.config ?? {};
        const boot = bootOf(rootfs, envMap(c.Env), c.WorkingDir ?? null, c.User ?? null, key);
        const now = this.now();
        const rec: ImageRecord = {
          v: 1, id, configDigest: manifest.config.digest, manifestDigests: manifestDigest ? [manifestDigest] : [], refs: [{ ref: key, stamp }],
          size: unpacker.budget.used, layers: manifest.layers.length, createdAt: now, lastUsedAt: now, pullMs: now - t0, boot,
        };
        this.write(rec, tmp);
        try {
          renameSync(tmp, join(this.dir, id));
        } catch (e) {
          // Pulled meanwhile under another reference: keep that one.
          const other = this.read(id);
          if (!other) throw e;
          rmSync(tmp, { recursive: true, force: true });
          return this.touch(other, key, stamp, manifestDigest);
        }
        this.o.log.info({ image: key, id: id.slice(0, 12), size: rec.size, layers: rec.layers, ms: rec.pullMs }, "image pulled and unpacked");
        this.evict(id);
        return this.boot(rec, key);
      } catch (e) {
        rmSync(tmp, { recursive: true, force: true });
        throw e;
      }
    } finally {
      await src.close();
    }
  }

  private async open(ref: ImageRef, key: string): Promise<ImageSource> {
    switch (ref.kind) {
      case "oci":
        return new LayoutSource(ref.dir, ref.tag, key);
      case "docker-archive":
        return openDockerArchive(ref.file, this.dir, this.o.maxBytes, key);
      case "registry":
        return new RegistrySource(ref.registry, ref.repository, { tag: ref.tag, digest: ref.digest }, this.o.registry ?? {}, key);
      case "dir":
      case "ami":
        throw new Error(`${ref.kind} images are not pulled`);
    }
  }

  /** Marks a cached image used now by `ref` (durably), and returns it. */
  private touch(r: ImageRecord, ref: string, stamp: string | null, manifestDigest: string | null): BootImage {
    const refs = [...r.refs.filter((x) => x.ref !== ref), { ref, stamp }].slice(-32);
    const digests = manifestDigest !== null && !r.manifestDigests.includes(manifestDigest) ? [...r.manifestDigests, manifestDigest] : r.manifestDigests;
    const next: ImageRecord = { ...r, refs, manifestDigests: digests, lastUsedAt: this.now() };
    this.write(next);
    this.evict(r.id);
    return this.boot(next, ref);
  }

  /** Least recently used images no machine uses go until the cache is within its limit. */
  private evict(keep: string): void {
    const used = this.o.inUse();
    const recs = this.records().sort((a, b) => a.lastUsedAt - b.lastUsedAt);
    let total = recs.reduce((s, r) => s + r.size, 0);
    for (const r of recs) {
      if (total <= this.o.maxBytes) break;
      if (r.id === keep || (used.get(r.id) ?? 0) > 0) continue;
      this.discard(r.id);
      total -= r.size;
      this.o.log.info({ id: r.id.slice(0, 12), size: r.size, refs: r.refs.map((x) => x.ref) }, "image evicted (cache over --image-cache-max)");
    }
    if (total > this.o.maxBytes) this.o.log.warn({ total, max: this.o.maxBytes }, "image cache above --image-cache-max: every other image is in use");
  }
}
