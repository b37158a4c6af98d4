/**
 * The tools `berth mcp` offers, registered on the MCP SDK's McpServer with zod
 * schemas (the SDK turns them into each tool's JSON schema and checks every
 * call against it). Every handler answers a refusal as a tool error
 * (`isError: true`, `code: message` and a hint line), never a protocol error.
 */
import { z } from "zod";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { VERSION } from "../core/version.js";
import { invalid, toolError } from "./errors.js";
import type { McpSession } from "./session.js";

type Result = { content: { type: "text"; text: string }[]; isError?: boolean; [k: string]: unknown };

function answer(fn: () => Promise<Record<string, unknown>>): Promise<Result> {
  return fn().then(
    (r) => ({ content: [{ type: "text" as const, text: JSON.stringify(r, null, 2) }] }),
    (e: unknown) => toolError(e),
  );
}

const handle = z.string().min(1).describe("The machine handle borrow_machine returned in this session.");

/** The limits the tools' descriptions and schemas state (from the session's limits; stdio.ts `toolOptions`). */
interface ToolOptions {
  inlineBytes: number;
  defaultTimeoutS: number;
  maxTimeoutS: number;
  writeMaxBytes: number;
  readDefaultBytes: number;
  readMaxBytes: number;
}

/** One tool's registration: its name, title, description, input schema, hints and handler. */
type Tool = (server: McpServer, session: McpSession, o: ToolOptions) => void;

const listPools: Tool = (server, session) =>
  server.registerTool(
    "list_pools",
    {
      title: "List pools",
      description: "Pools of machines this server's token may borrow from: access mode, ready machines now, capacity limits, image, network, and the longest borrow. The pool marked default is used when borrow_machine names none.",
      inputSchema: {},
      annotations: { readOnlyHint: true, openWorldHint: false },
    },
    () => answer(() => session.listPools()),
  );

const borrowMachine: Tool = (server, session) =>
  server.registerTool(
    "borrow_machine",
    {
      title: "Borrow a machine",
      description:
        "Borrow a ready machine from a pool. Returns a handle for the other tools, the deadline (hard: nothing extends it; commands are cut there), what the machine is (image, network) and its workspace directory. Return it with return_machine when done; it is returned anyway when this session ends.",
      inputSchema: {
        pool: z.string().min(1).optional().describe("Pool name (list_pools); default: the server's default pool."),
        duration_seconds: z.number().int().min(1).max(1800).optional().describe("How long you need it (at most 1800 s, and never past the machine's hard deadline). The machine is returned then."),
        wait_seconds: z.number().min(0).max(120).optional().describe("How long to wait when no machine is ready right now (default 5)."),
      },
      annotations: { destructiveHint: false, openWorldHint: false },
    },
    (a) => answer(() => session.borrowMachine(a)),
  );

const runCommand: Tool = (server, session, o) =>
  server.registerTool(
    "run_command",
    {
      title: "Run a command",
      description: `Run a command on a borrowed machine and wait for it. By default command is an argv array run exactly (no shell: ["grep", "-r", "foo bar", "."]); for pipes, &&, redirection or globs pass one string and shell: true. Returns exit_status, stdout and stderr. Each stream shows at most its first ${o.inlineBytes} bytes; a longer one says so (stdout_truncated) and gives an output_id for read_output. A command still running after timeout_seconds (default ${o.defaultTimeoutS}) is ended (TERM, then its session is closed) and the call fails with command_timeout and the output so far.`,
      inputSchema: {
        handle,
        command: z.union([z.array(z.string()).min(1), z.string().min(1)]).describe("argv array (default), or one shell command line when shell is true."),
        shell: z.boolean().optional().describe("true: command is one string run as a script by the machine's shell (bash where present, else sh). Default false: command is an argv array run exactly (exec, no shell)."),
        stdin: z.string().optional().describe("Text given to the command's standard input (then EOF). Default: empty input."),
        stdin_base64: z.string().optional().describe("Bytes (base64) given to standard input instead of stdin."),
        cwd: z.string().optional().describe("Directory to start in, relative to the workspace (or absolute inside it). Default: the workspace."),
        env: z.record(z.string(), z.string()).optional().describe("Environment variables to set for the command."),
        timeout_seconds: z.number().positive().max(o.maxTimeoutS).optional().describe(`Seconds before the command is ended (default ${o.defaultTimeoutS}, at most ${o.maxTimeoutS}).`),
      },
      annotations: { destructiveHint: true, openWorldHint: false },
    },
    (a) => answer(() => session.runCommand(a)),
  );

const readOutput: Tool = (server, session) =>
  server.registerTool(
    "read_output",
    {
      title: "Read command output",
      description: "Read more of a command's stdout or stderr that run_command truncated, by byte offset. Outputs stay readable until this session ends (older ones may be deleted first if the session keeps a lot of output).",
      inputSchema: {
        output_id: z.string().min(1).describe("output_id from a run_command result."),
        stream: z.enum(["stdout", "stderr"]),
        offset: z.number().int().min(0).optional().describe("Byte offset to start at (default 0); next_offset in the answer continues."),
        length: z.number().int().min(1).max(1024 * 1024).optional().describe("Bytes to read (default 65536, at most 1048576)."),
        encoding: z.enum(["utf8", "base64"]).optional().describe("utf8 (default; cut at a whole character) or base64 for exact bytes."),
      },
      annotations: { readOnlyHint: true, openWorldHint: false },
    },
    (a) => answer(() => session.readOutput(a)),
  );

const writeFile: Tool = (server, session, o) =>
  server.registerTool(
    "write_file",
    {
      title: "Write a file",
      description: `Write a file in the machine's workspace (parent directories are created). Paths are relative to the workspace; a path leaving it is refused. At most ${o.writeMaxBytes} bytes per call (append: true to add more).`,
      inputSchema: {
        handle,
        path: z.string().min(1).describe("File path, relative to the workspace."),
        content: z.string().describe("The content: text, or base64 when encoding is base64."),
        encoding: z.enum(["utf8", "base64"]).optional().describe("utf8 (default) or base64 for binary content."),
        append: z.boolean().optional().describe("Append instead of replacing the file."),
      },
      annotations: { destructiveHint: true, openWorldHint: false },
    },
    (a) => answer(() => session.writeFile(a)),
  );

const readFile: Tool = (server, session, o) =>
  server.registerTool(
    "read_file",
    {
      title: "Read a file",
      description: `Read a file in the machine's workspace. Without length, files over ${o.readDefaultBytes} bytes are refused (file_too_large); with offset and length, any part (at most ${o.readMaxBytes} bytes per call). Text comes back as UTF-8, other bytes as base64 (the answer says which).`,
      inputSchema: {
        handle,
        path: z.string().min(1).describe("File path, relative to the workspace."),
        offset: z.number().int().min(0).optional().describe("Byte offset (default 0)."),
        length: z.number().int().min(1).max(o.readMaxBytes).optional().describe(`Bytes to read (at most ${o.readMaxBytes}).`),
        encoding: z.enum(["auto", "utf8", "base64"]).optional().describe("auto (default): utf8 when the bytes are valid UTF-8, else base64."),
      },
      annotations: { readOnlyHint: true, openWorldHint: false },
    },
    (a) => answer(() => session.readFile(a)),
  );

const listFiles: Tool = (server, session) =>
  server.registerTool(
    "list_files",
    {
      title: "List files",
      description: "List a directory of the machine's workspace: path (relative to the workspace), type, size, modification time. At most 1000 entries.",
      inputSchema: {
        handle,
        path: z.string().min(1).optional().describe("Directory, relative to the workspace (default: the workspace itself)."),
        depth: z.number().int().min(1).max(5).optional().describe("How many levels down (default 1)."),
      },
      annotations: { readOnlyHint: true, openWorldHint: false },
    },
    (a) => answer(() => session.listFiles(a)),
  );

const returnMachine: Tool = (server, session) =>
  server.registerTool(
    "return_machine",
    {
      title: "Return a machine",
      description: "Give the machine back (its sessions are ended, it is cleaned and lent to others). Returning it again is fine and says it was already returned. The handle cannot be used afterwards.",
      inputSchema: { handle },
      annotations: { destructiveHint: true, idempotentHint: true, openWorldHint: false },
    },
    (a) => answer(() => session.returnMachine(a)),
  );

/**
 * A server for one session: every tool call goes to `session`. Tools are
 * registered (and so listed to the client) in this order.
 */
export function buildServer(session: McpSession, o: ToolOptions): McpServer {
  const server = new McpServer(
    { name: "berth", version: VERSION },
    {
      instructions:
        "berth lends isolated machines (sandboxes). borrow_machine gives a handle; run_command, write_file, read_file and list_files use it; return_machine gives it back (every machine is also returned when this session ends). A machine has a hard deadline that nothing extends. Files live in the machine's workspace, where commands start.",
    },
  );
  // Arguments that do not match a tool's schema are refused by the SDK before the handler runs;
  // its message is given the same `invalid_request:` code and hint as every other refusal.
  const sdk = server as unknown as { createToolError?: (m: string) => Result };
  if (typeof sdk.createToolError === "function") sdk.createToolError = (m: string) => toolError(invalid(m.replace(/^MCP error -?\d+: /, "")));
  for (const register of [listPools, borrowMachine, runCommand, readOutput, writeFile, readFile, listFiles, returnMachine]) register(server, session, o);
  return server;
}
