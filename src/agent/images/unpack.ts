/**
 * Applying image layers (tar streams) to a root filesystem directory, the
 * way a container runtime stacks them, without ever letting a layer write
 * outside that directory:
 *
 *   - entry paths are taken relative to the root; one with a `..` component
 *     is refused (`image_invalid`), whatever it would resolve to;
 *   - the directories on the way to an entry are walked one component at a
 *     time with lstat, never by the kernel: a symbolic link on the way is
 *     followed only when its target stays inside the root read as a
 *     relative path (`lib -> usr/lib`); an absolute target, or a relative
 *     one climbing above the root, is refused — a layer can create such a
 *     link (the machine reads it inside its own root), never write through it;
 *   - files are created fresh (O_CREAT|O_EXCL|O_NOFOLLOW after removing what
 *     was there), so an existing symbolic link is replaced, never followed;
 *   - hard links name a target inside the root by the same rules (not a directory);
 *   - whiteouts: `.wh.NAME` removes NAME of the layers below, `.wh..wh..opq`
 *     empties its directory of what the layers below put there;
 *   - ownership (as root), modes including setuid/setgid/sticky, and
 *     modification times are kept; device nodes and FIFOs are skipped
 *     (counted; a sandbox gets its own /dev), as are extended attributes.
 *
 * Every byte written is counted against a budget (the agent's image cache
 * limit): an image that unpacks larger is refused while unpacking. The
 * caller unpacks into a private temporary directory and removes it on any
 * error, so a refused layer leaves nothing behind.
 */
import { closeSync, constants, fchmodSync, fchownSync, futimesSync, lchownSync, linkSync, lstatSync, lutimesSync, mkdirSync, openSync, readdirSync, readlinkSync, rmSync, symlinkSync, utimesSync, writeSync, chmodSync } from "node:fs";
import { join } from "node:path";
import type { Readable } from "node:stream";
import type { Stats } from "node:fs";
import { extract as tarExtract, type Header } from "tar-stream";
import { BerthError } from "../../core/errors.js";
import { formatBytes } from "../../core/bytes.js";

export interface UnpackBudget {
  /** The most bytes the whole image may take. */
  max: number;
  /** Bytes taken so far (file contents, plus 512 per entry). */
  used: number;
}

export interface LayerStats {
  entries: number;
  files: number;
  bytes: number;
  /** Device nodes and FIFOs (a sandbox has its own /dev). */
  skipped: number;
}

/** One entry's content as tar-stream hands it over. */
interface EntryBody extends AsyncIterable<unknown> {
  resume(): unknown;
}

/** State kept across the layers of one image. */
export class Unpacker {
  /** Directory modification times, applied last (adding entries changes them). */
  private readonly dirTimes = new Map<string, Date>();
  private readonly asRoot = process.getuid?.() === 0;

  constructor(
    readonly root: string,
    readonly budget: UnpackBudget,
    /** Names the image in errors. */
    readonly what: string,
  ) {}

  /** Applies one layer (an uncompressed tar stream). Rejects with `image_invalid` or `image_too_large`. */
  async apply(tar: Readable, layer: string): Promise<LayerStats> {
    const stats: LayerStats = { entries: 0, files: 0, bytes: 0, skipped: 0 };
    /** Host paths this layer created: its own whiteouts and opaque markers do not remove them. */
    const created = new Set<string>();
    const ex = tarExtract();
    const failed = new Promise<never>((_, reject) => tar.once("error", reject));
    tar.pipe(ex);
    const run = (async () => {
      try {
        for await (const entry of ex) {
          stats.entries++;
          this.charge(512, layer);
          await this.entry(entry.header, entry, layer, created, stats);
        }
      } catch (e) {
        tar.unpipe(ex);
        tar.destroy();
        if (e instanceof BerthError) throw e;
        throw new BerthError("image_invalid", `image_invalid: layer ${layer} of ${this.what} is not a valid tar archive (${(e as Error).message})`);
      }
    })();
    await Promise.race([run, failed]);
    return stats;
  }

  /** Makes directory `path` (absolute, as inside the image) by the same rules as a layer's entries. */
  makeDirectory(path: string): string {
    return this.dir(this.parts(path, "(config)"), "(config)", path, true);
  }

  /** Applies the directory times recorded while unpacking; call once after the last layer. */
  finish(): void {
    for (const [p, t] of [...this.dirTimes.entries()].sort((a, b) => b[0].length - a[0].length)) {
      try {
        utimesSync(p, t, t);
      } catch {
        // Removed by a later whiteout.
      }
    }
  }

  private charge(n: number, layer: string): void {
    this.budget.used += n;
    if (this.budget.used > this.budget.max) {
      throw new BerthError("image_too_large", `image_too_large: ${this.what} unpacks to more than ${formatBytes(this.budget.max)} (the agent's --image-cache-max) in layer ${layer}; nothing was kept`);
    }
  }

  private refuse(layer: string, name: string, why: string): BerthError {
    return new BerthError("image_invalid", `image_invalid: layer ${layer} of ${this.what}: entry ${JSON.stringify(name.slice(0, 200))} ${why}; the image was not unpacked`);
  }

  /** The entry's path as components below the root; `..` is refused. */
  private parts(name: string, layer: string): string[] {
    if (name.includes("\0")) throw this.refuse(layer, name, "has a NUL in its path");
    const parts = name.split("/").filter((p) => p !== "" && p !== ".");
    if (parts.includes("..")) throw this.refuse(layer, name, 'climbs out of the image root ("..")');
    return parts;
  }

  /**
   * The host path of directory `parts` below the root, walked component by
   * component; missing directories are created (`create`) or refused.
   */
  private dir(parts: string[], layer: string, name: string, create: boolean): string {
    let cur: string[] = [];
    let queue = [...parts];
    let hops = 0;
    while (queue.length > 0) {
      const c = queue.shift()!;
      const p = join(this.root, ...cur, c);
      const st = lstatOrNull(p);
      if (st === null) {
        if (!create) throw this.refuse(layer, name, `names ${[...cur, c].join("/")}, which does not exist`);
        mkdirSync(p, { mode: 0o755 });
        cur.push(c);
        continue;
      }
      if (st.isDirectory()) {
        cur.push(c);
        continue;
      }
      if (st.isSymbolicLink()) {
        if (++hops > 40) throw this.refuse(layer, name, "goes through more than 40 symbolic links");
        const target = readlinkSync(p);
        const link = `${[...cur, c].join("/")} -> ${target}`;
        if (target.startsWith("/")) throw this.refuse(layer, name, `goes through symbolic link ${link}, which points outside the image root (an absolute target)`);
        const base = [...cur];
        for (const s of target.split("/")) {
          if (s === "" || s === ".") continue;
          if (s === "..") {
            if (base.length === 0) throw this.refuse(layer, name, `goes through symbolic link ${link}, which points outside the image root`);
            base.pop();
          } else base.push(s);
        }
        // Walk the target again from the root: its own components may be links too.
        cur = [];
        queue = [...base, ...queue];
        continue;
      }
      throw this.refuse(layer, name, `goes through ${[...cur, c].join("/")}, which is not a directory`);
    }
    return join(this.root, ...cur);
  }

  private async entry(h: Header, body: EntryBody, layer: string, created: Set<string>, stats: LayerStats): Promise<void> {
    const parts = this.parts(h.name, layer);
    if (parts.length === 0) {
      // The root itself ("./"): keep the root's own mode and owner.
      body.resume();
      return;
    }
    const base = parts[parts.length - 1]!;
    const parent = this.dir(parts.slice(0, -1), layer, h.name, true);
    const dest = join(parent, base);
    if (base.startsWith(".wh.")) {
      body.resume();
      whiteout(parent, base, created);
      return;
    }
    const mode = (h.mode ?? 0o644) & 0o7777;
    const uid = h.uid ?? 0;
    const gid = h.gid ?? 0;
    const mtime = h.mtime ?? new Date(0);
    const existing = lstatOrNull(dest);
    switch (h.type) {
      case "directory": {
        body.resume();
        if (existing && !existing.isDirectory()) rmSync(dest, { recursive: true, force: true });
        if (!existing || !existing.isDirectory()) mkdirSync(dest, { mode: 0o700 });
        if (this.asRoot) lchownSync(dest, uid, gid);
        chmodSync(dest, mode);
        this.dirTimes.set(dest, mtime);
        created.add(dest);
        return;
      }
      case "file":
      case "contiguous-file": {
        if (existing) rmSync(dest, { recursive: true, force: true });
        await this.writeFile(dest, body, layer, stats, { mode, uid, gid, mtime });
        stats.files++;
        created.add(dest);
        return;
      }
      case "symlink": {
        body.resume();
        if (existing) rmSync(dest, { recursive: true, force: true });
        if (h.linkname === null || h.linkname === undefined || h.linkname === "" || h.linkname.includes("\0")) throw this.refuse(layer, h.name, "is a symbolic link without a valid target");
        symlinkSync(h.linkname, dest);
        if (this.asRoot) lchownSync(dest, uid, gid);
        lutimesSync(dest, mtime, mtime);
        created.add(dest);
        return;
      }
      case "link": {
        body.resume();
        this.hardLink(h, dest, existing, layer, created);
        return;
      }
      case "character-device":
      case "block-device":
      case "fifo":
        body.resume();
        stats.skipped++;
        return;
      default:
        body.resume();
        throw this.refuse(layer, h.name, `has tar entry type ${String(h.type)}, which berth does not unpack`);
    }
  }

  /** A regular file's bytes (charged to the layer's limit) with its owner, mode and time. */
  private async writeFile(dest: string, body: EntryBody, layer: string, stats: LayerStats, m: { mode: number; uid: number; gid: number; mtime: Date }): Promise<void> {
    const fd = openSync(dest, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o600);
    try {
      for await (const chunk of body) {
        const buf = chunk as Buffer;
        this.charge(buf.length, layer);
        stats.bytes += buf.length;
        let off = 0;
        while (off < buf.length) off += writeSync(fd, buf, off, buf.length - off);
      }
      if (this.asRoot) fchownSync(fd, m.uid, m.gid);
      fchmodSync(fd, m.mode); // after chown, which clears setuid/setgid
      futimesSync(fd, m.mtime, m.mtime);
    } finally {
      closeSync(fd);
    }
  }

  /** A hard link to a file already unpacked (never to a directory, the root, or a missing file). */
  private hardLink(h: Header, dest: string, existing: Stats | null, layer: string, created: Set<string>): void {
    const tparts = this.parts(h.linkname ?? "", layer);
    if (tparts.length === 0) throw this.refuse(layer, h.name, "is a hard link to the root");
    const target = join(this.dir(tparts.slice(0, -1), layer, h.name, false), tparts[tparts.length - 1]!);
    const tst = lstatOrNull(target);
    if (tst === null) throw this.refuse(layer, h.name, `is a hard link to ${h.linkname}, which does not exist`);
    if (tst.isDirectory()) throw this.refuse(layer, h.name, `is a hard link to directory ${h.linkname}`);
    if (target === dest) return;
    if (existing) rmSync(dest, { recursive: true, force: true });
    linkSync(target, dest);
    created.add(dest);
  }
}

/** A whiteout entry: the opaque marker empties the directory of what earlier layers put there; `.wh.NAME` removes NAME. */
function whiteout(parent: string, base: string, created: Set<string>): void {
  if (base === ".wh..wh..opq") {
    for (const child of readdirSync(parent)) {
      const p = join(parent, child);
      if (!created.has(p)) rmSync(p, { recursive: true, force: true });
    }
  } else if (!base.startsWith(".wh..wh.")) {
    const victim = join(parent, base.slice(4));
    if (!created.has(victim)) rmSync(victim, { recursive: true, force: true });
  }
}

function lstatOrNull(p: string): Stats | null {
  try {
    return lstatSync(p);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") return null;
    throw e;
  }
}


/**
 * Resolves `path` (absolute, as inside the image) to a host path below
 * `root` the way the unpacker walks, following links that stay inside the
 * root; null when it does not exist or leaves the root. For reading the
 * image's own files (/etc/passwd, /bin/sh) without following anything out.
 */
export function resolveInRoot(root: string, path: string): string | null {
  let cur: string[] = [];
  let queue = path.split("/").filter((p) => p !== "" && p !== ".");
  let hops = 0;
  while (queue.length > 0) {
    const c = queue.shift()!;
    if (c === "..") {
      if (cur.length === 0) return null;
      cur.pop();
      continue;
    }
    const p = join(root, ...cur, c);
    const st = lstatOrNull(p);
    if (st === null) return null;
    if (st.isSymbolicLink()) {
      if (++hops > 40) return null;
      const target = readlinkSync(p);
      // Inside the machine an absolute target means the image's own root.
      if (target.startsWith("/")) cur = [];
      queue = [...target.split("/").filter((s) => s !== "" && s !== "."), ...queue];
      continue;
    }
    cur.push(c);
    if (!st.isDirectory() && queue.length > 0) return null;
  }
  return join(root, ...cur);
}
