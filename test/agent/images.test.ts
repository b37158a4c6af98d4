/**
 * The agent's image cache without a sandbox: images the tests make (OCI
 * layouts written here, a `docker save` archive made by skopeo) unpacked
 * into a real cache directory, and every bad input refused with a clear
 * error and nothing left in the cache:
 *   - layers stacked as a runtime does: whiteouts (file, opaque directory),
 *     hard links, symbolic links followed inside the root (merged /usr),
 *     ownership, modes with setuid and sticky bits, modification times;
 *   - refused: `../` paths, writing through an absolute symbolic link or a
 *     relative one climbing out, hard links out, a blob that fails its
 *     digest, a truncated blob, a config that fails its digest, an index
 *     without linux/amd64, a layer declared over the cache limit (nothing
 *     read), an image that unpacks over it, an image without /bin/sh;
 *   - the image's Env, WorkingDir and User resolved; pulled once per
 *     digest; eviction by size; removal refused while a machine uses it.
 */
import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import { existsSync, lstatSync, mkdtempSync, readFileSync, readdirSync, readlinkSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ImageCache } from "../../src/agent/images/cache.js";
import { silentLog } from "../../src/agent/log.js";
import { BerthError, type ErrorCode } from "../../src/core/errors.js";
import { buildImage, busyboxLayer, indexOf, OS_RELEASE, replaceBlob, sha256, tarOf, writeLayout, type Entry } from "../helpers/oci-images.js";

const root = process.getuid?.() === 0;
let base: string;
let busybox: Buffer;
before(async () => {
  base = mkdtempSync(join(tmpdir(), "berth-images-"));
  busybox = await busyboxLayer();
});
after(() => rmSync(base, { recursive: true, force: true }));

let n = 0;
function cacheIn(o: { maxBytes?: number; inUse?: Map<string, number> } = {}): ImageCache {
  return new ImageCache({ stateDir: join(base, `agent-${n++}`), maxBytes: o.maxBytes ?? 1 << 30, inUse: () => o.inUse ?? new Map(), log: silentLog });
}

function layout(spec: Parameters<typeof buildImage>[0], tag = "latest"): { dir: string; img: ReturnType<typeof buildImage> } {
  const dir = join(base, `layout-${n++}`);
  const img = buildImage(spec);
  writeLayout(dir, img, tag);
  return { dir, img };
}

/** The cache holds nothing but whole images: no temporary directory, no other id. */
function cacheEntries(c: ImageCache): string[] {
  return existsSync(c.dir) ? readdirSync(c.dir) : [];
}

async function refused(c: ImageCache, ref: string, code: ErrorCode, message: RegExp): Promise<void> {
  await assert.rejects(c.ensure(ref), (e: unknown) => {
    assert.ok(e instanceof BerthError, String(e));
    assert.equal(e.code, code, e.message);
    assert.match(e.message, message);
    return true;
  });
  assert.deepEqual(cacheEntries(c), [], "nothing half-unpacked is left in the cache");
}

describe("image layers, stacked", () => {
  test("whiteouts, opaque directories, hard links, links followed inside the root, ownership, modes, times", async () => {
    const when = new Date(1_600_000_000_000);
    const upper = await tarOf([
      { name: "etc/gone", content: "x" },
      { name: "etc/.wh.gone" }, // a whiteout in the same layer as the file it names removes nothing of this layer
      { name: "etc/.wh.hostname" },
      { name: "var/cache/", type: "directory" },
      { name: "var/cache/.wh..wh..opq" },
      { name: "var/cache/new", content: "fresh" },
      { name: "lib/x86_64-linux-gnu/libdemo.so", content: "through lib -> usr/lib", mode: 0o755 },
      { name: "usr/bin/hard", type: "link", linkname: "bin/busybox" },
      { name: "usr/bin/suid", content: "s", mode: 0o4755, uid: 1000, gid: 50, mtime: when },
      { name: "shared/", type: "directory", mode: 0o1777, uid: 1000, gid: 1000, mtime: when },
      { name: "dev/null", type: "character-device" },
      { name: "etc/alternatives/awk", type: "symlink", linkname: "/bin/busybox" },
    ]);
    const lower = await tarOf([
      { name: "etc/", type: "directory" },
      { name: "etc/hostname", content: "lower" },
      { name: "var/", type: "directory" },
      { name: "var/cache/", type: "directory" },
      { name: "var/cache/old", content: "stale" },
      { name: "var/cache/olddir/", type: "directory" },
      { name: "var/cache/olddir/f", content: "stale" },
    ]);
    const { dir, img } = layout({ layers: [busybox, lower, upper] });
    const c = cacheIn();
    const boot = await c.ensure(`oci:${dir}`);
    assert.equal(boot.id, img.configDigest.slice(7));
    assert.equal(boot.digest, img.manifestDigest);
    const r = boot.rootfs;
    assert.equal(readFileSync(join(r, "etc/os-release"), "utf8"), OS_RELEASE);
    assert.equal(existsSync(join(r, "etc/hostname")), false, "whited out");
    assert.equal(readFileSync(join(r, "etc/gone"), "utf8"), "x", "a whiteout never removes its own layer's file");
    assert.deepEqual(readdirSync(join(r, "var/cache")).sort(), ["new"], "opaque: the lower layer's entries are gone");
    assert.equal(readFileSync(join(r, "usr/lib/x86_64-linux-gnu/libdemo.so"), "utf8"), "through lib -> usr/lib");
    assert.equal(lstatSync(join(r, "lib")).isSymbolicLink(), true, "the link stays a link");
    assert.equal(statSync(join(r, "usr/bin/hard")).ino, statSync(join(r, "bin/busybox")).ino, "hard link");
    assert.equal(statSync(join(r, "usr/bin/suid")).mode & 0o7777, 0o4755);
    assert.equal(statSync(join(r, "shared")).mode & 0o7777, 0o1777);
    assert.equal(statSync(join(r, "usr/bin/suid")).mtimeMs, when.getTime());
    assert.equal(statSync(join(r, "shared")).mtimeMs, when.getTime(), "directory times are applied last");
    if (root) {
      assert.equal(statSync(join(r, "usr/bin/suid")).uid, 1000);
      assert.equal(statSync(join(r, "usr/bin/suid")).gid, 50);
      assert.equal(statSync(join(r, "home/app")).uid, 1000);
    }
    assert.equal(existsSync(join(r, "dev/null")), false, "device nodes are skipped");
    assert.equal(readlinkSync(join(r, "etc/alternatives/awk")), "/bin/busybox", "an absolute link is created as it is, never followed");
    assert.deepEqual(cacheEntries(c), [boot.id]);
  });
});

describe("bad layers are refused whole", () => {
  const cases: Array<{ name: string; entries: Entry[]; message: RegExp }> = [
    { name: "a ../ path", entries: [{ name: "../../etc/cron.d/evil", content: "x" }], message: /climbs out of the image root/ },
    { name: "a ../ inside the path", entries: [{ name: "usr/../../evil", content: "x" }], message: /climbs out of the image root/ },
    {
      name: "writing through an absolute symbolic link",
      entries: [{ name: "hostetc", type: "symlink", linkname: "/etc" }, { name: "hostetc/berth-escape", content: "x" }],
      message: /goes through symbolic link hostetc -> \/etc, which points outside the image root/,
    },
    {
      name: "writing through a relative link that climbs out",
      entries: [{ name: "usr/up", type: "symlink", linkname: "../../.." }, { name: "usr/up/berth-escape", content: "x" }],
      message: /goes through symbolic link usr\/up -> \.\.\/\.\.\/\.\., which points outside the image root/,
    },
    { name: "a hard link out", entries: [{ name: "passwd", type: "link", linkname: "../../../etc/passwd" }], message: /climbs out of the image root/ },
    { name: "a hard link through an absolute link", entries: [{ name: "e", type: "symlink", linkname: "/etc" }, { name: "p", type: "link", linkname: "e/passwd" }], message: /points outside the image root/ },
  ];
  for (const k of cases) {
    test(k.name, async () => {
      const { dir } = layout({ layers: [busybox, await tarOf(k.entries)] });
      const c = cacheIn();
      await refused(c, `oci:${dir}`, "image_invalid", k.message);
      assert.equal(existsSync("/etc/cron.d/evil") || existsSync("/etc/berth-escape") || existsSync(join(base, "berth-escape")), false, "nothing was written outside");
    });
  }
});

describe("digests, sizes, platforms", () => {
  test("a blob whose bytes do not match its digest", async () => {
    const { dir, img } = layout({ layers: [busybox] });
    const bad = Buffer.from(img.blobs[0]!);
    bad[bad.length - 20] = bad[bad.length - 20]! ^ 0xff;
    replaceBlob(dir, img.layerDescriptors[0]!.digest, bad);
    await refused(cacheIn(), `oci:${dir}`, "image_invalid", /layer sha256:[a-f0-9]{64} of oci:.* (does not match its digest|is not valid gzip)/);
  });

  test("a truncated blob", async () => {
    const { dir, img } = layout({ layers: [busybox] });
    replaceBlob(dir, img.layerDescriptors[0]!.digest, img.blobs[0]!.subarray(0, 5000));
    await refused(cacheIn(), `oci:${dir}`, "image_invalid", /is not valid gzip or is cut short|is cut short: 5000 of/);
  });

  test("an uncompressed layer whose content is not what the config's diff_id says", async () => {
    const other = await tarOf([{ name: "x", content: "y" }]);
    const img = buildImage({ layers: [busybox], gzip: false });
    // Same manifest and digests, but the config names another diff_id.
    const dir = join(base, `layout-${n++}`);
    const cfg = JSON.parse(img.config.toString()) as { rootfs: { diff_ids: string[] } };
    cfg.rootfs.diff_ids = [sha256(other)];
    const config = Buffer.from(JSON.stringify(cfg));
    const manifest = Buffer.from(JSON.stringify({ ...JSON.parse(img.manifest.toString()), config: { mediaType: "application/vnd.oci.image.config.v1+json", digest: sha256(config), size: config.length } }));
    writeLayout(dir, { ...img, config, configDigest: sha256(config), manifest, manifestDigest: sha256(manifest) });
    await refused(cacheIn(), `oci:${dir}`, "image_invalid", /unpacks to sha256:[a-f0-9]{64}, not the sha256:[a-f0-9]{64} its config names/);
  });

  test("a config that fails its digest", async () => {
    const { dir, img } = layout({ layers: [busybox] });
    replaceBlob(dir, img.configDigest, Buffer.from(img.config.toString().replace("amd64", "AMD64")));
    await refused(cacheIn(), `oci:${dir}`, "image_invalid", /config of oci:.* does not match its digest/);
  });

  test("an index without linux/amd64", async () => {
    const img = buildImage({ layers: [busybox], architecture: "arm64" });
    const dir = join(base, `layout-${n++}`);
    writeLayout(dir, img, "latest", { index: indexOf(img, ["linux/arm64", "linux/s390x"]) });
    await refused(cacheIn(), `oci:${dir}`, "image_invalid", /has no image for linux\/amd64 \(it has: linux\/arm64, linux\/s390x\)/);
  });

  test("a layer declared over the cache limit is refused before a byte of it is read", async () => {
    const img = buildImage({ layers: [busybox] });
    const huge = { ...img.layerDescriptors[0]!, size: 10 * 2 ** 30 };
    const manifest = Buffer.from(JSON.stringify({ ...JSON.parse(img.manifest.toString()), layers: [huge] }));
    const dir = join(base, `layout-${n++}`);
    writeLayout(dir, { ...img, manifest, manifestDigest: sha256(manifest), blobs: [] });
    await refused(cacheIn({ maxBytes: 1 << 30 }), `oci:${dir}`, "image_too_large", /layer sha256:[a-f0-9]{64} of oci:.* is 10\.0 GiB, over this agent's image cache limit \(--image-cache-max 1\.0 GiB\); nothing was downloaded/);
  });

  test("an image that unpacks larger than the cache limit is refused while unpacking", async () => {
    // 3 MiB of zeros compress to a few KiB: the declared sizes pass, the unpacked bytes do not.
    const bomb = await tarOf([{ name: "zeros", content: Buffer.alloc(3 << 20) }]);
    const { dir } = layout({ layers: [busybox, bomb] });
    await refused(cacheIn({ maxBytes: 3 << 20 }), `oci:${dir}`, "image_too_large", /unpacks to more than 3\.0 MiB/);
  });

  test("an image without /bin/sh", async () => {
    const { dir } = layout({ layers: [await tarOf([{ name: "hello", content: "x" }])] });
    await refused(cacheIn(), `oci:${dir}`, "image_invalid", /has no \/bin\/sh/);
  });

  test("a tag the layout does not have; a directory that is not a layout", async () => {
    const { dir } = layout({ layers: [busybox] }, "v1");
    await refused(cacheIn(), `oci:${dir}:v2`, "image_invalid", /has no image tagged v2 \(tags: v1\)/);
    await refused(cacheIn(), `oci:${base}`, "image_invalid", /is not an OCI image layout directory/);
  });
});

describe("what the image says, and the cache", () => {
  test("Env, WorkingDir and User resolved against the image's own files", async () => {
    const { dir } = layout({ layers: [busybox], env: ["PATH=/bin:/usr/bin", "GREETING=hello from the image"], workingDir: "/srv/app", user: "app" });
    const boot = await cacheIn().ensure(`oci:${dir}`);
    assert.deepEqual(boot.env, { PATH: "/bin:/usr/bin", GREETING: "hello from the image" });
    assert.equal(boot.workingDir, "/srv/app");
    assert.ok(statSync(join(boot.rootfs, "srv/app")).isDirectory(), "the working directory is made when the image lacks it");
    assert.deepEqual(boot.user, { uid: 1000, gid: 1000, additionalGids: [50], name: "app", home: "/home/app" });
    assert.equal(boot.shell, "/bin/sh");
    const { dir: d2 } = layout({ layers: [busybox], user: "nobody" });
    await refused(cacheIn(), `oci:${d2}`, "image_invalid", /runs as user nobody, which its \/etc\/passwd does not name/);
  });

  test("pulled once per digest; a changed layout is read again; eviction by size spares what machines use", async () => {
    const small = await tarOf([{ name: "a", content: Buffer.alloc(100_000, 1) }]);
    const a = layout({ layers: [busybox, small] });
    const b = layout({ layers: [busybox, await tarOf([{ name: "b", content: Buffer.alloc(100_000, 2) }])] });
    const inUse = new Map<string, number>();
    const size = busybox.length + 110_000;
    // Room for one image and a half: each pull evicts the other if no machine uses it.
    const c = cacheIn({ maxBytes: Math.floor(size * 1.5), inUse });
    const first = await c.ensure(`oci:${a.dir}`);
    const again = await c.ensure(`oci:${a.dir}`);
    assert.equal(again.id, first.id);
    assert.equal(c.list().length, 1);
    inUse.set(first.id!, 1);
    await c.ensure(`oci:${b.dir}`);
    assert.deepEqual(c.list().map((i) => i.id).sort(), [first.id, b.img.configDigest.slice(7)].sort(), "an image in use is never evicted");
    assert.throws(() => c.remove(first.id!), /conflict: image [a-f0-9]{12} is used by 1 machine/);
    inUse.clear();
    await c.ensure(`oci:${a.dir}`);
    assert.deepEqual(c.list().map((i) => i.id), [first.id], "b was least recently used and unused: evicted");
    // The same tag written again with another image: read again, not taken from the cache.
    const a2 = buildImage({ layers: [busybox, await tarOf([{ name: "a", content: Buffer.alloc(100_000, 3) }])] });
    writeLayout(a.dir, a2, "latest");
    const changed = await c.ensure(`oci:${a.dir}`);
    assert.equal(changed.id, a2.configDigest.slice(7));
    assert.deepEqual(c.list().map((i) => i.id), [changed.id], "the old one, unused, made room");
    const sz = c.list()[0]!.size;
    assert.deepEqual(c.remove(changed.id!.slice(0, 12)), { id: changed.id, size: sz });
    assert.deepEqual(cacheEntries(c), []);
  });

  const skopeo = spawnSync("skopeo", ["--version"]).status === 0;
  test("a docker save archive (made by skopeo from a layout) gives the same image id", { skip: skopeo ? false : "skopeo is not installed" }, async () => {
    const { dir, img } = layout({ layers: [busybox], env: ["PATH=/bin", "FROM=archive"] });
    const archive = join(base, `image-${n++}.tar`);
    execFileSync("skopeo", ["copy", "--quiet", `oci:${dir}:latest`, `docker-archive:${archive}:berth/test:1`]);
    const c = cacheIn();
    const boot = await c.ensure(`docker-archive:${archive}`);
    assert.equal(boot.id, img.configDigest.slice(7));
    assert.equal(boot.env.FROM, "archive");
    assert.equal(readFileSync(join(boot.rootfs, "etc/os-release"), "utf8"), OS_RELEASE);
    await refused(cacheIn(), `docker-archive:${join(base, "missing.tar")}`, "image_invalid", /does not exist on this host/);
  });
});
