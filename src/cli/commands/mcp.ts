/**
 * `berth mcp`: an MCP server (Model Context Protocol) that lets an agent
 * borrow machines, run commands and move files on them (src/mcp/, docs/mcp.md).
 * stdio by default (one session per process); `--listen HOST:PORT` serves
 * Streamable HTTP, one session per client, each with the berth API token it
 * presents as its bearer token.
 */
import type { Command } from "commander";
import { InvalidArgumentError, Option } from "commander";
import { BerthClient } from "../../client/client.js";
import { loadConfig } from "../../client/config.js";
import { parseBytes } from "../../core/bytes.js";
import { runCommand } from "../common.js";

function bytesArg(name: string) {
  return (v: string): number => {
    try {
      return parseBytes(v, name);
    } catch (e) {
      throw new InvalidArgumentError((e as Error).message.replace(/^invalid_request: /, ""));
    }
  };
}

interface McpFlags {
  url?: string;
  tokenFile?: string;
  config?: string;
  pool?: string;
  listen?: string;
  inlineOutput: number;
  spillLimit: number;
  spillDir?: string;
  idleTimeout: number;
}

export function register(program: Command): void {
  program
    .command("mcp")
    .description("Serve MCP (Model Context Protocol) tools to borrow machines, run commands and move files: stdio by default, Streamable HTTP with --listen")
    .option("--url <url>", "coordinator URL (or BERTH_URL)")
    .option("--token-file <file>", "API token file (or BERTH_TOKEN_FILE); stdio only: over HTTP each client presents its own token")
    .option("--config <file>", "client config file (or BERTH_CONFIG; default .berth/client.json, which also names the keeper key)")
    .option("--pool <name>", "the pool borrow_machine uses when none is named (or BERTH_POOL, else the config's pool)")
    .option("--listen <host:port>", "serve Streamable HTTP at http://HOST:PORT/mcp instead of stdio; clients send Authorization: Bearer <their berth API token>")
    .addOption(new Option("--inline-output <size>", "bytes of stdout and of stderr shown in a run_command result").argParser(bytesArg("--inline-output")).default(16 * 1024, "16K"))
    .addOption(new Option("--spill-limit <size>", "output kept per session for read_output (oldest deleted first)").argParser(bytesArg("--spill-limit")).default(512 * 1024 * 1024, "512M"))
    .option("--spill-dir <dir>", "where sessions' output files are kept (default: the system temp directory)")
    .addOption(new Option("--idle-timeout <seconds>", "HTTP: a session without requests for this long ends (its machines are returned)").argParser((v) => Number(v)).default(600))
    .addHelpText(
      "after",
      `
Tools: list_pools, borrow_machine, run_command, read_output, write_file, read_file,
list_files, return_machine. Every machine a session borrowed is returned when the
session ends (stdio: stdin closes, SIGINT/SIGTERM/SIGHUP; HTTP: DELETE, idle
timeout, or the server stopping). Logs go to stderr; stdout carries only MCP.

Example MCP client entry (stdio):
  { "command": "berth", "args": ["mcp"], "env": { "BERTH_CONFIG": "/path/to/.berth/client.json" } }`,
    )
    .action((o: McpFlags) =>
      runCommand(async () => {
        const { DEFAULT_LIMITS } = await import("../../mcp/limits.js");
        const limits = { ...DEFAULT_LIMITS, inlineBytes: o.inlineOutput, spillLimit: o.spillLimit, ...(o.spillDir ? { spillDir: o.spillDir } : {}) };
        const log = (line: string) => process.stderr.write(`berth mcp: ${line}\n`);
        if (o.listen) {
          const config = loadConfig({ url: o.url, tokenFile: o.tokenFile, config: o.config }, { requireToken: false });
          const { serveHttp } = await import("../../mcp/http.js");
          const status = await serveHttp({ listen: o.listen, url: config.url, keeperKeyFile: config.keeperKeyFile, defaultPool: o.pool ?? config.pool, limits, idleMs: o.idleTimeout * 1000, log });
          process.exit(status);
        }
        const config = loadConfig({ url: o.url, tokenFile: o.tokenFile, config: o.config });
        const client = new BerthClient({ url: config.url, token: config.token, keeperKeyFile: config.keeperKeyFile });
        const { serveStdio } = await import("../../mcp/stdio.js");
        const status = await serveStdio({ client, defaultPool: o.pool ?? config.pool, keeperKey: config.keeperKeyFile !== null, limits, log });
        await client.close();
        // stdin may still be open (a signal ended the session): nothing else is left to wait for.
        process.exit(status);
      }),
    );
}
