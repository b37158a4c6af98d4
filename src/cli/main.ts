/**
 * The `berth` binary: one program, subcommands. Each command lives in its own
 * module under src/cli/commands and registers itself on the program here.
 */
import { Command } from "commander";

const program = new Command();
program
  .name("berth")
  .description("Borrow isolated machines: warm sandboxes over SSH with a key that exists only for the borrow.")
  .version("0.1.0")
  .showHelpAfterError();

const registrations: Array<() => Promise<(p: Command) => void>> = [
  async () => (await import("./commands/agent.js")).register,
];

for (const load of registrations) {
  try {
    (await load())(program);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== "ERR_MODULE_NOT_FOUND") throw e;
  }
}

program.exitOverride((err) => {
  process.exit(err.exitCode === 0 ? 0 : 2);
});
await program.parseAsync(process.argv);
