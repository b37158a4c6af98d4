/**
 * The command tree. Each command lives in its own module under
 * src/cli/commands and registers itself here; only the module of the command
 * being run is imported.
 */
import { Command } from "commander";
import { VERSION } from "../core/version.js";
import { setCommandPath } from "./io.js";

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
  cp: () => import("./commands/cp.js"),
  alloc: () => import("./commands/alloc.js"),
  volume: () => import("./commands/volume.js"),
  host: () => import("./commands/host.js"),
  image: () => import("./commands/image.js"),
  mcp: () => import("./commands/mcp.js"),
  aws: () => import("./commands/aws.js"),
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
  cp: "cp",
  alloc: "alloc",
  owner: "alloc",
  volume: "volume",
  host: "host",
  image: "image",
  mcp: "mcp",
  aws: "aws",
};

export async function main(argv: string[]): Promise<void> {
  const program = new Command();
  program
    .name("berth")
    .description("Borrow isolated machines: warm sandboxes reached over SSH, fenced and scrubbed between borrowers.")
    .version(VERSION)
    .option("--debug", "print the stack of an unexpected error (or BERTH_DEBUG=1)")
    .addHelpText(
      "after",
      `
Keys: a keeper pool (the default; \`berth up\` makes one) is reached with the
keeper's own key, kept in the state directory (.berth/keeper_ed25519) and
installed on its machines. A portable pool (--access portable, \`berth up
--portable\`) gives each borrow its own key, made on your side and valid only
for that borrow.

Start here:
  berth up -- echo hello          everything on this machine, run one command, tear down
  berth up                         keep it running; then: berth run --pool default -- CMD

Exit status: 0 ok, 1 error, 2 usage, 69 unavailable, 141 output closed (a pipe's reader
went away); \`berth run\` exits with the command's own status (see its --help).`,
    )
    // Usage errors are one line (commander's "error: …" as "berth: …") and a pointer to the command's help.
    .configureOutput({ outputError: (text, write) => write(text.replace(/^error: /, "berth: ")) });

  // Set before the commands are added: subcommands inherit it, so every usage error exits 2.
  program.exitOverride((err) => {
    process.exit(err.exitCode === 0 ? 0 : 2);
  });

  const name = argv[2];
  const only = name !== undefined && Object.hasOwn(COMMANDS, name) ? COMMANDS[name]! : null;
  const wanted = only ? [only] : (Object.keys(MODULES) as (keyof typeof MODULES)[]);
  const modules: CommandModule[] = await Promise.all(wanted.map((k) => MODULES[k]()));
  for (const m of modules) m.register(program);
  pointToHelp(program, "berth");
  // Usage errors found by a command's own action point to that command's help.
  program.hook("preAction", (_top, action) => {
    const names: string[] = [];
    for (let c: Command | null = action; c && c !== program; c = c.parent) names.unshift(c.name());
    setCommandPath(["berth", ...names].join(" "));
  });
  await program.parseAsync(argv);
}

/** Every command's usage error ends with where its help is (not the whole help). */
function pointToHelp(c: Command, path: string): void {
  c.showHelpAfterError(`(see: ${path} --help)`);
  for (const sub of c.commands) pointToHelp(sub, `${path} ${sub.name()}`);
}
