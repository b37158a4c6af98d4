/**
 * An image's `User` ("", "name", "uid", "name:group", "uid:gid") resolved
 * against the image's own /etc/passwd and /etc/group, as container runtimes
 * do; and its `Env` as a map. Pure (the caller reads the files, through
 * unpack.ts `resolveInRoot`, never following a link out of the root).
 */
import { BerthError } from "../../core/errors.js";

export interface ImageUser {
  uid: number;
  gid: number;
  additionalGids: number[];
  /** The user's name when /etc/passwd names it, else the uid as text. */
  name: string;
  /** The home directory /etc/passwd gives, or null. */
  home: string | null;
}

interface PasswdEntry {
  name: string;
  uid: number;
  gid: number;
  home: string;
}

function passwd(text: string): PasswdEntry[] {
  return text
    .split("\n")
    .map((l) => l.split(":"))
    .filter((f) => f.length >= 7 && /^\d+$/.test(f[2]!) && /^\d+$/.test(f[3]!))
    .map((f) => ({ name: f[0]!, uid: Number(f[2]), gid: Number(f[3]), home: f[5]! }));
}

function groups(text: string): Array<{ name: string; gid: number; members: string[] }> {
  return text
    .split("\n")
    .map((l) => l.split(":"))
    .filter((f) => f.length >= 4 && /^\d+$/.test(f[2]!))
    .map((f) => ({ name: f[0]!, gid: Number(f[2]), members: f[3]!.split(",").filter(Boolean) }));
}

const MAX_ID = 0x7fff_ffff;

/** Resolves `user` (an image config's User) against the image's passwd and group files (empty text when absent). */
export function resolveImageUser(user: string | null | undefined, passwdText: string, groupText: string, what: string): ImageUser {
  const spec = (user ?? "").trim();
  const pw = passwd(passwdText);
  const gr = groups(groupText);
  if (spec === "") return { uid: 0, gid: 0, additionalGids: [], name: "root", home: pw.find((p) => p.uid === 0)?.home ?? null };
  const [u, g] = spec.split(":", 2) as [string, string | undefined];
  let entry: PasswdEntry | undefined;
  let uid: number;
  if (/^\d+$/.test(u)) {
    uid = Number(u);
    entry = pw.find((p) => p.uid === uid);
  } else {
    entry = pw.find((p) => p.name === u);
    if (!entry) throw new BerthError("image_invalid", `image_invalid: ${what} runs as user ${u}, which its /etc/passwd does not name`);
    uid = entry.uid;
  }
  let gid = entry?.gid ?? 0;
  if (g !== undefined && g !== "") {
    if (/^\d+$/.test(g)) gid = Number(g);
    else {
      const found = gr.find((x) => x.name === g);
      if (!found) throw new BerthError("image_invalid", `image_invalid: ${what} runs as group ${g}, which its /etc/group does not name`);
      gid = found.gid;
    }
  }
  if (uid > MAX_ID || gid > MAX_ID) throw new BerthError("image_invalid", `image_invalid: ${what} names user ${spec}, out of range`);
  const name = entry?.name ?? String(uid);
  // Supplementary groups: the groups listing the user by name (when a group was not forced).
  const additionalGids = g === undefined && entry ? gr.filter((x) => x.members.includes(entry.name) && x.gid !== gid).map((x) => x.gid) : [];
  return { uid, gid, additionalGids, name, home: entry?.home ?? null };
}

/** `KEY=VALUE` lines of an image's Env as a map (later entries win; malformed ones are dropped). */
export function envMap(env: readonly string[] | null | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  for (const line of env ?? []) {
    const i = line.indexOf("=");
    if (i <= 0) continue;
    const k = line.slice(0, i);
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(k) || line.includes("\0")) continue;
    out[k] = line.slice(i + 1);
  }
  return out;
}
