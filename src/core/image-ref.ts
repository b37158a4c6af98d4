/**
 * Image references: what a pool's machines boot (`berth pool ensure NAME
 * --image REF`, docs/images.md). Pure: parsed and checked where the pool is
 * ensured (a typo is refused before anything is stored) and again by the
 * agent that boots it.
 *
 *   oci:DIR[:TAG]            an OCI image layout directory on the agent's host
 *   docker-archive:FILE      a `docker save` archive on the agent's host
 *   dir:PATH                 a root filesystem directory on the agent's host (used as it is)
 *   REGISTRY/NAME[:TAG]      a registry, over the OCI distribution API (TAG defaults to latest)
 *   REGISTRY/NAME@sha256:HEX a registry, by digest
 *   ami:ami-…                an AMI, for pools of the aws provider
 *
 * Paths are absolute: they name files on the agent's host, not where the
 * command was typed. A registry reference names its registry (a host with a
 * dot or a port, or `localhost`): nothing is pulled from a registry the
 * reference does not name. `docker.io/NAME` is Docker Hub (its API host is
 * registry-1.docker.io; one-part names are under `library/`).
 */
import { BerthError } from "./errors.js";

export type ImageRef =
  | { kind: "oci"; dir: string; tag: string | null }
  | { kind: "docker-archive"; file: string }
  | { kind: "dir"; path: string }
  | { kind: "registry"; registry: string; repository: string; tag: string | null; digest: string | null }
  | { kind: "ami"; amiId: string };

/** Where a kind of image can boot: agents' gvisor sandboxes, or AWS instances. */
export function imageProvider(ref: ImageRef): "hosts" | "aws" {
  return ref.kind === "ami" ? "aws" : "hosts";
}

const TAG = /^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$/;
const DIGEST = /^sha256:[a-f0-9]{64}$/;
const COMPONENT = /^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$/;
const HOST = /^(?:localhost|[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?$/;
const AMI = /^ami-[0-9a-f]{8,17}$/;

function bad(ref: string, why: string): BerthError {
  return new BerthError("invalid_request", `invalid_request: image ${JSON.stringify(ref.slice(0, 200))}: ${why}; see docs/images.md`);
}

function absolutePath(ref: string, p: string, what: string): string {
  if (!p.startsWith("/")) throw bad(ref, `${what} must be an absolute path on the agent's host`);
  if (p.includes("\0") || p.split("/").includes("..")) throw bad(ref, `${what} must not contain ".." or NUL`);
  return p.length > 1 ? p.replace(/\/+$/, "") : p;
}

/** Parses and checks an image reference; throws `invalid_request` saying what is wrong. */
export function parseImageRef(input: string): ImageRef {
  const ref = input.trim();
  if (ref.length === 0 || ref.length > 1024) throw bad(ref, "give 1 to 1024 characters");
  if (ref.startsWith("oci:")) {
    const rest = ref.slice(4);
    // The tag is what follows the last ':' when it has no '/' (skopeo's spelling).
    const i = rest.lastIndexOf(":");
    const tail = i >= 0 ? rest.slice(i + 1) : "";
    if (i >= 0 && !tail.includes("/")) {
      if (!TAG.test(tail)) throw bad(ref, `tag ${JSON.stringify(tail)} is not a valid tag`);
      return { kind: "oci", dir: absolutePath(ref, rest.slice(0, i), "the layout directory"), tag: tail };
    }
    return { kind: "oci", dir: absolutePath(ref, rest, "the layout directory"), tag: null };
  }
  if (ref.startsWith("docker-archive:")) return { kind: "docker-archive", file: absolutePath(ref, ref.slice(15), "the archive") };
  if (ref.startsWith("dir:")) return { kind: "dir", path: absolutePath(ref, ref.slice(4), "the root directory") };
  if (ref.startsWith("ami:")) {
    const id = ref.slice(4);
    if (!AMI.test(id)) throw bad(ref, "an AMI id is ami- and 8 or 17 hex digits");
    return { kind: "ami", amiId: id };
  }
  if (/^[a-z][a-z0-9+.-]*:\/\//i.test(ref)) throw bad(ref, "write a registry reference without a scheme, e.g. registry.example.com/team/image:1.0");
  const slash = ref.indexOf("/");
  const first = slash > 0 ? ref.slice(0, slash) : "";
  if (slash <= 0 || !(first.includes(".") || first.includes(":") || first === "localhost") || !HOST.test(first)) {
    throw bad(ref, "a registry reference starts with its registry (REGISTRY/NAME:TAG, e.g. docker.io/library/debian:bookworm or 127.0.0.1:5000/base:1); for a local image use oci:DIR, docker-archive:FILE or dir:PATH");
  }
  let rest = ref.slice(slash + 1);
  let digest: string | null = null;
  const at = rest.indexOf("@");
  if (at >= 0) {
    digest = rest.slice(at + 1);
    if (!DIGEST.test(digest)) throw bad(ref, "a digest is sha256: and 64 lowercase hex digits");
    rest = rest.slice(0, at);
  }
  let tag: string | null = null;
  const colon = rest.lastIndexOf(":");
  if (colon >= 0) {
    tag = rest.slice(colon + 1);
    if (!TAG.test(tag)) throw bad(ref, `tag ${JSON.stringify(tag)} is not a valid tag`);
    rest = rest.slice(0, colon);
  }
  const parts = rest.split("/");
  if (rest.length === 0 || rest.length > 255 || !parts.every((p) => COMPONENT.test(p))) {
    throw bad(ref, "a repository name is lowercase letters, digits and . _ - in parts separated by /");
  }
  let registry = first;
  let repository = rest;
  if (registry === "docker.io" || registry === "index.docker.io") {
    registry = "registry-1.docker.io";
    if (parts.length === 1) repository = `library/${rest}`;
  }
  if (tag === null && digest === null) tag = "latest";
  return { kind: "registry", registry, repository, tag, digest };
}

/** The canonical spelling of a reference (what pools store and compare). */
export function formatImageRef(r: ImageRef): string {
  switch (r.kind) {
    case "oci":
      return r.tag === null ? `oci:${r.dir}` : `oci:${r.dir}:${r.tag}`;
    case "docker-archive":
      return `docker-archive:${r.file}`;
    case "dir":
      return `dir:${r.path}`;
    case "ami":
      return `ami:${r.amiId}`;
    case "registry":
      return `${r.registry}/${r.repository}${r.tag !== null ? `:${r.tag}` : ""}${r.digest !== null ? `@${r.digest}` : ""}`;
  }
}

/** The canonical form of a reference string (parse, then format). */
export function canonicalImage(input: string): string {
  return formatImageRef(parseImageRef(input));
}
