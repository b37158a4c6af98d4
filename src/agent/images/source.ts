/**
 * Where an image's documents and blobs come from. Every source answers the
 * same two questions — the manifest of this host's platform, and a blob by
 * its descriptor — so the cache (cache.ts) verifies and unpacks one way
 * whatever the image came from. Blobs are verified by the caller against
 * their descriptor's digest and size; documents are verified here when they
 * are read.
 */
import { createHash } from "node:crypto";
import type { Readable } from "node:stream";
import { BerthError } from "../../core/errors.js";
import { indexSchema, isIndex, manifestSchema, parseDocument, selectPlatform, type Descriptor, type ImageManifest } from "./oci.js";

export interface ResolvedManifest {
  manifest: ImageManifest;
  /** sha256 of the manifest's bytes, or null where the image has none (a legacy `docker save` archive). */
  digest: string | null;
}

export interface ImageSource {
  /** Names the image in errors and logs. */
  readonly what: string;
  manifest(): Promise<ResolvedManifest>;
  /** A blob's bytes as stored (compressed layers compressed); verified by the caller. */
  blob(d: Descriptor): Promise<Readable>;
  /** A small blob (a config) read whole and verified against `d`. */
  document(d: Descriptor, max: number): Promise<Buffer>;
  /** Frees what the source holds (temporary files). */
  close(): Promise<void>;
}

export function sha256(b: Buffer): string {
  return "sha256:" + createHash("sha256").update(b).digest("hex");
}

/** Checks a whole document against its descriptor: size and digest. */
export function verifyDocument(bytes: Buffer, d: Pick<Descriptor, "digest" | "size">, what: string): Buffer {
  if (bytes.length !== d.size) throw new BerthError("image_invalid", `image_invalid: ${what} ${d.digest} is ${bytes.length} bytes, its descriptor says ${d.size}`);
  const got = sha256(bytes);
  if (got !== d.digest) throw new BerthError("image_invalid", `image_invalid: ${what} ${d.digest} does not match its digest (the bytes hash to ${got})`);
  return bytes;
}

/**
 * From a manifest-or-index document to the manifest of this host's
 * platform: `fetch` reads a document by descriptor (already verified).
 */
export async function manifestOf(bytes: Buffer, mediaType: string | undefined, what: string, fetch: (d: Descriptor) => Promise<{ bytes: Buffer; mediaType: string | undefined }>): Promise<ResolvedManifest> {
  // The digest of what was asked for (the index, for a multi-platform image): what a reference by digest names.
  const top = sha256(bytes);
  let doc = bytes;
  let type = mediaType;
  for (let depth = 0; depth < 3; depth++) {
    let raw: Record<string, unknown>;
    try {
      raw = JSON.parse(doc.toString("utf8")) as Record<string, unknown>;
    } catch {
      throw new BerthError("image_invalid", `image_invalid: the manifest of ${what} is not JSON`);
    }
    if (raw === null || typeof raw !== "object") throw new BerthError("image_invalid", `image_invalid: the manifest of ${what} is not a JSON object`);
    const declared = type ?? (typeof raw.mediaType === "string" ? raw.mediaType : undefined);
    if (!isIndex(declared, raw)) return { manifest: parseDocument(manifestSchema, doc, `the manifest of ${what}`), digest: top };
    const chosen = selectPlatform(parseDocument(indexSchema, doc, `the index of ${what}`), what);
    const next = await fetch(chosen);
    doc = next.bytes;
    type = next.mediaType ?? chosen.mediaType;
  }
  throw new BerthError("image_invalid", `image_invalid: ${what} nests indexes more than 3 deep`);
}
