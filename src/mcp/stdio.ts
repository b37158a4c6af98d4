/**
 * `berth mcp` over stdio: one session for the life of the process, JSON-RPC on
 * stdin/stdout (the SDK's StdioServerTransport), operator lines on stderr.
 *
 * The session ends — every machine it holds is returned, its spill files
 * deleted — when stdin closes (the client exited or closed the pipe), on
 * SIGINT, SIGTERM or SIGHUP, or when the transport fails. The process exits
 * after the returns finished: 0 on stdin's end, 128 + n for a signal.
 */
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import type { BerthClient } from "../client/client.js";
import type { SessionLimits } from "./limits.js";
import { McpSession } from "./session.js";
import { buildServer } from "./tools.js";

export interface McpServeOptions {
  client: BerthClient;
  defaultPool: string | null;
  keeperKey: boolean;
  limits: SessionLimits;
  log: (line: string) => void;
}

export function toolOptions(l: SessionLimits) {
  return {
    inlineBytes: l.inlineBytes,
    defaultTimeoutS: l.defaultTimeoutMs / 1000,
    maxTimeoutS: l.maxTimeoutMs / 1000,
    writeMaxBytes: l.writeMaxBytes,
    readDefaultBytes: l.readDefaultBytes,
    readMaxBytes: l.readMaxBytes,
  };
}

const SIGNAL_EXIT: Record<string, number> = { SIGINT: 130, SIGTERM: 143, SIGHUP: 129 };

/** Serves one session on stdin/stdout; resolves with the exit status once the session ended. */
export function serveStdio(o: McpServeOptions): Promise<number> {
  const session = new McpSession({ client: o.client, defaultPool: o.defaultPool, keeperKey: o.keeperKey, limits: o.limits, log: o.log });
  const server = buildServer(session, toolOptions(o.limits));
  const transport = new StdioServerTransport();
  if (process.stdin.isTTY) o.log("serving MCP on stdin/stdout, for an MCP client to start (docs/mcp.md); Ctrl-D or Ctrl-C ends");
  return new Promise((resolve) => {
    let ending = false;
    const end = (why: string, status: number) => {
      if (ending) return;
      ending = true;
      for (const s of Object.keys(SIGNAL_EXIT)) process.off(s, onSignal);
      const held = session.handles.length;
      if (held > 0) o.log(`session ended (${why}): returning ${held} machine${held === 1 ? "" : "s"}`);
      void session
        .close(why)
        .then(() => server.close())
        .catch((e: unknown) => o.log(`closing: ${(e as Error).message}`))
        .finally(() => resolve(status));
    };
    const onSignal = (sig: NodeJS.Signals) => end(sig, SIGNAL_EXIT[sig] ?? 1);
    for (const s of Object.keys(SIGNAL_EXIT)) process.on(s, onSignal);
    process.stdin.once("end", () => end("stdin closed", 0));
    process.stdin.once("close", () => end("stdin closed", 0));
    // A client gone while we write (EPIPE on stdout) ends the session too.
    process.stdout.on("error", () => end("stdout closed", 0));
    transport.onclose = () => end("transport closed", 0);
    server.connect(transport).catch((e: unknown) => {
      o.log(`cannot start: ${(e as Error).message}`);
      end("transport failed", 1);
    });
  });
}
