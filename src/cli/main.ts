/**
 * The `berth` binary: one program, subcommands. Each command lives in its own
 * module under src/cli/commands and registers itself on the program here.
 * Exit codes: 2 for usage errors; the rest are documented in docs/cli.md.
 */
import { Command } from "commander";
import { VERSION } from "../core/version.js";
import * as agent from "./commands/agent.js";
import * as serve from "./commands/serve.js";
import * as up from "./commands/up.js";
import * as token from "./commands/token.js";
import * as pool from "./commands/pool.js";
import * as borrow from "./commands/borrow.js";
import * as run from "./commands/run.js";
import * as ssh from "./commands/ssh.js";
import * as alloc from "./commands/alloc.js";

const program = new Command();
program
  .name("berth")
  .description("Borrow isolated machines: warm sandboxes over SSH with a key that exists only for the borrow.")
  .version(VERSION)
  .showHelpAfterError()
  .addHelpText(
    "after",
    `
Start here:
  berth up -- echo hello          everything on this machine, run one command, tear down
  berth up                         keep it running; then: berth run --pool default -- CMD`,
  );

// Set before the commands are added: subcommands inherit it, so every usage error exits 2.
program.exitOverride((err) => {
  process.exit(err.exitCode === 0 ? 0 : 2);
});

for (const m of [up, serve, agent, token, pool, borrow, run, ssh, alloc]) m.register(program);
await program.parseAsync(process.argv);
