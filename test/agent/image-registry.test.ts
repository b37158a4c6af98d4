/**
 * Pulling from a real registry (Debian's docker-registry on loopback) into
 * the agent's image cache: anonymous, basic and token authentication with
 * credentials from a 0600 file, pull once and then from the cache (by tag,
 * and by digest with the registry gone), and each bad input refused with a
 * clear error and nothing left in the cache: an unreachable registry,
 * missing or wrong credentials, a blob damaged or cut short on the way (a
 * proxy in front of the registry), an index without linux/amd64, a layer
 * declared over the cache limit; a pull killed with SIGKILL between two
 * layers leaves only a temporary directory, which the next start removes.
 */
import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import { chmodSync, existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ImageCache } from "../../src/agent/images/cache.js";
import { silentLog } from "../../src/agent/log.js";
import { BerthError, type ErrorCode } from "../../src/core/errors.js";
import { spawn } from "node:child_process";
import { buildImage, busyboxLayer, indexOf, OS_RELEASE, sha256, tarOf, writeLayout } from "../helpers/oci-images.js";
import { registryAvailable, startBlobProxy, startRegistry, type TestRegistry } from "../helpers/registry.js";

const missing = registryAvailable();
let base: string;
let layoutDir: string;
let img: ReturnType<typeof buildImage>;
before(async () => {
  base = mkdtempSync(join(tmpdir(), "berth-reg-"));
  img = buildImage({ layers: [await busyboxLayer()], env: ["PATH=/bin", "FROM=registry"] });
  layoutDir = join(base, "layout");
  writeLayout(layoutDir, img, "v1");
});
after(() => rmSync(base, { recursive: true, force: true }));

let n = 0;
function cacheWith(registry: { authFile?: string } = {}, maxBytes = 1 << 30): ImageCache {
  return new ImageCache({ stateDir: join(base, `agent-${n++}`), maxBytes, registry: { ...registry, timeoutMs: 10_000 }, inUse: () => new Map(), log: silentLog });
}

function authFile(reg: TestRegistry, password = reg.password, mode = 0o600): string {
  const f = join(base, `auth-${n++}.json`);
  writeFileSync(f, JSON.stringify({ auths: { [reg.host]: { auth: Buffer.from(`${reg.user}:${password}`).toString("base64") } } }), { mode });
  chmodSync(f, mode);
  return f;
}

async function refused(c: ImageCache, ref: string, code: ErrorCode, message: RegExp): Promise<void> {
  await assert.rejects(c.ensure(ref), (e: unknown) => {
    assert.ok(e instanceof BerthError, String(e));
    assert.equal(e.code, code, e.message);
    assert.match(e.message, message);
    return true;
  });
  assert.deepEqual(existsSync(c.dir) ? readdirSync(c.dir) : [], [], "nothing half-unpacked is left in the cache");
}

describe("pulling from a registry", { skip: missing ?? false, timeout: 180_000 }, () => {
  test("anonymous: pulled and verified once, then from the cache; by digest even with the registry gone", async () => {
    const reg = await startRegistry(join(base, "reg-anon"));
    try {
      await reg.push(layoutDir, "v1", "team/base:1");
      const c = cacheWith();
      const boot = await c.ensure(`${reg.host}/team/base:1`);
      assert.equal(boot.id, img.configDigest.slice(7));
      assert.equal(boot.env.FROM, "registry");
      const { readFileSync } = await import("node:fs");
      assert.equal(readFileSync(join(boot.rootfs, "etc/os-release"), "utf8"), OS_RELEASE);
      assert.match(boot.digest ?? "", /^sha256:[a-f0-9]{64}$/);
      await reg.close();
      // Cached: the same tag and the digest it was pulled by need no registry.
      assert.equal((await c.ensure(`${reg.host}/team/base:1`)).id, boot.id);
      assert.equal((await c.ensure(`${reg.host}/team/base@${boot.digest}`)).id, boot.id);
      // An unreachable registry for an image not cached: a clear refusal, nothing kept.
      await refused(cacheWith(), `${reg.host}/team/base:1`, "image_unavailable", new RegExp(`registry ${reg.host} could not be reached \\(ECONNREFUSED\\)`));
    } finally {
      await reg.close();
    }
  });

  test("basic authentication: credentials from a 0600 file; none, wrong ones, or a file others can read are refused", async () => {
    const reg = await startRegistry(join(base, "reg-basic"), "basic");
    try {
      await reg.push(layoutDir, "v1", "team/base:1");
      const ref = `${reg.host}/team/base:1`;
      assert.equal((await cacheWith({ authFile: authFile(reg) }).ensure(ref)).id, img.configDigest.slice(7));
      await refused(cacheWith(), ref, "image_unavailable", /asks for credentials and the agent has none for it/);
      await refused(cacheWith({ authFile: authFile(reg, "wrong") }), ref, "image_unavailable", /refused the pull of .* \(401/);
      await refused(cacheWith({ authFile: authFile(reg, reg.password, 0o644) }), ref, "image_unavailable", /is readable by group or others \(mode 644\); chmod 600 it/);
    } finally {
      await reg.close();
    }
  });

  test("token authentication: a token from the registry's realm, fetched with the file's credentials", async () => {
    const reg = await startRegistry(join(base, "reg-token"), "token");
    try {
      await reg.push(layoutDir, "v1", "team/base:1");
      const before = reg.tokenRequests;
      const boot = await cacheWith({ authFile: authFile(reg) }).ensure(`${reg.host}/team/base:1`);
      assert.equal(boot.id, img.configDigest.slice(7));
      assert.ok(reg.tokenRequests > before, "the token service was asked");
      await refused(cacheWith(), `${reg.host}/team/base:1`, "image_unavailable", /token service of registry .* refused an anonymous pull of team\/base \(401\)/);
      await refused(cacheWith({ authFile: authFile(reg, "wrong") }), `${reg.host}/team/base:1`, "image_unavailable", /refused the agent's credentials/);
    } finally {
      await reg.close();
    }
  });

  test("damaged on the way: a flipped byte and a body cut short are refused; a tag the registry lacks too", async () => {
    const reg = await startRegistry(join(base, "reg-proxy"));
    let how: "none" | "flip" | "truncate" = "flip";
    const proxy = await startBlobProxy(reg.host, () => how);
    try {
      await reg.push(layoutDir, "v1", "team/base:1");
      const ref = `${proxy.host}/team/base:1`;
      await refused(cacheWith(), ref, "image_invalid", /(does not match its digest|not valid gzip)/);
      how = "truncate";
      await assert.rejects(cacheWith().ensure(ref), (e: unknown) => e instanceof BerthError && /cut short|broke off|not valid gzip/.test(e.message));
      how = "none";
      assert.equal((await cacheWith().ensure(ref)).id, img.configDigest.slice(7), "the same pull through an honest proxy works");
      await refused(cacheWith(), `${reg.host}/team/base:nope`, "image_invalid", /has no manifest team\/base:nope \(404 MANIFEST_UNKNOWN\)/);
    } finally {
      await proxy.close();
      await reg.close();
    }
  });

  test("a pull killed with SIGKILL while its second layer is on the way leaves only a .tmp-* directory, which the next start removes", async () => {
    const reg = await startRegistry(join(base, "reg-kill"));
    const two = buildImage({ layers: [await busyboxLayer(), await tarOf([{ name: "etc/second", content: "2" }])] });
    const twoDir = join(base, "two-layout");
    writeLayout(twoDir, two, "v1");
    await reg.push(twoDir, "v1", "team/two:1");
    // Blob GETs in order: the config, the first layer, the second layer (held until the end).
    let blobs = 0;
    let atSecond!: () => void;
    const reached = new Promise<void>((r) => (atSecond = r));
    let release!: () => void;
    const released = new Promise<void>((r) => (release = r));
    const proxy = await startBlobProxy(reg.host, () => "none", async () => {
      if (++blobs < 3) return;
      atSecond();
      await released;
    });
    const stateDir = join(base, `agent-${n++}`);
    const cacheModule = new URL("../../src/agent/images/cache.js", import.meta.url).href;
    const logModule = new URL("../../src/agent/log.js", import.meta.url).href;
    const script = `import { ImageCache } from ${JSON.stringify(cacheModule)}; import { silentLog } from ${JSON.stringify(logModule)};
await new ImageCache({ stateDir: ${JSON.stringify(stateDir)}, maxBytes: 1 << 30, inUse: () => new Map(), log: silentLog }).ensure(${JSON.stringify(`${proxy.host}/team/two:1`)});`;
    const child = spawn(process.execPath, ["--input-type=module", "-e", script], { stdio: ["ignore", "inherit", "inherit"] });
    try {
      await reached;
      const images = join(stateDir, "images");
      const tmp = readdirSync(images);
      assert.equal(tmp.length, 1, String(tmp));
      assert.match(tmp[0]!, /^\.tmp-/);
      assert.ok(existsSync(join(images, tmp[0]!, "rootfs", "bin", "busybox")), "the first layer was unpacked when the pull was killed");
      const exited = new Promise((r) => child.once("exit", r));
      child.kill("SIGKILL");
      await exited;
      // The next start: the half-unpacked directory goes, nothing of it is listed or booted.
      const c = new ImageCache({ stateDir, maxBytes: 1 << 30, inUse: () => new Map(), log: silentLog });
      assert.deepEqual(c.list(), []);
      assert.equal(c.sweep(), 1);
      assert.deepEqual(readdirSync(images), []);
      const boot = await c.ensure(`${reg.host}/team/two:1`);
      assert.equal(boot.id, two.configDigest.slice(7));
      assert.deepEqual(readdirSync(images), [boot.id]);
    } finally {
      child.kill("SIGKILL");
      release();
      await proxy.close();
      await reg.close();
    }
  });

  test("an index without linux/amd64, and a layer declared over the cache limit, pushed to the registry", async () => {
    const reg = await startRegistry(join(base, "reg-bad"), "basic");
    try {
      const arm = buildImage({ layers: [await busyboxLayer()], architecture: "arm64" });
      const armDir = join(base, "arm-layout");
      writeLayout(armDir, arm, "arm");
      await reg.push(armDir, "arm", "team/multi:arm");
      const index = indexOf(arm, ["linux/arm64", "linux/riscv64"]);
      assert.equal(await reg.putManifest("team/multi", "all", index, "application/vnd.oci.image.index.v1+json"), 201);
      await refused(cacheWith({ authFile: authFile(reg) }), `${reg.host}/team/multi:all`, "image_invalid", /has no image for linux\/amd64 \(it has: linux\/arm64, linux\/riscv64\)/);

      await reg.push(layoutDir, "v1", "team/huge:real");
      const huge = JSON.parse(img.manifest.toString()) as { layers: Array<{ size: number }> };
      huge.layers[0]!.size = 10 * 2 ** 30;
      const body = Buffer.from(JSON.stringify(huge));
      const status = await reg.putManifest("team/huge", "big", body, "application/vnd.oci.image.manifest.v1+json");
      assert.equal(status, 201, "the registry stores a manifest whose layer claims 10 GiB");
      await refused(cacheWith({ authFile: authFile(reg) }, 1 << 30), `${reg.host}/team/huge:big`, "image_too_large", /is 10\.0 GiB, over this agent's image cache limit \(--image-cache-max 1\.0 GiB\); nothing was downloaded/);
      assert.match(sha256(body), /^sha256:/);
    } finally {
      await reg.close();
    }
  });
});
