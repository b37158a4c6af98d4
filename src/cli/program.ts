/**
 * The command tree. Each command lives in its own module under
 * src/cli/commands and registers itself here; only the module of the command
 * being run is imported.
 */
import { Command } from "commander";
import { VERSION } from "../core/version.js";

interface CommandModule {
  register(program: Command): void;
}

const MODULES = {
  up: () => import("./commands/up.js"),
  serve: () => import("./commands/serve.js"),
  agent: () => import("./commands/agent.js"),
  token: () => import("./commands/token.js"),
  pool: () => import("./commands/pool.js"),
  borrow: () => import("./commands/borrow.js"),
  run: () => import("./commands/run.js"),
  ssh: () => import("./commands/ssh.js"),
  alloc: () => import("./commands/alloc.js"),
  volume: () => import("./commands/volume.js"),
  host: () => import("./commands/host.js"),
  image: () => import("./commands/image.js"),
} satisfies Record<string, () => Promise<CommandModule>>;

/** Which module defines each top-level command name. */
const COMMANDS: Record<string, keyof typeof MODULES> = {
  up: "up",
  serve: "serve",
  agent: "agent",
  token: "token",
  pool: "pool",
  borrow: "borrow",
  ack: "borrow",
  heartbeat: "borrow",
  return: "borrow",
  run: "run",
  ssh: "ssh",
  alloc: "alloc",
  owner: "alloc",
  volume: "volume",
  host: "host",
  image: "image",
};

export async function main(argv: string[]): Promise<void> {
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

  const name = argv[2];
  const only = name !== undefined && Object.hasOwn(COMMANDS, name) ? COMMANDS[name]! : null;
  const wanted = only ? [only] : (Object.keys(MODULES) as (keyof typeof MODULES)[]);
  const modules: CommandModule[] = await Promise.all(wanted.map((k) => MODULES[k]()));
  for (const m of modules) m.register(program);
  await program.parseAsync(argv);
}
