/**
 * `berth alloc create|ls|show|release|resolve|restart|plan|hosts|standing` and `berth owner
 * admit|budget|ls`: the definitions only. Each action loads its body from
 * alloc-run.ts when it runs, so other commands never pay for loading it.
 */
import type { Command } from "commander";
import { Argument, Option } from "commander";
import { durationArg, intArg } from "../common.js";

type Run = typeof import("./alloc-run.js");
const load = (): Promise<Run> => import("./alloc-run.js");

function clientOpts(c: Command): Command {
  return c.option("--url <url>", "coordinator URL (or BERTH_URL)").option("--token-file <file>", "API token file (or BERTH_TOKEN_FILE)").option("--config <file>", "client config file").option("--json", "print JSON", false);
}

const strategy = () => new Option("--strategy <s>", "binpack fills the fullest host that fits; spread the emptiest").choices(["binpack", "spread"]).default("binpack");

export function register(program: Command): void {
  const alloc = program.command("alloc").description("Allocations: sized workspaces placed on hosts and charged to your budget");

  clientOpts(
    alloc
      .command("create")
      .description("Create an allocation (retrying the same --id is safe: it answers the same allocation)")
      .requiredOption("--size <size>", "a size from the catalog (berth alloc sizes), e.g. small or large")
      .option("--id <id>", "allocation id, 1-128 of A-Z a-z 0-9 _ - (default: a fresh one)")
      .option("--for <duration>", "lifetime, e.g. 8h (default and maximum: the coordinator's policy)", durationArg("--for"))
      .addOption(strategy())
      .option("--owner <token-id>", "create for another admitted owner (operators)")
      .option("--wait", "wait until it is ready (progress on stderr while it is placed and launched)", false)
      .option("--wait-timeout <duration>", "give up waiting after this long (default 10m; the launch goes on)", durationArg("--wait-timeout"))
      .option("--key-dir <dir>", "where the allocation's private key is written (or BERTH_KEY_DIR; default ~/.local/state/berth/allocations)")
      .option("--no-key", "no key and no launch: only place and charge the allocation")
      .option("--volume <volume>", "run on a kept volume of yours (released with --keep-volume; berth volume ls) instead of a new one: it goes on that volume's host or nowhere"),
  ).action(async (o) => (await load()).create(o));

  clientOpts(alloc.command("ls").description("List your live allocations (an operator sees the organisation's)").option("--all", "include released ones", false)).action(async (o) => (await load()).list(o));
  clientOpts(alloc.command("show").description("Show one allocation and its placement plan").argument("<id>", "allocation id")).action(async (id: string, o) => (await load()).show(id, o));
  clientOpts(alloc.command("release").description("Release an allocation; slot and budget come back once its cleanup is proven").argument("<id>", "allocation id").option("--keep-volume", "keep the workspace volume", false)).action(
    async (id: string, o) => (await load()).release(id, o),
  );
  clientOpts(
    alloc
      .command("resolve")
      .description("End a quarantined allocation (operators): its sandbox is destroyed even if it no longer matches its record, the volume kept or destroyed; slot and budget come back once that is proven")
      .argument("<id>", "allocation id")
      .addOption(new Option("--keep-volume", "keep the workspace volume").conflicts(["destroy", "hostGone"]))
      .addOption(new Option("--destroy", "destroy the workspace volume too").conflicts(["keepVolume", "hostGone"]))
      .addOption(new Option("--host-gone", "its host was attested gone (berth alloc standing HOST withdrawn --host-gone): end it now, unproven").conflicts(["keepVolume", "destroy"])),
  ).action(async (id: string, o) => (await load()).resolve(id, o));
  clientOpts(
    alloc
      .command("restart")
      .description("Start a failed allocation's sandbox again (its sandbox died, e.g. past its memory limit): same host, same volume, same key; budget unchanged")
      .argument("<id>", "allocation id"),
  ).action(async (id: string, o) => (await load()).restart(id, o));
  clientOpts(alloc.command("plan").description("Dry run: where a size would go, and per host why it does not fit").requiredOption("--size <size>", "size to place").addOption(strategy())).action(async (o) => (await load()).plan(o));
  clientOpts(alloc.command("sizes").description("The size catalog and the longest lifetime allowed")).action(async (o) => (await load()).sizes(o));
  clientOpts(alloc.command("hosts").description("Hosts' standing and capacity in use by allocations")).action(async (o) => (await load()).hosts(o));
  clientOpts(
    alloc
      .command("standing")
      .description("Set a host's standing (operators): only ready hosts take new allocations; withdrawn and draining hosts never launch one")
      .argument("<host-id>", "host id (berth alloc hosts)")
      .addArgument(new Argument("<standing>", "the host's new standing").choices(["ready", "draining", "withdrawn", "not_ready"]))
      .option("--host-gone", "with withdrawn: attest the host is gone for good (its agent will never answer); the withdrawal counts without the agent's acknowledgment", false),
  ).action(async (host: string, standing: string, o) => (await load()).standing(host, standing, o));

  const owner = program.command("owner").description("Owners: API principals admitted to allocate, with a budget (operators)");
  const budgetOpts = (c: Command) =>
    clientOpts(
      c
        .argument("<token-id>", "the owner's API token id (berth token ls)")
        .requiredOption("--vcpu <n>", "vCPU budget", intArg("--vcpu", -1_000_000, 1_000_000))
        .requiredOption("--memory <size>", "memory budget, e.g. 16GiB or 512MiB (a plain number is GiB)")
        .option("--disk <size>", "disk budget, e.g. 200GiB (a plain number is GiB; default: the owner's, or 40 GiB per allocation of --count for a new owner)")
        .requiredOption("--count <n>", "most live allocations at once", intArg("--count", -1_000_000, 1_000_000)),
    );
  budgetOpts(owner.command("admit").description("Admit an owner with a budget (or set the budget of one admitted)")).action(async (id: string, o) => (await load()).budget(id, o, "admit"));
  budgetOpts(owner.command("budget").description("Change an admitted owner's budget (usage is kept)")).action(async (id: string, o) => (await load()).budget(id, o, "budget"));
  clientOpts(owner.command("ls").description("Owners with budget and use")).action(async (o) => (await load()).owners(o));
}
