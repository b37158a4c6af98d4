/**
 * Files in a borrowed machine's workspace for `berth mcp`'s write_file,
 * read_file and list_files, carried over the same SSH connection as commands
 * (one exec per call): the bytes travel raw on the channel (binary-safe;
 * base64 only in the tool's JSON), and a small POSIX sh script on the machine
 * does the work, with the path passed as an argument (never spliced into a
 * command line).
 *
 * The workspace is the directory a machine's commands start in and that scrub
 * wipes: `/workspace` in a gvisor sandbox, `<agent state>/machines/<id>/workspace`
 * (the command's HOME) on the process runtime. A path is refused when it leaves
 * it: first lexically here (`..`, an absolute path elsewhere), then on the
 * machine, where the nearest existing ancestor and the file itself are resolved
 * through symbolic links (`pwd -P`, `readlink -f`) before anything is created,
 * written or read.
 *
 * The scripts use only POSIX sh, coreutils/busybox `find`, `stat`, `head`,
 * `tail`, `readlink -f`; list_files prefers GNU find's -printf and falls back
 * to one `stat` per entry (busybox images).
 */
import { isUtf8 } from "node:buffer";
import { posix } from "node:path";
import type { Borrow } from "../client/borrow.js";
import type { BerthClient } from "../client/client.js";
import { shellQuote } from "../client/ssh.js";
import { ToolError, decodeBase64, invalid } from "./errors.js";
import type { SessionLimits } from "./limits.js";

/** What a file tool needs of its session. */
export interface FileDeps {
  client: BerthClient;
  limits: SessionLimits;
}

/** The machine a file tool works on, as the session holds it. */
export interface FileMachine {
  borrow: Borrow;
  workspace: string;
}

/** Prints the workspace's physical path. */
export const WORKSPACE_SCRIPT = `case "$HOME" in */machines/"$BERTH_MACHINE"/workspace) w=$HOME;; *) w=/workspace;; esac; cd -- "$w" && pwd -P`;

/** Shared by the scripts: `inside PATH` exits 3 unless PATH (resolved) lies in the workspace "$w". */
const INSIDE = `inside() { case "$1/" in "$w"/*) return 0;; esac; echo "berth:outside:$1" >&2; exit 3; }
nearest() { a=$1; while [ ! -e "$a" ] && [ ! -L "$a" ]; do a=$(dirname -- "$a"); done; (cd -- "$a" 2>/dev/null && pwd -P) || { echo "berth:notdir:$a" >&2; exit 4; }; }
resolved() { if [ -L "$1" ]; then r=$(readlink -f -- "$1") || { echo "berth:dangling:$1" >&2; exit 4; }; inside "$r"; fi; }`;

/** Args: workspace, file, append (0|1). Reads the content from stdin. */
export const WRITE_SCRIPT = `set -e
w=$1 f=$2
${INSIDE}
d=$(dirname -- "$f")
n=$(nearest "$d")
inside "$n"
mkdir -p -- "$d"
p=$(cd -- "$d" && pwd -P)
inside "$p"
resolved "$f"
if [ -d "$f" ]; then echo "berth:isdir:$f" >&2; exit 4; fi
if [ "$3" = 1 ]; then cat >> "$f"; else cat > "$f"; fi
wc -c < "$f"`;

/** Args: workspace, file, offset, length. Prints the size on stderr ("berth:size:N"), then the bytes on stdout. */
export const READ_SCRIPT = `set -e
w=$1 f=$2
${INSIDE}
[ -e "$f" ] || [ -L "$f" ] || { echo "berth:notfound:$f" >&2; exit 4; }
p=$(cd -- "$(dirname -- "$f")" && pwd -P)
inside "$p"
resolved "$f"
[ -f "$f" ] || { echo "berth:notfile:$f" >&2; exit 4; }
echo "berth:size:$(wc -c < "$f" | tr -d ' ')" >&2
if [ "$3" = 0 ]; then head -c "$4" -- "$f"; else tail -c +"$(($3 + 1))" -- "$f" | head -c "$4"; fi`;

/**
 * Args: workspace, directory, depth. Prints one record per entry: "TYPE SIZE MTIME\\nPATH\\0"
 * (TYPE a find -printf %y letter, or "m" + the hex mode from stat -c %f).
 */
export const LIST_SCRIPT = `set -e
w=$1 d=$2
${INSIDE}
[ -e "$d" ] || [ -L "$d" ] || { echo "berth:notfound:$d" >&2; exit 4; }
p=$(cd -- "$d" 2>/dev/null && pwd -P) || { echo "berth:notdir:$d" >&2; exit 4; }
inside "$p"
if find "$d" -maxdepth 0 -printf '' >/dev/null 2>&1; then
  find "$d" -mindepth 1 -maxdepth "$3" -printf '%y %s %T@\\n%p\\0'
else
  find "$d" -mindepth 1 -maxdepth "$3" -exec stat -c 'm%f %s %Y' {} \\; -print0
fi | head -c ${1024 * 1024}`;

/** The absolute path on the machine for `path` (relative to the workspace, or absolute under it), or a refusal. */
export function workspacePath(workspace: string, path: string): string {
  if (path.length === 0) throw invalid("path is empty; give a path relative to the workspace, e.g. src/main.py");
  if (path.includes("\0")) throw invalid("path contains a NUL byte");
  const abs = posix.resolve(workspace, path);
  if (abs !== workspace && !abs.startsWith(workspace.endsWith("/") ? workspace : `${workspace}/`)) {
    throw new ToolError("path_outside_workspace", `path_outside_workspace: ${JSON.stringify(path)} resolves to ${abs}, outside the workspace ${workspace}`);
  }
  return abs;
}

/** The refusal a file script reported on stderr (exit 3 or 4), as a tool error. */
export function scriptRefusal(status: number, stderr: string, path: string, workspace: string): ToolError {
  const m = /berth:(\w+):(.*)/.exec(stderr);
  const kind = m?.[1] ?? "";
  const where = m?.[2] ?? path;
  if (status === 3 || kind === "outside") return new ToolError("path_outside_workspace", `path_outside_workspace: ${JSON.stringify(path)} leads to ${where}, outside the workspace ${workspace} (through a symbolic link)`);
  switch (kind) {
    case "notfound":
      return new ToolError("file_not_found", `file_not_found: ${where} does not exist`);
    case "notfile":
      return new ToolError("file_not_found", `file_not_found: ${where} is not a regular file`);
    case "isdir":
      return new ToolError("file_not_found", `file_not_found: ${where} is a directory, not a file`);
    case "notdir":
      return new ToolError("file_not_found", `file_not_found: ${where} is not a directory`);
    case "dangling":
      return new ToolError("file_not_found", `file_not_found: ${where} is a symbolic link to nothing`);
    default:
      return new ToolError("operation_failed", `operation_failed: the file operation on ${path} failed (exit ${status}): ${stderr.trim().slice(0, 300) || "no message"}`);
  }
}

export interface ListedEntry {
  path: string;
  type: "file" | "directory" | "symlink" | "other";
  size: number;
  modified: string;
}

const HEX_TYPES: Record<number, ListedEntry["type"]> = { 0x8000: "file", 0x4000: "directory", 0xa000: "symlink" };
const LETTER_TYPES: Record<string, ListedEntry["type"]> = { f: "file", d: "directory", l: "symlink" };

/** Parses LIST_SCRIPT's records; paths are given relative to the workspace. */
export function parseListing(out: Buffer, workspace: string): ListedEntry[] {
  const entries: ListedEntry[] = [];
  let at = 0;
  for (;;) {
    const nl = out.indexOf(0x0a, at);
    if (nl < 0) break;
    const nul = out.indexOf(0x00, nl + 1);
    if (nul < 0) break; // cut by the size cap
    const [kind = "", size = "0", mtime = "0"] = out.subarray(at, nl).toString("utf8").split(" ");
    const full = out.subarray(nl + 1, nul).toString("utf8");
    at = nul + 1;
    const type = kind.startsWith("m") ? (HEX_TYPES[parseInt(kind.slice(1), 16) & 0xf000] ?? "other") : (LETTER_TYPES[kind] ?? "other");
    const rel = posix.relative(workspace, posix.resolve(workspace, full));
    entries.push({ path: rel, type, size: Number(size), modified: new Date(Math.floor(Number(mtime) * 1000)).toISOString() });
  }
  return entries;
}

/** write_file: the bytes raw on the channel, the path checked on the machine by WRITE_SCRIPT. */
export async function writeFile(h: FileMachine, d: FileDeps, a: { handle: string; path: string; content: string; encoding?: "utf8" | "base64"; append?: boolean }): Promise<Record<string, unknown>> {
  const path = workspacePath(h.workspace, a.path);
  const bytes = (a.encoding ?? "utf8") === "base64" ? decodeBase64(a.content, "content") : Buffer.from(a.content, "utf8");
  const max = d.limits.writeMaxBytes;
  if (bytes.length > max) throw new ToolError("file_too_large", `file_too_large: the content is ${bytes.length} bytes; write_file takes at most ${max} bytes per call (append the rest with append: true)`);
  const r = await d.client.exec(h.borrow, shellQuote(["sh", "-c", WRITE_SCRIPT, "berth-write", h.workspace, path, a.append ? "1" : "0"]), { stdin: bytes });
  if (r.status !== 0) throw scriptRefusal(r.status, r.stderr?.toString("utf8") ?? "", a.path, h.workspace);
  return { path: relativeTo(h.workspace, path), absolute_path: path, bytes_written: bytes.length, size: Number(r.stdout?.toString("utf8").trim() ?? bytes.length) };
}

/** read_file: a whole small file, or a part by offset and length; text as UTF-8, other bytes as base64. */
export async function readFile(h: FileMachine, d: FileDeps, a: { handle: string; path: string; offset?: number; length?: number; encoding?: "auto" | "utf8" | "base64" }): Promise<Record<string, unknown>> {
  const path = workspacePath(h.workspace, a.path);
  const lim = d.limits;
  if (a.length !== undefined && a.length > lim.readMaxBytes) throw invalid(`length is at most ${lim.readMaxBytes} bytes per call`);
  const offset = a.offset ?? 0;
  // Without a length, one byte more than the default tells a file that is too large.
  const want = a.length ?? lim.readDefaultBytes + 1;
  const r = await d.client.exec(h.borrow, shellQuote(["sh", "-c", READ_SCRIPT, "berth-read", h.workspace, path, String(offset), String(want)]));
  const err = r.stderr?.toString("utf8") ?? "";
  if (r.status !== 0) throw scriptRefusal(r.status, err, a.path, h.workspace);
  const size = Number(/berth:size:(\d+)/.exec(err)?.[1] ?? NaN);
  let data = r.stdout ?? Buffer.alloc(0);
  if (a.length === undefined && data.length > lim.readDefaultBytes) {
    throw new ToolError("file_too_large", `file_too_large: ${a.path} is ${size} bytes; read_file gives at most ${lim.readDefaultBytes} bytes without a length (up to ${lim.readMaxBytes} with offset and length)`, { size });
  }
  data = data.subarray(0, want);
  const enc = a.encoding ?? "auto";
  const text = enc === "utf8" || (enc === "auto" && isUtf8(data));
  const next = offset + data.length;
  return {
    path: relativeTo(h.workspace, path),
    size,
    offset,
    length: data.length,
    next_offset: next < size ? next : null,
    encoding: text ? "utf8" : "base64",
    content: text ? data.toString("utf8") : data.toString("base64"),
  };
}

/** list_files: a directory of the workspace, sorted, at most `listMaxEntries` entries. */
export async function listFiles(h: FileMachine, d: FileDeps, a: { handle: string; path?: string; depth?: number }): Promise<Record<string, unknown>> {
  const dir = workspacePath(h.workspace, a.path ?? ".");
  const r = await d.client.exec(h.borrow, shellQuote(["sh", "-c", LIST_SCRIPT, "berth-list", h.workspace, dir, String(a.depth ?? 1)]));
  if (r.status !== 0) throw scriptRefusal(r.status, r.stderr?.toString("utf8") ?? "", a.path ?? ".", h.workspace);
  const all: ListedEntry[] = parseListing(r.stdout ?? Buffer.alloc(0), h.workspace).sort((x, y) => (x.path < y.path ? -1 : x.path > y.path ? 1 : 0));
  const max = d.limits.listMaxEntries;
  return {
    path: relativeTo(h.workspace, dir),
    workspace: h.workspace,
    entries: all.slice(0, max),
    ...(all.length > max || (r.stdout?.length ?? 0) >= 1024 * 1024 ? { truncated: `more entries than shown (at most ${max}); list a subdirectory or a smaller depth` } : {}),
  };
}

function relativeTo(workspace: string, abs: string): string {
  if (abs === workspace) return ".";
  return abs.slice(workspace.length + (workspace.endsWith("/") ? 0 : 1));
}
