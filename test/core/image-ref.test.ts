/** Image references: each kind parsed to its canonical spelling, and each mistake refused with what to write instead. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { canonicalImage, imageProvider, parseImageRef } from "../../src/core/image-ref.js";
import { parseBytes, formatBytes } from "../../src/core/bytes.js";

test("every kind, canonical", () => {
  assert.deepEqual(parseImageRef("oci:/srv/images/base:v1"), { kind: "oci", dir: "/srv/images/base", tag: "v1" });
  assert.deepEqual(parseImageRef("oci:/srv/images/base/"), { kind: "oci", dir: "/srv/images/base", tag: null });
  assert.deepEqual(parseImageRef("docker-archive:/tmp/base.tar"), { kind: "docker-archive", file: "/tmp/base.tar" });
  assert.deepEqual(parseImageRef("dir:/srv/rootfs"), { kind: "dir", path: "/srv/rootfs" });
  assert.deepEqual(parseImageRef("ami:ami-0123456789abcdef0"), { kind: "ami", amiId: "ami-0123456789abcdef0" });
  assert.deepEqual(parseImageRef("127.0.0.1:5000/team/base:1"), { kind: "registry", registry: "127.0.0.1:5000", repository: "team/base", tag: "1", digest: null });
  assert.deepEqual(parseImageRef("registry.example.com/base"), { kind: "registry", registry: "registry.example.com", repository: "base", tag: "latest", digest: null });
  const d = "sha256:" + "a".repeat(64);
  assert.deepEqual(parseImageRef(`localhost/base@${d}`), { kind: "registry", registry: "localhost", repository: "base", tag: null, digest: d });
  assert.equal(canonicalImage("docker.io/debian:bookworm"), "registry-1.docker.io/library/debian:bookworm");
  assert.equal(canonicalImage(" oci:/x:t "), "oci:/x:t");
  assert.equal(imageProvider(parseImageRef("ami:ami-0123456789abcdef0")), "aws");
  assert.equal(imageProvider(parseImageRef("dir:/x")), "hosts");
});

test("mistakes are refused, saying what to write", () => {
  const bad: Array<[string, RegExp]> = [
    ["oci:relative/dir", /must be an absolute path on the agent's host/],
    ["dir:/srv/../etc", /must not contain "\.\."/],
    ["debian:bookworm", /starts with its registry/],
    ["https://registry.example.com/base:1", /without a scheme/],
    ["registry.example.com/Base:1", /lowercase/],
    ["registry.example.com/base@sha256:abc", /64 lowercase hex digits/],
    ["ami:i-0123", /ami- and 8 or 17 hex digits/],
    ["", /1 to 1024 characters/],
  ];
  for (const [ref, re] of bad) assert.throws(() => parseImageRef(ref), (e: Error) => /^invalid_request: image /.test(e.message) && re.test(e.message), ref);
});

test("sizes as people write them", () => {
  assert.equal(parseBytes("20G", "x"), 20 * 2 ** 30);
  assert.equal(parseBytes("512MiB", "x"), 512 * 2 ** 20);
  assert.equal(parseBytes("1.5g", "x"), 1.5 * 2 ** 30);
  assert.equal(parseBytes("1000", "x"), 1000);
  assert.throws(() => parseBytes("12X", "--image-cache-max"), /--image-cache-max "12X" is not a size/);
  assert.throws(() => parseBytes("0", "x"), /positive/);
  assert.equal(formatBytes(10 * 2 ** 30), "10.0 GiB");
});
