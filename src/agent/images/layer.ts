/** One image layer pulled: streamed through its size and digest checks into the unpacker (cache.ts, step 3). */
import { createGunzip } from "node:zlib";
import { createHash } from "node:crypto";
import { Transform } from "node:stream";
import { BerthError } from "../../core/errors.js";
import { layerCompression, type Descriptor } from "./oci.js";
import type { ImageSource } from "./source.js";
import type { Unpacker } from "./unpack.js";

/**
 * Streams one layer through its checks into the unpacker: its size against
 * the descriptor, its digest, gunzip where compressed, its uncompressed digest
 * against the config's diff_id. Any stage's failure ends the stream with that
 * stage's reason; a layer that fails a check is never used.
 */
export async function streamLayer(src: ImageSource, unpacker: Unpacker, d: Descriptor, diffId: string, what: string): Promise<void> {
  const compression = layerCompression(d);
  const blob = await src.blob(d);
  const compressed = createHash("sha256");
  const plain = createHash("sha256");
  let n = 0;
  const count = new Transform({
    transform(chunk: Buffer, _e, cb) {
      n += chunk.length;
      if (n > d.size) return cb(new BerthError("image_invalid", `image_invalid: layer ${d.digest} of ${what} is longer than its descriptor's ${d.size} bytes`));
      compressed.update(chunk);
      cb(null, chunk);
    },
  });
  const hashPlain = new Transform({
    transform(chunk: Buffer, _e, cb) {
      plain.update(chunk);
      cb(null, chunk);
    },
  });
  const gunzip = compression === "gzip" ? createGunzip() : null;
  // Any stage's failure ends the stream the unpacker reads, with that stage's reason.
  const fail = (e: Error) => hashPlain.destroy(e);
  blob.once("error", fail);
  count.once("error", fail);
  gunzip?.once("error", (e) => fail(new BerthError("image_invalid", `image_invalid: layer ${d.digest} of ${what} is not valid gzip or is cut short (${e.message})`)));
  if (gunzip) blob.pipe(count).pipe(gunzip).pipe(hashPlain);
  else blob.pipe(count).pipe(hashPlain);
  try {
    await unpacker.apply(hashPlain, d.digest);
    // The tar may end before its padding: read the rest, so the digests cover every byte.
    if (!hashPlain.readableEnded) {
      await new Promise<void>((res, rej) => {
        hashPlain.once("end", res);
        hashPlain.once("error", rej);
        hashPlain.resume();
      });
    }
  } catch (e) {
    for (const s of [blob, count, gunzip, hashPlain]) s?.destroy();
    if (e instanceof BerthError) throw e;
    throw new BerthError("image_invalid", `image_invalid: layer ${d.digest} of ${what} could not be unpacked: ${(e as Error).message}`);
  }
  if (n !== d.size) throw new BerthError("image_invalid", `image_invalid: layer ${d.digest} of ${what} is cut short: ${n} of ${d.size} bytes`);
  const got = "sha256:" + compressed.digest("hex");
  if (got !== d.digest) throw new BerthError("image_invalid", `image_invalid: layer ${d.digest} of ${what} does not match its digest (the bytes hash to ${got}); it was not used`);
  const gotPlain = "sha256:" + plain.digest("hex");
  if (gotPlain !== diffId) throw new BerthError("image_invalid", `image_invalid: layer ${d.digest} of ${what} unpacks to ${gotPlain}, not the ${diffId} its config names; it was not used`);
}
