/**
 * The OCI image format as berth reads it (OCI image spec 1.1, and Docker's
 * schema-2 manifests and manifest lists, which have the same shape): index,
 * manifest and config documents checked with zod, the platform chosen from
 * an index, and the layer media types berth can unpack. Pure.
 */
import { z } from "zod";
import { BerthError } from "../../core/errors.js";

export const MEDIA = {
  ociIndex: "application/vnd.oci.image.index.v1+json",
  ociManifest: "application/vnd.oci.image.manifest.v1+json",
  ociConfig: "application/vnd.oci.image.config.v1+json",
  dockerList: "application/vnd.docker.distribution.manifest.list.v2+json",
  dockerManifest: "application/vnd.docker.distribution.manifest.v2+json",
  dockerConfig: "application/vnd.docker.container.image.v1+json",
} as const;

/** What a registry is asked for, in order of preference. */
export const MANIFEST_ACCEPT = [MEDIA.ociIndex, MEDIA.ociManifest, MEDIA.dockerList, MEDIA.dockerManifest].join(", ");

const DIGEST = /^sha256:[a-f0-9]{64}$/;

export const descriptorSchema = z.object({
  mediaType: z.string().max(255),
  digest: z.string().regex(DIGEST, "must be sha256: and 64 lowercase hex digits (the only digest berth verifies)"),
  size: z.number().int().nonnegative(),
  platform: z.object({ os: z.string(), architecture: z.string(), variant: z.string().optional() }).passthrough().optional(),
  annotations: z.record(z.string(), z.string()).optional(),
  urls: z.array(z.string()).optional(),
});
export type Descriptor = z.infer<typeof descriptorSchema>;

export const indexSchema = z.object({
  schemaVersion: z.literal(2),
  mediaType: z.string().optional(),
  manifests: z.array(descriptorSchema).max(10_000),
});
export type ImageIndex = z.infer<typeof indexSchema>;

export const manifestSchema = z.object({
  schemaVersion: z.literal(2),
  mediaType: z.string().optional(),
  config: descriptorSchema,
  layers: z.array(descriptorSchema).max(1000),
});
export type ImageManifest = z.infer<typeof manifestSchema>;

export const configSchema = z.object({
  architecture: z.string(),
  os: z.string(),
  config: z
    .object({
      Env: z.array(z.string()).nullable().optional(),
      WorkingDir: z.string().nullable().optional(),
      User: z.string().nullable().optional(),
    })
    .passthrough()
    .nullable()
    .optional(),
  rootfs: z.object({ type: z.literal("layers"), diff_ids: z.array(z.string().regex(DIGEST)) }),
});
export type ImageConfig = z.infer<typeof configSchema>;

/** This host's platform in OCI words. */
export function hostPlatform(): { os: string; architecture: string } {
  const arch: Record<string, string> = { x64: "amd64", arm64: "arm64", arm: "arm", ppc64: "ppc64le", s390x: "s390x", riscv64: "riscv64" };
  return { os: "linux", architecture: arch[process.arch] ?? process.arch };
}

export function isIndex(mediaType: string | undefined, doc: Record<string, unknown>): boolean {
  return mediaType === MEDIA.ociIndex || mediaType === MEDIA.dockerList || (mediaType === undefined && Array.isArray(doc.manifests) && doc.config === undefined);
}

/**
 * Parses a JSON document of the image (`what` names it in errors), refusing
 * what is not JSON or not of the schema as `image_invalid`.
 */
export function parseDocument<T>(schema: z.ZodType<T>, bytes: Buffer, what: string): T {
  let raw: unknown;
  try {
    raw = JSON.parse(bytes.toString("utf8"));
  } catch {
    throw new BerthError("image_invalid", `image_invalid: ${what} is not JSON`);
  }
  const p = schema.safeParse(raw);
  if (!p.success) {
    const i = p.error.issues[0];
    throw new BerthError("image_invalid", `image_invalid: ${what} is not a valid document: ${i ? `${i.path.join(".") || "(top)"} ${i.message}` : "schema mismatch"}`);
  }
  return p.data;
}

/** The manifest of this host's platform from an index, or `image_invalid` naming the platforms there are. */
export function selectPlatform(index: ImageIndex, what: string): Descriptor {
  const want = hostPlatform();
  const manifests = index.manifests.filter((m) => m.mediaType === MEDIA.ociManifest || m.mediaType === MEDIA.dockerManifest);
  const found = manifests.find((m) => m.platform?.os === want.os && m.platform.architecture === want.architecture);
  if (found) return found;
  // An index of one manifest without a platform (a single-image layout) is that image.
  if (manifests.length === 1 && manifests[0]!.platform === undefined) return manifests[0]!;
  const offered = manifests.map((m) => (m.platform ? `${m.platform.os}/${m.platform.architecture}${m.platform.variant ? `/${m.platform.variant}` : ""}` : "unspecified")).join(", ");
  throw new BerthError("image_invalid", `image_invalid: ${what} has no image for ${want.os}/${want.architecture} (it has: ${offered || "none"}); this host runs ${want.os}/${want.architecture}`);
}

export type LayerCompression = "gzip" | "none";

/** How a layer of this media type is compressed, or `image_invalid` for what berth cannot unpack. */
export function layerCompression(d: Descriptor): LayerCompression {
  switch (d.mediaType) {
    case "application/vnd.oci.image.layer.v1.tar+gzip":
    case "application/vnd.docker.image.rootfs.diff.tar.gzip":
      return "gzip";
    case "application/vnd.oci.image.layer.v1.tar":
    case "application/vnd.docker.image.rootfs.diff.tar":
      return "none";
    case "application/vnd.oci.image.layer.v1.tar+zstd":
      throw new BerthError("image_invalid", `image_invalid: layer ${d.digest} is zstd-compressed, which berth cannot unpack; push the image with gzip layers (e.g. skopeo copy --dest-compress-format gzip)`);
    default:
      throw new BerthError("image_invalid", `image_invalid: layer ${d.digest} has media type ${d.mediaType}, which berth does not unpack (tar or tar+gzip layers only)`);
  }
}

/** Checks the config is for this host's platform. */
export function checkConfigPlatform(c: ImageConfig, what: string): void {
  const want = hostPlatform();
  if (c.os !== want.os || c.architecture !== want.architecture) {
    throw new BerthError("image_invalid", `image_invalid: ${what} is a ${c.os}/${c.architecture} image; this host runs ${want.os}/${want.architecture}`);
  }
}
