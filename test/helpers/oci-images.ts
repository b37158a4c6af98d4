/**
 * Images the tests make themselves: tar layers written entry by entry
 * (tar-stream), gzip, OCI image layouts with a config and a manifest (or an
 * index of several platforms), and two real layers — busybox-static with a
 * small /etc (its own os-release, passwd, group), and the host's perl with
 * the libraries ldd names. Bad images are made the same way, by hand: the
 * test says what is wrong with each.
 */
import { createHash } from "node:crypto";
import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, realpathSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { gzipSync } from "node:zlib";
import { pack } from "tar-stream";

export interface Entry {
  name: string;
  type?: "file" | "directory" | "symlink" | "link" | "fifo" | "character-device";
  content?: Buffer | string;
  linkname?: string;
  mode?: number;
  uid?: number;
  gid?: number;
  mtime?: Date;
}

/** An uncompressed tar of exactly these entries, in this order. */
export async function tarOf(entries: Entry[]): Promise<Buffer> {
  const p = pack();
  const chunks: Buffer[] = [];
  const done = new Promise<void>((resolve, reject) => {
    p.on("data", (c: unknown) => chunks.push(c as Buffer));
    p.on("end", resolve);
    p.on("error", reject);
  });
  for (const e of entries) {
    const type = e.type ?? "file";
    const content = typeof e.content === "string" ? Buffer.from(e.content) : (e.content ?? Buffer.alloc(0));
    const header = {
      name: e.name,
      type,
      mode: e.mode ?? (type === "directory" ? 0o755 : type === "symlink" ? 0o777 : 0o644),
      uid: e.uid ?? 0,
      gid: e.gid ?? 0,
      mtime: e.mtime ?? new Date(1_700_000_000_000),
      ...(e.linkname !== undefined ? { linkname: e.linkname } : {}),
      ...(type === "file" ? { size: content.length } : {}),
    };
    await new Promise<void>((resolve, reject) => {
      if (type === "file") p.entry(header, content, (err) => (err ? reject(err) : resolve()));
      else p.entry(header, (err) => (err ? reject(err) : resolve())).end(undefined);
    });
  }
  p.finalize();
  await done;
  return Buffer.concat(chunks);
}

export const sha256 = (b: Buffer): string => "sha256:" + createHash("sha256").update(b).digest("hex");

export interface ImageSpec {
  /** Uncompressed layer tars, bottom first. */
  layers: Buffer[];
  /** Compress layers with gzip (default true). */
  gzip?: boolean;
  env?: string[];
  workingDir?: string;
  user?: string;
  architecture?: string;
}

export interface BuiltImage {
  manifest: Buffer;
  manifestDigest: string;
  config: Buffer;
  configDigest: string;
  /** Stored blobs (compressed as stored), bottom first. */
  blobs: Buffer[];
  layerDescriptors: Array<{ mediaType: string; digest: string; size: number }>;
}

export function buildImage(s: ImageSpec): BuiltImage {
  const gz = s.gzip ?? true;
  const blobs = s.layers.map((l) => (gz ? gzipSync(l) : l));
  const config = Buffer.from(
    JSON.stringify({
      architecture: s.architecture ?? "amd64",
      os: "linux",
      config: { Env: s.env ?? ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], ...(s.workingDir ? { WorkingDir: s.workingDir } : {}), ...(s.user ? { User: s.user } : {}) },
      rootfs: { type: "layers", diff_ids: s.layers.map(sha256) },
    }),
  );
  const layerDescriptors = blobs.map((b) => ({ mediaType: gz ? "application/vnd.oci.image.layer.v1.tar+gzip" : "application/vnd.oci.image.layer.v1.tar", digest: sha256(b), size: b.length }));
  const manifest = Buffer.from(
    JSON.stringify({ schemaVersion: 2, mediaType: "application/vnd.oci.image.manifest.v1+json", config: { mediaType: "application/vnd.oci.image.config.v1+json", digest: sha256(config), size: config.length }, layers: layerDescriptors }),
  );
  return { manifest, manifestDigest: sha256(manifest), config, configDigest: sha256(config), blobs, layerDescriptors };
}

function putBlob(dir: string, bytes: Buffer, as?: string): void {
  const p = join(dir, "blobs", "sha256");
  mkdirSync(p, { recursive: true });
  writeFileSync(join(p, (as ?? sha256(bytes)).slice(7)), bytes);
}

/** Writes (or adds to) an OCI image layout at `dir`, the image tagged `tag`. */
export function writeLayout(dir: string, img: BuiltImage, tag = "latest", extra: { index?: Buffer } = {}): void {
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, "oci-layout"), JSON.stringify({ imageLayoutVersion: "1.0.0" }));
  putBlob(dir, img.config);
  for (const b of img.blobs) putBlob(dir, b);
  putBlob(dir, img.manifest);
  if (extra.index) putBlob(dir, extra.index);
  const top = extra.index
    ? { mediaType: "application/vnd.oci.image.index.v1+json", digest: sha256(extra.index), size: extra.index.length }
    : { mediaType: "application/vnd.oci.image.manifest.v1+json", digest: img.manifestDigest, size: img.manifest.length };
  const indexPath = join(dir, "index.json");
  const prev = existsSync(indexPath) ? (JSON.parse(readFileSync(indexPath, "utf8")) as { manifests: Array<{ annotations?: Record<string, string> }> }).manifests : [];
  const manifests = [...prev.filter((m) => m.annotations?.["org.opencontainers.image.ref.name"] !== tag), { ...top, annotations: { "org.opencontainers.image.ref.name": tag } }];
  writeFileSync(indexPath, JSON.stringify({ schemaVersion: 2, manifests }));
}

/** Overwrites one stored blob with other bytes under the same name (a blob that fails its digest). */
export function replaceBlob(dir: string, digest: string, bytes: Buffer): void {
  putBlob(dir, bytes, digest);
}

/** An index naming `img` as the image of each of `platforms` ("os/arch"). */
export function indexOf(img: BuiltImage, platforms: string[]): Buffer {
  return Buffer.from(
    JSON.stringify({
      schemaVersion: 2,
      mediaType: "application/vnd.oci.image.index.v1+json",
      manifests: platforms.map((p) => ({ mediaType: "application/vnd.oci.image.manifest.v1+json", digest: img.manifestDigest, size: img.manifest.length, platform: { os: p.split("/")[0], architecture: p.split("/")[1] } })),
    }),
  );
}

export const OS_RELEASE = 'PRETTY_NAME="berth test image (busybox)"\nNAME="berth-test"\nID=berthtest\nVERSION_ID=1\n';

const BUSYBOX_TOOLS = ["sh", "ls", "cat", "echo", "sleep", "awk", "find", "stat", "id", "env", "pwd", "wc", "touch", "rm", "mkdir", "head", "grep", "kill", "test", "[", "uname", "sed", "ps", "true", "false", "hostname", "whoami", "sort", "date", "tr", "cut", "printf", "expr", "seq", "dd", "chmod", "ln", "readlink", "basename", "dirname", "xargs", "md5sum", "sha256sum", "tail", "wget", "nc", "vi", "less"];

/** The busybox-static layer: /bin/busybox and its applets, an /etc of its own, users root and app (uid 1000). */
export async function busyboxLayer(): Promise<Buffer> {
  const bin = realpathSync("/bin/busybox");
  const entries: Entry[] = [
    { name: "bin/", type: "directory" },
    { name: "bin/busybox", content: readFileSync(bin), mode: 0o755 },
    ...BUSYBOX_TOOLS.map((t): Entry => ({ name: `bin/${t}`, type: "symlink", linkname: "busybox" })),
    { name: "etc/", type: "directory" },
    { name: "etc/os-release", content: OS_RELEASE },
    { name: "etc/passwd", content: "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\n" },
    { name: "etc/group", content: "root:x:0:\napp:x:1000:\nstaff:x:50:app\n" },
    { name: "root/", type: "directory", mode: 0o700 },
    { name: "home/", type: "directory" },
    { name: "home/app/", type: "directory", uid: 1000, gid: 1000 },
    { name: "tmp/", type: "directory", mode: 0o1777 },
    { name: "usr/", type: "directory" },
    { name: "usr/bin/", type: "directory" },
    { name: "usr/lib/", type: "directory" },
    // Merged /usr, as Debian lays it out: the unpacker follows these inside the root.
    { name: "lib", type: "symlink", linkname: "usr/lib" },
    { name: "lib64", type: "symlink", linkname: "usr/lib64" },
    { name: "usr/lib64/", type: "directory" },
  ];
  return tarOf(entries);
}

/** A layer with the host's perl and the libraries it loads (perl -e works; no modules). */
export async function perlLayer(): Promise<Buffer> {
  const libs = execFileSync("ldd", ["/usr/bin/perl"], { encoding: "utf8" })
    .split("\n")
    .map((l) => /(\/\S+) \(0x/.exec(l)?.[1])
    .filter((p): p is string => p !== undefined);
  const entries: Entry[] = [{ name: "usr/bin/perl", content: readFileSync(realpathSync("/usr/bin/perl")), mode: 0o755 }];
  const dirs = new Set<string>();
  for (const lib of libs) {
    // Written through the image's /lib and /lib64 links (relative, inside the root).
    const rel = lib.replace(/^\//, "");
    const parent = rel.split("/").slice(0, -1).join("/");
    if (parent !== "lib" && parent !== "lib64" && !dirs.has(parent)) {
      dirs.add(parent);
      entries.push({ name: `${parent}/`, type: "directory" });
    }
    entries.push({ name: rel, content: readFileSync(realpathSync(lib)), mode: 0o755 });
  }
  return tarOf(entries);
}
