/** What a machine of an image's root needs, checked once when the image is cached (cache.ts, step 4). */
import { lstatSync, readFileSync } from "node:fs";
import { BerthError } from "../../core/errors.js";
import type { BootImage } from "../runtime/types.js";
import { resolveImageUser } from "./image-user.js";
import { resolveInRoot, Unpacker } from "./unpack.js";

/**
 * What a machine of this root needs: a shell and sleep (berth's init and
 * every exec go through /bin/sh), the login shell, the user and the working
 * directory (made if the image lacks it).
 */
export function bootOf(rootfs: string, env: Record<string, string>, workingDir: string | null, user: string | null, what: string): Pick<BootImage, "env" | "workingDir" | "user" | "shell"> {
  const isFile = (p: string): boolean => {
    const host = resolveInRoot(rootfs, p);
    return host !== null && lstatSync(host).isFile();
  };
  if (!isFile("/bin/sh")) throw new BerthError("image_invalid", `image_invalid: ${what} has no /bin/sh; berth runs every command of a machine through /bin/sh`);
  if (!["/bin/sleep", "/usr/bin/sleep"].some(isFile)) throw new BerthError("image_invalid", `image_invalid: ${what} has no sleep in /bin or /usr/bin; the machine's init needs it`);
  const small = (p: string): string => {
    const host = resolveInRoot(rootfs, p);
    if (host === null || !lstatSync(host).isFile() || lstatSync(host).size > 4 << 20) return "";
    return readFileSync(host, "utf8");
  };
  const u = resolveImageUser(user, small("/etc/passwd"), small("/etc/group"), what);
  let wd: string | null = null;
  if (workingDir !== null && workingDir.trim() !== "") {
    if (!workingDir.startsWith("/")) throw new BerthError("image_invalid", `image_invalid: ${what} has a relative WorkingDir ${JSON.stringify(workingDir)}`);
    wd = workingDir;
    if (resolveInRoot(rootfs, wd) === null) new Unpacker(rootfs, { max: Infinity, used: 0 }, what).makeDirectory(wd);
  }
  return { env, workingDir: wd, user: u, shell: isFile("/bin/bash") ? "/bin/bash" : "/bin/sh" };
}
