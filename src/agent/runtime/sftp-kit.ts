/**
 * berth's own SFTP server for machines whose image has none: the host's
 * OpenSSH sftp-server, with the dynamic loader and exactly the shared
 * libraries `ldd` names for it, gathered once into
 * <stateDir>/sftp-kit/<content hash>/ (flat: `sftp-server`, `ld.so`, each
 * library under its soname). The gvisor runtime binds that directory
 * read-only into a sandbox booted from an image (SFTP_KIT_IN); the gateway's
 * SFTP argv (channels.ts) runs it there as
 * `ld.so --library-path DIR DIR/sftp-server` only when the machine has no
 * sftp-server of its own. The loader is named explicitly, so the image needs
 * neither the host's libc nor its loader path (a musl or busybox-only image
 * works).
 *
 * Content-addressed and written under a temporary name, then renamed: a
 * sandbox started by an earlier agent keeps its kit directory even after the
 * host's openssh is upgraded (the new one lands beside it), and a crash while
 * gathering leaves only a `.tmp-*` directory that is never bound.
 */
import { execFile } from "node:child_process";
import { chmodSync, copyFileSync, existsSync, mkdirSync, readFileSync, renameSync, rmSync } from "node:fs";
import { createHash, randomBytes } from "node:crypto";
import { basename, join } from "node:path";
import { SFTP_SERVER_PATHS } from "../ssh/channels.js";

/** What goes into a kit: the server, the loader, and each library (its soname, its host path). */
export interface SftpKitParts {
  server: string;
  loader: string;
  libraries: Array<{ name: string; path: string }>;
}

/**
 * The parts named by `ldd SERVER` output; null when it names no loader or a
 * library it could not find (the kit would not run).
 */
export function kitPartsFromLdd(server: string, out: string): SftpKitParts | null {
  let loader: string | null = null;
  const libraries: Array<{ name: string; path: string }> = [];
  for (const raw of out.split("\n")) {
    const line = raw.trim();
    if (!line || line.startsWith("linux-vdso") || line.startsWith("linux-gate")) continue;
    const lib = /^(\S+) => (\/\S+) \(0x[0-9a-f]+\)$/.exec(line);
    if (lib) {
      libraries.push({ name: lib[1]!, path: lib[2]! });
      continue;
    }
    const ld = /^(\/\S+) \(0x[0-9a-f]+\)$/.exec(line);
    if (ld) {
      loader = ld[1]!;
      continue;
    }
    return null; // "not found", "not a dynamic executable", or a form this parser does not know
  }
  return loader ? { server, loader, libraries } : null;
}

function lddOf(path: string): Promise<string | null> {
  return new Promise((resolve) => {
    execFile("ldd", [path], { timeout: 10_000, env: { PATH: "/usr/bin:/bin" } }, (err, stdout) => resolve(err ? null : stdout));
  });
}

/**
 * Gather the host's sftp-server into a kit under `stateDir` (once per content)
 * and return the kit's directory; null where the host has no sftp-server or
 * `ldd` cannot account for its libraries (then an image without its own
 * server has none: `sftp_unavailable`).
 */
export async function ensureSftpKit(stateDir: string): Promise<string | null> {
  const server = SFTP_SERVER_PATHS.find((p) => existsSync(p));
  if (!server) return null;
  const out = await lddOf(server);
  const parts = out === null ? null : kitPartsFromLdd(server, out);
  if (!parts) return null;
  const files: Array<[string, string]> = [["sftp-server", parts.server], ["ld.so", parts.loader], ...parts.libraries.map((l): [string, string] => [basename(l.name), l.path])];
  const h = createHash("sha256");
  for (const [name, path] of files) h.update(name).update("\0").update(readFileSync(path)).update("\0");
  const root = join(stateDir, "sftp-kit");
  const dir = join(root, h.digest("hex").slice(0, 16));
  if (existsSync(dir)) return dir;
  mkdirSync(root, { recursive: true, mode: 0o755 });
  chmodSync(root, 0o755);
  const tmp = join(root, `.tmp-${randomBytes(6).toString("hex")}`);
  try {
    mkdirSync(tmp, { mode: 0o755 });
    for (const [name, path] of files) {
      copyFileSync(path, join(tmp, name));
      chmodSync(join(tmp, name), 0o755);
    }
    chmodSync(tmp, 0o755);
    renameSync(tmp, dir);
  } catch (e) {
    rmSync(tmp, { recursive: true, force: true });
    if (existsSync(dir)) return dir; // another start gathered the same kit first
    throw e;
  }
  return dir;
}
