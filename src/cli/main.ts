/**
 * The `berth` binary: one program, subcommands. Start-up cost is paid per
 * command: `--version` loads two leaf modules; any other command loads
 * commander and only the module that defines it (client commands never load
 * server code, a database driver, the PTY module or the logger). Help and
 * unknown commands load every command module, to list them.
 * Exit codes: 2 for usage errors, 141 after a closed pipe (src/cli/io.ts);
 * the rest are documented in docs/cli.md.
 */
import { VERSION } from "../core/version.js";
import { installProcessHandlers } from "./io.js";

const args = installProcessHandlers(process.argv.slice(2));
if (args.length === 1 && (args[0] === "--version" || args[0] === "-V")) {
  process.stdout.write(VERSION + "\n");
} else {
  const { main } = await import("./program.js");
  await main([...process.argv.slice(0, 2), ...args]);
}
