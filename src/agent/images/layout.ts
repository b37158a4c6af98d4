/**
 * Images in files on the agent's host: an OCI image layout directory
 * (`oci:DIR[:TAG]`: `oci-layout`, `index.json`, `blobs/sha256/…`) and a
 * `docker save` archive (`docker-archive:FILE`), in either of its formats —
 * Docker's older one (`manifest.json`, `<id>.json`, `<id>/layer.tar`) or the
 * OCI layout inside the tar that newer Docker writes.
 *
 * An archive is read once into a private temporary directory (entries with
 * `..` or absolute names are refused; only regular files and links between
 * them are kept), then read like a layout. Legacy archives have no manifest
 * digest: their layers are verified against the config's `rootfs.diff_ids`,
 * their config against its own file name.
 */
import { closeSync, createReadStream, createWriteStream, existsSync, lstatSync, mkdirSync, mkdtempSync, openSync, readFileSync, readSync, renameSync, rmSync, statSync } from "node:fs";
import { join, posix } from "node:path";
import { createHash } from "node:crypto";
import type { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { z } from "zod";
import { extract as tarExtract } from "tar-stream";
import { BerthError } from "../../core/errors.js";
import { indexSchema, MEDIA, parseDocument, type Descriptor, type ImageManifest } from "./oci.js";
import { manifestOf, sha256, verifyDocument, type ImageSource, type ResolvedManifest } from "./source.js";

const REF_NAME = "org.opencontainers.image.ref.name";

function unavailable(what: string, e: unknown): BerthError {
  return new BerthError("image_unavailable", `image_unavailable: ${what} could not be read: ${(e as Error).message}`);
}

/** An OCI image layout directory. */
export class LayoutSource implements ImageSource {
  constructor(
    readonly dir: string,
    readonly tag: string | null,
    readonly what: string,
    /** Removed by close() (an archive's temporary copy); null: the operator's own directory. */
    private readonly owned: string | null = null,
  ) {}

  private blobPath(digest: string): string {
    return join(this.dir, "blobs", "sha256", digest.slice("sha256:".length));
  }

  private readWhole(d: Pick<Descriptor, "digest" | "size">, max: number, what: string): Buffer {
    if (d.size > max) throw new BerthError("image_invalid", `image_invalid: ${what} ${d.digest} of ${this.what} is ${d.size} bytes, more than the ${max} a document may have`);
    let bytes: Buffer;
    try {
      const st = statSync(this.blobPath(d.digest));
      if (st.size > max) throw new BerthError("image_invalid", `image_invalid: ${what} ${d.digest} of ${this.what} is ${st.size} bytes, more than the ${max} a document may have`);
      bytes = readFileSync(this.blobPath(d.digest));
    } catch (e) {
      if (e instanceof BerthError) throw e;
      if ((e as NodeJS.ErrnoException).code === "ENOENT") throw new BerthError("image_invalid", `image_invalid: ${this.what} lacks blob ${d.digest} (${what})`);
      throw unavailable(this.what, e);
    }
    return verifyDocument(bytes, d, `${what} of ${this.what}`);
  }

  async manifest(): Promise<ResolvedManifest> {
    let index: Buffer;
    try {
      if (!statSync(this.dir).isDirectory()) throw new Error("not a directory");
      const layout = JSON.parse(readFileSync(join(this.dir, "oci-layout"), "utf8")) as { imageLayoutVersion?: unknown };
      if (typeof layout.imageLayoutVersion !== "string") throw new Error("oci-layout names no imageLayoutVersion");
      index = readFileSync(join(this.dir, "index.json"));
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      if (code === "ENOENT" || code === "ENOTDIR" || e instanceof SyntaxError || (e as Error).message.includes("not a directory") || (e as Error).message.includes("oci-layout")) {
        throw new BerthError("image_invalid", `image_invalid: ${this.what} is not an OCI image layout directory (${(e as Error).message}); make one with skopeo copy or umoci`);
      }
      throw unavailable(this.what, e);
    }
    const idx = parseDocument(indexSchema, index, `index.json of ${this.what}`);
    const named = (d: Descriptor): string | undefined => d.annotations?.[REF_NAME];
    let chosen: Descriptor;
    if (this.tag !== null) {
      const found = idx.manifests.find((d) => named(d) === this.tag);
      if (!found) {
        const tags = idx.manifests.map(named).filter((t): t is string => t !== undefined);
        throw new BerthError("image_invalid", `image_invalid: ${this.what} has no image tagged ${this.tag} (tags: ${tags.join(", ") || "none"})`);
      }
      chosen = found;
    } else if (idx.manifests.length === 1) {
      chosen = idx.manifests[0]!;
    } else {
      // The layout's index itself may be a multi-platform index: choose by platform.
      return manifestOf(index, MEDIA.ociIndex, this.what, async (d) => ({ bytes: this.readWhole(d, 4 << 20, "manifest"), mediaType: d.mediaType }));
    }
    const bytes = this.readWhole(chosen, 4 << 20, "manifest");
    return manifestOf(bytes, chosen.mediaType, this.what, async (d) => ({ bytes: this.readWhole(d, 4 << 20, "manifest"), mediaType: d.mediaType }));
  }

  async blob(d: Descriptor): Promise<Readable> {
    const p = this.blobPath(d.digest);
    if (!existsSync(p)) throw new BerthError("image_invalid", `image_invalid: ${this.what} lacks blob ${d.digest}`);
    return createReadStream(p);
  }

  async document(d: Descriptor, max: number): Promise<Buffer> {
    return this.readWhole(d, max, "config");
  }

  async close(): Promise<void> {
    if (this.owned !== null) rmSync(this.owned, { recursive: true, force: true });
  }
}

const legacyManifest = z.array(z.object({ Config: z.string(), RepoTags: z.array(z.string()).nullable().optional(), Layers: z.array(z.string()) })).min(1);

/** A legacy `docker save` archive, extracted: layers named by path, verified by diff_id. */
class LegacyArchiveSource implements ImageSource {
  constructor(
    private readonly dir: string,
    private readonly files: Map<string, string>,
    private readonly entry: { Config: string; Layers: string[] },
    readonly what: string,
  ) {}

  private path(name: string): string {
    const p = this.files.get(posix.normalize(name));
    if (p === undefined) throw new BerthError("image_invalid", `image_invalid: ${this.what} lacks ${name}, which its manifest.json names`);
    return p;
  }

  private digestOfFile(name: string): Promise<{ digest: string; size: number }> {
    const h = createHash("sha256");
    let size = 0;
    return new Promise((resolve, reject) => {
      createReadStream(this.path(name))
        .on("data", (c) => {
          size += (c as Buffer).length;
          h.update(c as Buffer);
        })
        .on("error", reject)
        .on("end", () => resolve({ digest: "sha256:" + h.digest("hex"), size }));
    });
  }

  private byDigest = new Map<string, string>();

  async manifest(): Promise<ResolvedManifest> {
    const configBytes = readFileSync(this.path(this.entry.Config));
    // The config is named by its own digest (`<hex>.json` or `blobs/sha256/<hex>`).
    const m = /([a-f0-9]{64})(?:\.json)?$/.exec(this.entry.Config);
    const configDigest = sha256(configBytes);
    if (m && `sha256:${m[1]}` !== configDigest) throw new BerthError("image_invalid", `image_invalid: config ${this.entry.Config} of ${this.what} does not match its name (the bytes hash to ${configDigest})`);
    this.byDigest.set(configDigest, this.entry.Config);
    const layers: Descriptor[] = [];
    for (const l of this.entry.Layers) {
      const { digest, size } = await this.digestOfFile(l);
      this.byDigest.set(digest, l);
      // Declared nowhere: the first bytes say whether it is gzip; diff_ids verify the content.
      const head = Buffer.alloc(2);
      const fd = openSync(this.path(l), "r");
      try {
        readSync(fd, head, 0, 2, 0);
      } finally {
        closeSync(fd);
      }
      const gzip = head[0] === 0x1f && head[1] === 0x8b;
      layers.push({ mediaType: gzip ? "application/vnd.docker.image.rootfs.diff.tar.gzip" : "application/vnd.docker.image.rootfs.diff.tar", digest, size });
    }
    const manifest: ImageManifest = { schemaVersion: 2, mediaType: MEDIA.dockerManifest, config: { mediaType: MEDIA.dockerConfig, digest: configDigest, size: configBytes.length }, layers };
    return { manifest, digest: null };
  }

  async blob(d: Descriptor): Promise<Readable> {
    const name = this.byDigest.get(d.digest);
    if (name === undefined) throw new BerthError("image_invalid", `image_invalid: ${this.what} has no blob ${d.digest}`);
    return createReadStream(this.path(name));
  }

  async document(d: Descriptor, max: number): Promise<Buffer> {
    const name = this.byDigest.get(d.digest);
    if (name === undefined) throw new BerthError("image_invalid", `image_invalid: ${this.what} has no blob ${d.digest}`);
    if (d.size > max) throw new BerthError("image_invalid", `image_invalid: the config of ${this.what} is over ${max} bytes`);
    return verifyDocument(readFileSync(this.path(name)), d, `config of ${this.what}`);
  }

  async close(): Promise<void> {
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/**
 * Reads a `docker save` archive into a temporary directory under `tmpRoot`
 * (at most `max` bytes) and returns the source for the image in it.
 */
export async function openDockerArchive(file: string, tmpRoot: string, max: number, what: string): Promise<ImageSource> {
  try {
    const st = lstatSync(file);
    if (!st.isFile()) throw new BerthError("image_invalid", `image_invalid: ${what}: ${file} is not a regular file`);
  } catch (e) {
    if (e instanceof BerthError) throw e;
    if ((e as NodeJS.ErrnoException).code === "ENOENT") throw new BerthError("image_invalid", `image_invalid: ${what}: ${file} does not exist on this host`);
    throw unavailable(what, e);
  }
  mkdirSync(tmpRoot, { recursive: true, mode: 0o700 });
  const dir = mkdtempSync(join(tmpRoot, ".archive-"));
  try {
    const files = new Map<string, string>();
    const links = new Map<string, string>();
    let used = 0;
    let n = 0;
    const ex = tarExtract();
    const reading = pipeline(createReadStream(file), ex);
    reading.catch(() => undefined); // awaited below; an early refusal must not leave it unhandled
    for await (const entry of ex) {
      const h = entry.header;
      const name = posix.normalize(h.name.replace(/^\.?\/+/, ""));
      if (name.startsWith("..") || name.startsWith("/") || name.includes("\0")) {
        entry.resume();
        throw new BerthError("image_invalid", `image_invalid: ${what}: archive entry ${JSON.stringify(h.name.slice(0, 200))} is outside the archive`);
      }
      if (h.type === "file" || h.type === "contiguous-file") {
        used += h.size ?? 0;
        if (used > max) throw new BerthError("image_too_large", `image_too_large: ${what} is larger than the agent's image cache limit`);
        const out = join(dir, `f${n++}`);
        await pipeline(entry, createWriteStream(out, { flags: "wx", mode: 0o600 }));
        files.set(name, out);
      } else if (h.type === "symlink" || h.type === "link") {
        entry.resume();
        const target = h.type === "symlink" ? posix.normalize(posix.join(posix.dirname(name), h.linkname ?? "")) : posix.normalize(h.linkname ?? "");
        links.set(name, target);
      } else entry.resume();
    }
    await reading;
    // Older Docker links a layer shared by two images to the first copy.
    for (const [name, target] of links) {
      const p = files.get(target);
      if (p !== undefined) files.set(name, p);
    }
    if (files.has("index.json") && files.has("oci-layout")) {
      // Newer Docker: an OCI layout inside the tar. Lay its blobs out as a layout directory.
      const layoutDir = join(dir, "layout");
      mkdirSync(join(layoutDir, "blobs", "sha256"), { recursive: true });
      for (const [name, p] of files) {
        const m = /^blobs\/sha256\/([a-f0-9]{64})$/.exec(name);
        if (m) renameSync(p, join(layoutDir, "blobs", "sha256", m[1]!));
        else if (name === "index.json" || name === "oci-layout") renameSync(p, join(layoutDir, name));
      }
      const idx = parseDocument(indexSchema, readFileSync(join(layoutDir, "index.json")), `index.json of ${what}`);
      if (idx.manifests.length !== 1) {
        throw new BerthError("image_invalid", `image_invalid: ${what} holds ${idx.manifests.length} images; save one image per archive`);
      }
      return new LayoutSource(layoutDir, null, what, dir);
    }
    const mf = files.get("manifest.json");
    if (mf === undefined) throw new BerthError("image_invalid", `image_invalid: ${what} is not a docker save archive (no manifest.json or index.json)`);
    const entries = parseDocument(legacyManifest, readFileSync(mf), `manifest.json of ${what}`);
    if (entries.length !== 1) {
      throw new BerthError("image_invalid", `image_invalid: ${what} holds ${entries.length} images (${entries.map((e) => (e.RepoTags ?? []).join(" ") || e.Config).join("; ")}); save one image per archive`);
    }
    return new LegacyArchiveSource(dir, files, entries[0]!, what);
  } catch (e) {
    rmSync(dir, { recursive: true, force: true });
    if (e instanceof BerthError) throw e;
    throw new BerthError("image_invalid", `image_invalid: ${what} could not be read as a tar archive: ${(e as Error).message}`);
  }
}
