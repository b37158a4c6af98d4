/**
 * `berth aws orphans [--terminate]`: instances carrying berth's tags that no
 * launch record or live machine accounts for, and launch records whose
 * instance is gone (src/providers/aws/orphans.ts). Runs against the
 * coordinator's store directly and the AWS configuration, so it works with
 * the coordinator stopped. Exit codes: 0 done (nothing found, or all of it
 * ended); 1 something found and left (listing only); 2 usage (--terminate
 * without --yes and no terminal to confirm on).
 */
import type { Command } from "commander";
import { resolve } from "node:path";
import { createInterface } from "node:readline/promises";
import { openStoreFromFlags, printJson, printTable, runCommand, UsageError } from "../common.js";

async function confirm(question: string): Promise<boolean> {
  const rl = createInterface({ input: process.stdin, output: process.stderr });
  try {
    return /^y(es)?$/i.test((await rl.question(question)).trim());
  } finally {
    rl.close();
  }
}

export function register(program: Command): void {
  const aws = program.command("aws").description("The aws provider's own commands (docs/aws.md)");
  aws
    .command("orphans")
    .description("List instances with berth's tags that no launch record or live machine accounts for, and launch records whose instance is gone")
    .requiredOption("--aws-config <file>", "the AWS configuration `berth serve --aws-config` uses")
    .option("--state-dir <dir>", "coordinator state directory", ".berth")
    .option("--db <file>", "SQLite database file (or set BERTH_PG_URL)")
    .option("--terminate", "terminate the listed instances no live machine claims and close the listed records of machines no longer live", false)
    .option("--including-live", "count every instance as unclaimed, a live machine's too (tearing a deployment down with its coordinator stopped)", false)
    .option("--yes", "with --terminate: do not ask for confirmation", false)
    .option("--json", "print JSON", false)
    .addHelpText(
      "after",
      `
Looks in every region and deployment the configuration names and any launch
record ever named. Credentials come from the AWS SDK's default chain.

Example:
  berth aws orphans --aws-config /etc/berth/aws.json --state-dir /var/lib/berth
  berth aws orphans --aws-config /etc/berth/aws.json --state-dir /var/lib/berth --terminate --yes
  # tearing a deployment down, its coordinator stopped: end every instance, live machines' too
  berth aws orphans --aws-config aws.json --state-dir .berth --including-live --terminate --yes`,
    )
    .action((o: { awsConfig: string; stateDir: string; db?: string; terminate: boolean; includingLive: boolean; yes: boolean; json: boolean }) =>
      runCommand(async () => {
        if (o.terminate && !o.yes && !(process.stdin.isTTY && process.stderr.isTTY)) {
          throw new UsageError("--terminate ends paid instances: confirm with --yes (no terminal to ask on)");
        }
        const { AwsProvider } = await import("../../providers/aws/aws-provider.js");
        const { loadAwsConfig } = await import("../../providers/aws/config.js");
        const { storeLaunchRecords } = await import("../../store/aws-launches.js");
        const { liveMachinesIn } = await import("../../providers/aws/sweep.js");
        const { findOrphans, endOrphans } = await import("../../providers/aws/orphans.js");
        const config = loadAwsConfig(resolve(o.awsConfig));
        const store = await openStoreFromFlags({ stateDir: o.stateDir, db: o.db });
        try {
          const provider = new AwsProvider({ config, records: storeLaunchRecords(store) });
          // --including-live: no machine counts as live, so every tagged instance is listed and --terminate ends it.
          const report = await findOrphans(provider, o.includingLive ? async () => new Set<string>() : liveMachinesIn(store));
          const toEnd = report.instances.filter((i) => i.terminate).length + report.records.filter((r) => r.close).length;
          let ended: { terminated: string[]; closed: string[] } | null = null;
          if (o.terminate && toEnd > 0) {
            const ok = o.yes || (await confirm(`terminate ${report.instances.filter((i) => i.terminate).length} instance(s) and close ${report.records.filter((r) => r.close).length} record(s)? [y/N] `));
            if (!ok) {
              process.stderr.write("nothing ended\n");
              return 1;
            }
            ended = await endOrphans(provider, report);
          }
          if (o.json) {
            printJson({ ...report, ...(ended ? { ended } : {}) });
          } else {
            const where = report.scopes.map((s) => `${s.region}/${s.deployment}`).join(", ") || "nowhere (no pool configured, no launch on record)";
            process.stdout.write(`looked in ${where}\n`);
            if (report.instances.length > 0) {
              printTable(
                ["INSTANCE", "REGION", "DEPLOYMENT", "MACHINE", "STATE", "WHY", "ACTION"],
                report.instances.map((i) => [i.instanceId, i.region, i.deployment, i.machineId, i.state, i.why.join(", "), i.terminate ? (ended ? "terminated" : "would terminate") : "kept (its machine is live)"]),
              );
            }
            if (report.records.length > 0) {
              printTable(
                ["RECORD", "INSTANCE", "REGION", "MACHINE", "INSTANCE STATE", "ACTION"],
                report.records.map((r) => [r.clientToken, r.instanceId, r.region, r.machineId, r.state, r.close ? (ended ? "closed" : "would close") : "kept (its machine is live)"]),
              );
            }
            if (report.instances.length === 0 && report.records.length === 0) process.stdout.write("no orphan instance and no record of a gone instance\n");
            else if (!ended && toEnd > 0) process.stdout.write("run again with --terminate to end them\n");
          }
          return ended || toEnd === 0 ? 0 : 1;
        } finally {
          await store.close();
        }
      }),
    );
}
