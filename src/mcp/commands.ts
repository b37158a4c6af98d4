/**
 * The commands of one `berth mcp` session: run_command (the command line sent
 * over SSH, its stdin, its timeout, its output captured by output.ts) and
 * read_output. The machine table and its way out are session.ts's.
 */
import { isUtf8 } from "node:buffer";
import type { Borrow } from "../client/borrow.js";
import type { BerthClient } from "../client/client.js";
import { shellQuote, type RemoteCommand } from "../client/ssh.js";
import { BerthError } from "../core/errors.js";
import { ToolError, decodeBase64, invalid } from "./errors.js";
import { workspacePath } from "./files.js";
import type { SessionLimits } from "./limits.js";
import { utf8Boundary, wholeUtf8, type CapturedOutput, type OutputStore, type StreamCapture } from "./output.js";

/** What a command needs of its session. */
export interface CommandDeps {
  client: BerthClient;
  limits: SessionLimits;
  outputs: OutputStore;
}

/** The machine a command runs on, as the session holds it (its running commands are ended with it). */
export interface CommandMachine {
  handle: string;
  borrow: Borrow;
  workspace: string;
  running: Set<RemoteCommand>;
}

export interface RunCommandArgs {
  handle: string;
  command: string[] | string;
  shell?: boolean;
  stdin?: string;
  stdin_base64?: string;
  cwd?: string;
  env?: Record<string, string>;
  timeout_seconds?: number;
}

const iso = (ms: number) => new Date(ms).toISOString();

/**
 * run_command on a machine this session holds: the command line, its stdin, a
 * timeout (TERM to its group, then its session closed), the output captured
 * and presented.
 */
export async function runCommand(h: CommandMachine, d: CommandDeps, a: RunCommandArgs): Promise<Record<string, unknown>> {
  const line = commandLine(a, h.workspace);
  if (a.stdin !== undefined && a.stdin_base64 !== undefined) throw invalid("give stdin or stdin_base64, not both");
  const stdin = a.stdin_base64 !== undefined ? decodeBase64(a.stdin_base64, "stdin_base64") : (a.stdin ?? null);
  const lim = d.limits;
  const askedMs = a.timeout_seconds !== undefined ? a.timeout_seconds * 1000 : lim.defaultTimeoutMs;
  if (askedMs > lim.maxTimeoutMs) throw invalid(`timeout_seconds is at most ${lim.maxTimeoutMs / 1000}`);
  const out = d.outputs.create(h.handle);
  let timedOut = false;
  let started: RemoteCommand | null = null;
  let grace: NodeJS.Timeout | null = null;
  const timer = setTimeout(() => {
    timedOut = true;
    // TERM to the command's process group, then the session is closed (the gateway ends the group).
    started?.signal("TERM");
    grace = setTimeout(() => started?.close(), 2000);
  }, askedMs);
  const t0 = Date.now();
  try {
    const res = await d.client.exec(h.borrow, line, {
      stdin,
      stdout: out.stdout,
      stderr: out.stderr,
      onStart: (cmd) => {
        started = cmd;
        h.running.add(cmd);
        if (timedOut) cmd.close();
      },
    });
    await Promise.all([endCapture(out.stdout), endCapture(out.stderr)]);
    const result = present(d, out, res.status, res.signal, Date.now() - t0);
    if (timedOut) {
      throw new ToolError("command_timeout", `command_timeout: the command ran past its timeout of ${askedMs / 1000} s and was ended (TERM, then its session closed after 2 s); its output so far is below`, { ...result, timed_out: true });
    }
    if (res.cut) {
      if (Date.now() >= h.borrow.expiresAt) throw new BerthError("borrow_expired", `borrow_expired: machine handle ${h.handle} reached its hard deadline at ${iso(h.borrow.expiresAt)} while the command ran; access was cut`);
      throw new ToolError("operation_failed", "operation_failed: the session to the machine ended without an exit status (the connection was cut); the output so far is below", result);
    }
    return result;
  } finally {
    clearTimeout(timer);
    if (grace) clearTimeout(grace);
    if (started) h.running.delete(started);
    for (const c of [out.stdout, out.stderr]) if (!c.writableEnded) c.end();
  }
}

/** The result of a finished command: exit status, the head of each stream inline, where to read the rest. */
function present(d: CommandDeps, out: CapturedOutput, status: number, signal: string | null, ms: number): Record<string, unknown> {
  const inline = d.limits.inlineBytes;
  const part = (name: "stdout" | "stderr", s: StreamCapture) => {
    const head = s.head();
    const cut = utf8Boundary(head, inline);
    const shown = head.subarray(0, cut);
    const binary = !isUtf8(shown);
    const truncated = s.total > shown.length;
    return {
      [name]: binary ? shown.toString("base64") : shown.toString("utf8"),
      ...(binary ? { [`${name}_encoding`]: "base64 (not UTF-8)" } : {}),
      [`${name}_bytes`]: s.total,
      ...(truncated ? { [`${name}_truncated`]: `shows the first ${shown.length} of ${s.total} bytes${s.dropped > 0 ? `; the last ${s.dropped} bytes were not kept (session spill limit ${d.limits.spillLimit} bytes)` : ""}; read the rest with read_output(output_id="${out.id}", stream="${name}", offset=${shown.length})` } : {}),
    };
  };
  const truncated = out.stdout.total > inline || out.stderr.total > inline;
  // An output shown whole has nothing to read back: it is not kept.
  if (!truncated) d.outputs.forget(out.id);
  return {
    exit_status: status,
    ...(signal ? { signal } : {}),
    ...part("stdout", out.stdout),
    ...part("stderr", out.stderr),
    ...(truncated ? { output_id: out.id } : {}),
    duration_ms: ms,
  };
}

/** read_output: more of a truncated stream, by byte offset (text cut at a whole character). */
export async function readOutput(d: CommandDeps, a: { output_id: string; stream: "stdout" | "stderr"; offset?: number; length?: number; encoding?: "utf8" | "base64" }): Promise<Record<string, unknown>> {
  const o = d.outputs.get(a.output_id);
  const s = a.stream === "stdout" ? o.stdout : o.stderr;
  const lim = d.limits;
  const offset = a.offset ?? 0;
  const length = Math.min(a.length ?? lim.outputReadDefaultBytes, lim.outputReadMaxBytes);
  let buf = await s.read(offset, length);
  const encoding = a.encoding ?? "utf8";
  // Text is cut at a whole UTF-8 character, so next_offset continues exactly where this ended.
  if (encoding === "utf8" && offset + buf.length < s.retrievable) {
    const whole = wholeUtf8(buf);
    if (whole > 0) buf = buf.subarray(0, whole);
  }
  const next = offset + buf.length;
  return {
    output_id: o.id,
    stream: a.stream,
    offset,
    length: buf.length,
    total_bytes: s.total,
    retrievable_bytes: s.retrievable,
    next_offset: next < s.retrievable ? next : null,
    encoding,
    data: encoding === "base64" ? buf.toString("base64") : buf.toString("utf8"),
  };
}

function endCapture(s: StreamCapture): Promise<void> {
  return new Promise((resolve, reject) => {
    if (s.writableFinished) return resolve();
    s.once("error", reject);
    s.end(() => resolve());
  });
}

const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

/**
 * The command line sent over SSH (the machine's login shell runs it: bash where present, else sh).
 *
 * argv (the default) is quoted word by word and run with `exec`, so the program gets exactly
 * these arguments (execve semantics: no shell builtins) and is itself the session's process
 * group leader: a timeout's TERM reaches it, and when it ignores TERM and HUP the gateway's
 * release escalates to KILL while that leader lives. `shell: true` runs one string as a shell
 * script. cwd (inside the workspace) and env are set by a first line (`cd`, `export`): the
 * gateway passes only a few variables as SSH env requests, so this works everywhere; when it
 * fails, the script does not run (exit 1).
 */
export function commandLine(a: { command: string[] | string; shell?: boolean; cwd?: string; env?: Record<string, string> }, workspace: string): string {
  let body: string;
  if (a.shell) {
    if (typeof a.command !== "string") throw invalid("with shell: true, command is one string (a shell command line), not an array");
    if (a.command.trim() === "") throw invalid("command is empty");
    body = a.command;
  } else {
    if (typeof a.command === "string") throw invalid("command is an array of arguments (argv), e.g. [\"ls\", \"-la\"]; for a shell command line (pipes, &&, globs) pass one string with shell: true");
    if (a.command.length === 0 || a.command[0] === "") throw invalid("command is empty; give at least the program, e.g. [\"ls\"]");
    body = `exec ${shellQuote(a.command)}`;
  }
  const prefix: string[] = [];
  if (a.cwd !== undefined) prefix.push(`cd -- ${shellQuote([workspacePath(workspace, a.cwd)])}`);
  for (const [k, v] of Object.entries(a.env ?? {})) {
    if (!ENV_NAME.test(k)) throw invalid(`env name ${JSON.stringify(k)} is not a variable name (letters, digits, _; not starting with a digit)`);
    if (v.includes("\0")) throw invalid(`env ${k} contains a NUL byte`);
    prefix.push(`export ${shellQuote([`${k}=${v}`])}`);
  }
  if (prefix.length === 0) return body;
  // On its own line, so the script's syntax cannot interact with it.
  return `${prefix.join(" && ")} || exit 1\n${body}`;
}
