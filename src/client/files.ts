/**
 * Files on a borrowed machine over SFTP: the gateway's `sftp` subsystem,
 * which runs the machine's own sftp-server as the machine's user, in its
 * workspace (relative paths are the workspace), as one more session on the
 * borrow's SSH connection — so a return cuts it like any command.
 *
 * What is guaranteed:
 * - `write`/`upload` never leave a half-written file under the target name on
 *   the machine: bytes go to `NAME.berth-partial-XXXX` next to it, which is
 *   renamed over the target (posix-rename) only once complete; a failed or cut
 *   transfer removes it where the connection still allows.
 * - `download` writes `LOCAL.partial` and renames it only once complete; a
 *   failed or cut download removes it; nothing is left under the local name.
 * - Modes are kept (`upload`/`download` set the source's permission bits on
 *   the copy), recursively with `recursive: true`.
 * - `abort()` (a Ctrl-C in `berth cp`) stops every transfer of this session
 *   and removes its partial files on both sides before it resolves.
 * - Refusals are BerthErrors with stable codes: `not_found` (no such file),
 *   `forbidden` (permission denied), `conflict` (a directory where a file was
 *   meant, or the reverse), `disk_full` (a write failed and the file system it
 *   goes to has less free space than the file needs), `sftp_unavailable` (the
 *   machine has no SFTP server), `transfer_cut` (the connection or session
 *   ended mid-transfer: returned, expired or lost), `aborted` (abort() was
 *   called), `operation_failed` (anything else).
 */
import { randomBytes } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import { chmodSync, existsSync, lstatSync, mkdirSync, readdirSync, renameSync, rmSync, statSync } from "node:fs";
import { basename, join } from "node:path";
import { posix } from "node:path";
import type { SFTPWrapper, Stats as SftpStats } from "ssh2";
import { BerthError } from "../core/errors.js";
import type { SshConnection } from "./ssh.js";

export interface FileEntry {
  name: string;
  type: "file" | "directory" | "symlink" | "other";
  size: number;
  /** Permission bits (e.g. 0o644). */
  mode: number;
  /** Modification time, epoch ms. */
  mtime: number;
}

export interface TransferOptions {
  /** Copy directories with everything under them. */
  recursive?: boolean;
  /** Called as bytes move: bytes done so far of this file, its size, its path. */
  onProgress?: (done: number, total: number, path: string) => void;
}

const SFTP_NO_SUCH_FILE = 2;
const SFTP_PERMISSION_DENIED = 3;
const SFTP_FAILURE = 4;

/** A BerthError for an SFTP failure on `path`, with a code a script can match. */
export function sftpError(e: unknown, what: string, path: string): BerthError {
  if (e instanceof BerthError) return e;
  const err = e as { code?: unknown; message?: string };
  if (err?.code === "aborted") return new BerthError("aborted", `aborted: ${what} ${path}: the copy was interrupted`);
  const msg = err?.message ?? String(e);
  if (err?.code === SFTP_NO_SUCH_FILE) return new BerthError("not_found", `not_found: ${what} ${path}: no such file or directory on the machine`);
  if (err?.code === SFTP_PERMISSION_DENIED) return new BerthError("forbidden", `forbidden: ${what} ${path}: permission denied on the machine`);
  if (err?.code === "transfer_cut" || /No response from server|not connected|channel closed|Connection lost|ECONNRESET|closed/i.test(msg)) {
    return new BerthError("transfer_cut", `transfer_cut: ${what} ${path}: the connection to the machine ended mid-transfer (returned, expired or lost)`);
  }
  return new BerthError("operation_failed", `operation_failed: ${what} ${path}: ${msg}`);
}

function typeOf(s: SftpStats): FileEntry["type"] {
  if (s.isDirectory()) return "directory";
  if (s.isFile()) return "file";
  if (s.isSymbolicLink()) return "symlink";
  return "other";
}

function call<T>(fn: (cb: (err: Error | undefined | null, v: T) => void) => void): Promise<T> {
  return new Promise((resolve, reject) => fn((err, v) => (err ? reject(err) : resolve(v))));
}

/** Open the machine's SFTP server on a connection; the machine without one is `sftp_unavailable`. */
export function openSftp(conn: SshConnection): Promise<SFTPWrapper> {
  return new Promise((resolve, reject) => {
    if (conn.closed) return reject(new BerthError("transfer_cut", "transfer_cut: the SSH connection to the machine is closed"));
    conn.client.sftp((err, sftp) => {
      if (err) {
        reject(new BerthError("sftp_unavailable", `sftp_unavailable: the machine's SFTP server did not start (${err.message}); the machine has no sftp-server and berth provided none`));
      } else resolve(sftp);
    });
  });
}

/** The files of one borrowed machine. Obtain with `client.files(borrow)`; `close()` ends its SFTP session. */
export class MachineFiles {
  readonly #sftp: SFTPWrapper;
  /** Rejects once the SFTP channel closed (return, expiry, connection lost, close()). */
  readonly #gone: Promise<never>;
  /** Temporary names being written on the machine, and `.partial` files being written here. */
  readonly #remotePartials = new Set<string>();
  readonly #localPartials = new Set<string>();
  /** Transfers under way (abort() waits for them to unwind). */
  readonly #inflight = new Set<Promise<unknown>>();
  #aborted = false;
  constructor(sftp: SFTPWrapper) {
    this.#sftp = sftp;
    // ssh2 leaves a fastGet/fastPut in flight unanswered when the channel goes away: every call races this.
    this.#gone = new Promise<never>((_, reject) => {
      const cut = () => reject(Object.assign(new Error("the SFTP session on the machine ended"), { code: "transfer_cut" }));
      sftp.once("close", cut);
      sftp.once("end", cut);
    });
    this.#gone.catch(() => undefined);
  }

  /** The whole file as bytes. */
  async read(path: string): Promise<Buffer> {
    try {
      const st = await this.#call<SftpStats>((cb) => this.#sftp.stat(path, cb));
      if (st.isDirectory()) throw new BerthError("conflict", `conflict: read ${path}: is a directory on the machine`);
      return await this.#call<Buffer>((cb) => this.#sftp.readFile(path, cb as (e: Error | undefined, b: Buffer) => void));
    } catch (e) {
      throw sftpError(e, "read", path);
    }
  }

  /** Write the whole file (created or replaced whole: never seen half-written under its name). */
  async write(path: string, data: Buffer | string, o: { mode?: number } = {}): Promise<void> {
    const tmp = partialName(path);
    await this.#remoteTransfer(tmp, path, "write", Buffer.byteLength(data), async () => {
      await this.#call<void>((cb) => this.#sftp.writeFile(tmp, data, { mode: o.mode ?? 0o644 }, cb as (e?: Error | null) => void));
      if (o.mode !== undefined) await this.#call<void>((cb) => this.#sftp.chmod(tmp, o.mode!, cb as (e?: Error | null) => void));
    });
  }

  /** The entries of a directory (without `.` and `..`), sorted by name. */
  async list(path = "."): Promise<FileEntry[]> {
    try {
      const list = await this.#call<Array<{ filename: string; attrs: SftpStats }>>((cb) => this.#sftp.readdir(path, cb as never));
      return list
        .filter((e) => e.filename !== "." && e.filename !== "..")
        .map((e) => ({ name: e.filename, type: typeOf(e.attrs), size: e.attrs.size, mode: e.attrs.mode & 0o7777, mtime: e.attrs.mtime * 1000 }))
        .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    } catch (e) {
      throw sftpError(e, "list", path);
    }
  }

  /** What is at a path (symbolic links followed), or a `not_found` refusal. */
  async stat(path: string): Promise<FileEntry> {
    try {
      const s = await this.#call<SftpStats>((cb) => this.#sftp.stat(path, cb));
      return { name: posix.basename(path), type: typeOf(s), size: s.size, mode: s.mode & 0o7777, mtime: s.mtime * 1000 };
    } catch (e) {
      throw sftpError(e, "stat", path);
    }
  }

  /** The absolute path inside the machine (relative paths are the workspace). */
  async realpath(path = "."): Promise<string> {
    try {
      return await this.#call<string>((cb) => this.#sftp.realpath(path, cb));
    } catch (e) {
      throw sftpError(e, "resolve", path);
    }
  }

  /** Copy a local file (or, with `recursive`, a directory) to `remote`, keeping permission bits. */
  async upload(local: string, remote: string, o: TransferOptions = {}): Promise<void> {
    let st;
    try {
      st = statSync(local);
    } catch {
      throw new BerthError("not_found", `not_found: upload ${local}: no such local file or directory`);
    }
    if (st.isDirectory()) {
      if (!o.recursive) throw new BerthError("conflict", `conflict: upload ${local}: is a directory (copy it with recursive)`);
      await this.#mkdir(remote, st.mode & 0o7777);
      for (const name of readdirSync(local).sort()) {
        const child = join(local, name);
        const ls = lstatSync(child);
        // Symbolic links are not followed (a link out of the tree would copy what it points at).
        if (ls.isSymbolicLink() || !(ls.isFile() || ls.isDirectory())) continue;
        await this.upload(child, posix.join(remote, name), o);
      }
      return;
    }
    const tmp = partialName(remote);
    await this.#remoteTransfer(tmp, remote, "upload to", st.size, async () => {
      await this.#call<void>((cb) =>
        this.#sftp.fastPut(local, tmp, { mode: st.mode & 0o7777, step: (done, _c, total) => o.onProgress?.(done, total, local) }, cb as (e?: Error | null) => void),
      );
      await this.#call<void>((cb) => this.#sftp.chmod(tmp, st.mode & 0o7777, cb as (e?: Error | null) => void));
    });
  }

  /** Copy `remote` (a file, or with `recursive` a directory) to a local path, keeping permission bits; `LOCAL.partial` until complete. */
  async download(remote: string, local: string, o: TransferOptions = {}): Promise<void> {
    let st: SftpStats;
    try {
      st = await this.#call<SftpStats>((cb) => this.#sftp.stat(remote, cb));
    } catch (e) {
      throw sftpError(e, "download", remote);
    }
    if (st.isDirectory()) {
      if (!o.recursive) throw new BerthError("conflict", `conflict: download ${remote}: is a directory on the machine (copy it with recursive)`);
      mkdirSync(local, { recursive: true });
      chmodSync(local, st.mode & 0o7777);
      const entries = await this.#call<Array<{ filename: string; attrs: SftpStats }>>((cb) => this.#sftp.readdir(remote, cb as never)).catch((e: unknown) => {
        throw sftpError(e, "list", remote);
      });
      for (const e of entries.sort((a, b) => (a.filename < b.filename ? -1 : 1))) {
        if (e.filename === "." || e.filename === ".." || e.filename.includes("/")) continue;
        if (!(e.attrs.isFile() || e.attrs.isDirectory())) continue;
        await this.download(posix.join(remote, e.filename), join(local, e.filename), o);
      }
      return;
    }
    if (!st.isFile()) throw new BerthError("conflict", `conflict: download ${remote}: not a regular file`);
    const part = `${local}.partial`;
    this.#localPartials.add(part);
    const work = (async () => {
      try {
        await this.#call<void>((cb) => this.#sftp.fastGet(remote, part, { step: (done, _c, total) => o.onProgress?.(done, total, remote) }, cb as (e?: Error | null) => void));
        if (this.#aborted) throw Object.assign(new Error("aborted"), { code: "aborted" });
        chmodSync(part, st.mode & 0o7777);
        renameSync(part, local);
      } catch (e) {
        rmSync(part, { force: true });
        throw sftpError(e, "download", remote);
      } finally {
        this.#localPartials.delete(part);
      }
    })();
    await this.#track(work);
  }

  /**
   * Stop every transfer of this session and remove its partial files: the temporary names on the
   * machine first (no new file is opened on the machine from here on, so none can appear after its
   * removal), then the SFTP session ends, the transfers unwind (at most `waitMs`), and the local
   * `.partial` files go. Resolves with what could not be removed (empty when nothing is left).
   */
  async abort(waitMs = 5000): Promise<string[]> {
    this.#aborted = true;
    // A transfer between its local open and its remote open would otherwise create the temporary file after it was removed.
    (this.#sftp as unknown as { open: (...a: unknown[]) => void }).open = (...a: unknown[]) => {
      const cb = a[a.length - 1];
      if (typeof cb === "function") process.nextTick(cb, Object.assign(new Error("aborted"), { code: "aborted" }));
    };
    const left: string[] = [];
    for (const tmp of [...this.#remotePartials]) {
      const removed = await Promise.race([
        call<void>((cb) => this.#sftp.unlink(tmp, cb as (e?: Error | null) => void)).then(
          () => true,
          (e: { code?: unknown }) => e?.code === SFTP_NO_SUCH_FILE,
        ),
        this.#gone.catch(() => false),
        sleep(waitMs, undefined, { ref: false }).then(() => false),
      ]);
      if (removed) this.#remotePartials.delete(tmp);
      else left.push(`${tmp} on the machine`);
    }
    this.close();
    await Promise.race([Promise.allSettled([...this.#inflight]), sleep(waitMs, undefined, { ref: false })]);
    for (const part of this.#localPartials) rmSync(part, { force: true });
    for (const part of this.#localPartials) if (existsSync(part)) left.push(part);
    return left;
  }

  /** End this SFTP session (the connection stays for the borrow's other uses). */
  close(): void {
    try {
      this.#sftp.end();
    } catch {
      /* already ended */
    }
  }

  #call<T>(fn: (cb: (err: Error | undefined | null, v: T) => void) => void): Promise<T> {
    if (this.#aborted) return Promise.reject(Object.assign(new Error("aborted"), { code: "aborted" }));
    return Promise.race([call(fn), this.#gone]);
  }

  async #track<T>(p: Promise<T>): Promise<T> {
    this.#inflight.add(p);
    try {
      return await p;
    } finally {
      this.#inflight.delete(p);
    }
  }

  /**
   * Write `tmp` with `fill`, then rename it over `target`. On failure the temporary file is removed
   * (after abort(), abort() removes it); a failure on a file system with less free space than
   * `size` is `disk_full`.
   */
  async #remoteTransfer(tmp: string, target: string, what: string, size: number, fill: () => Promise<void>): Promise<void> {
    this.#remotePartials.add(tmp);
    const work = (async () => {
      try {
        await fill();
        await this.#replace(tmp, target);
        this.#remotePartials.delete(tmp);
      } catch (e) {
        if (this.#aborted) throw sftpError(Object.assign(new Error("aborted"), { code: "aborted" }), what, target);
        const removed = await this.#call<void>((cb) => this.#sftp.unlink(tmp, cb as (e?: Error | null) => void)).then(
          () => true,
          (u: { code?: unknown }) => u?.code === SFTP_NO_SUCH_FILE,
        );
        if (removed) this.#remotePartials.delete(tmp);
        if ((e as { code?: unknown })?.code === SFTP_FAILURE) {
          const free = await this.#freeBytes(posix.dirname(target));
          if (free !== null && free < size) {
            throw new BerthError(
              "disk_full",
              `disk_full: ${what} ${target}: no space left on the machine's disk (${mb(free)} free where it goes, the file is ${mb(size)}); nothing was written under its name`,
            );
          }
        }
        throw sftpError(e, what, target);
      }
    })();
    await this.#track(work);
  }

  /** Free bytes for the machine's user on the file system holding `dir` (OpenSSH's statvfs extension), or null. */
  async #freeBytes(dir: string): Promise<number | null> {
    try {
      const v = await this.#call<{ f_bavail: number | bigint; f_frsize: number | bigint; f_bsize: number | bigint }>((cb) => this.#sftp.ext_openssh_statvfs(dir, cb));
      const free = Number(v.f_bavail) * Number(v.f_frsize || v.f_bsize);
      return Number.isFinite(free) ? free : null;
    } catch {
      return null;
    }
  }

  async #mkdir(path: string, mode: number): Promise<void> {
    try {
      const s = await this.#call<SftpStats>((cb) => this.#sftp.stat(path, cb)).catch(() => null);
      if (s && !s.isDirectory()) throw new BerthError("conflict", `conflict: mkdir ${path}: exists on the machine and is not a directory`);
      if (!s) await this.#call<void>((cb) => this.#sftp.mkdir(path, { mode }, cb as (e?: Error | null) => void));
      await this.#call<void>((cb) => this.#sftp.chmod(path, mode, cb as (e?: Error | null) => void));
    } catch (e) {
      throw sftpError(e, "mkdir", path);
    }
  }

  /** Rename over the target (OpenSSH's posix-rename: replaces an existing file in one step). */
  async #replace(tmp: string, path: string): Promise<void> {
    const target = await this.#call<SftpStats>((cb) => this.#sftp.stat(path, cb)).catch(() => null);
    if (target?.isDirectory()) throw new BerthError("conflict", `conflict: ${path} is a directory on the machine`);
    await this.#call<void>((cb) => this.#sftp.ext_openssh_rename(tmp, path, cb as (e?: Error | null) => void));
  }
}

function mb(n: number): string {
  return `${(n / 1e6).toFixed(1)} MB`;
}

/** `dir/NAME.berth-partial-XXXXXXXX` beside the target. */
function partialName(path: string): string {
  const base = posix.basename(path) || basename(path);
  return posix.join(posix.dirname(path), `${base}.berth-partial-${randomBytes(4).toString("hex")}`);
}
