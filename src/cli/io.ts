/**
 * The CLI's standard output and error, and what ends the process when
 * nothing else does.
 *
 * A closed pipe is a normal end, as for any Unix filter (`berth run -- yes |
 * head -2`, `berth pool ls | head -1`): the first EPIPE on stdout or stderr
 * marks the output closed, later writes to that stream are dropped, and the
 * process exits 141 (128 + SIGPIPE, what the shell reports for a filter that
 * SIGPIPE ended) once the command has finished what it must still do — `berth
 * run` first ends the remote command and returns the machine.
 *
 * An exception nothing expected prints one line and a pointer to `--debug`
 * (which prints the stack), never a stack trace by default; exit 1.
 *
 * A leaf module: the entry point loads it before anything else.
 */

/** Exit status after a closed pipe: what a shell reports for a process ended by SIGPIPE. */
export const EXIT_PIPE = 141;

let closed = false;
let debug = false;

/** `--debug` or BERTH_DEBUG=1: unexpected errors print their stack. */
export function debugEnabled(): boolean {
  return debug;
}

function isPipeError(e: unknown): boolean {
  const code = (e as NodeJS.ErrnoException | null)?.code;
  return code === "EPIPE" || code === "ERR_STREAM_DESTROYED";
}

/**
 * Installs the handlers; returns argv without berth's own `--debug` flag
 * (only before `--`: after it the words belong to the remote command).
 */
export function installProcessHandlers(argv: string[]): string[] {
  const end = argv.indexOf("--");
  const own = end < 0 ? argv : argv.slice(0, end);
  debug = own.includes("--debug") || process.env.BERTH_DEBUG === "1";
  // Children (`berth up`'s agent) inherit it.
  if (debug) process.env.BERTH_DEBUG = "1";
  const rest = end < 0 ? argv.filter((a) => a !== "--debug") : [...own.filter((a) => a !== "--debug"), ...argv.slice(end)];

  for (const s of [process.stdout, process.stderr]) {
    s.on("error", (e: unknown) => {
      if (isPipeError(e)) {
        closed = true;
        return;
      }
      fatal(e);
    });
  }
  process.on("uncaughtException", (e) => {
    if (isPipeError(e)) {
      closed = true;
      return;
    }
    fatal(e);
  });
  process.on("unhandledRejection", (e) => fatal(e));
  process.on("exit", () => {
    if (closed && !fatalExit) process.exitCode = EXIT_PIPE;
  });
  return rest;
}

let fatalExit = false;

function fatal(e: unknown): void {
  fatalExit = true;
  const err = e instanceof Error ? e : new Error(String(e));
  const line = debug ? (err.stack ?? `${err.name}: ${err.message}`) : `berth: internal error: ${err.name}: ${err.message.split("\n")[0]} (run again with --debug for details)`;
  try {
    process.stderr.write(line + "\n");
  } catch {
    /* stderr is gone too */
  }
  process.exit(1);
}

let commandPath = "berth";

/** The command being run ("berth pool ls"), for the pointer after a usage error. */
export function setCommandPath(path: string): void {
  commandPath = path;
}

/** The line after a usage error: where the command's help is. */
export function helpPointer(): string {
  return `(see: ${commandPath} --help)`;
}
