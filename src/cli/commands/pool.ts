/** `berth pool ensure|ls|show|resume`. */
import type { Command } from "commander";
import { Option } from "commander";
import { readFileSync } from "node:fs";
import { BerthError } from "../../core/errors.js";
import { formatDuration } from "../../core/durations.js";
import { clientFrom, durationArg, intArg, printJson, printTable, runCommand } from "../common.js";
import type { Api } from "../api.js";
import type { RouteReply } from "../../protocol/api.js";
import { makePolicy } from "../../core/network-policy.js";
import { canonicalImage } from "../../core/image-ref.js";

type PoolView = RouteReply<"GET /v1/pools/{pool}">;

/** One line for the pool's network policy. */
function networkLine(n: PoolView["network"]): string {
  if (!n || n.mode === "none") return "none";
  const dns = n.dns && n.dns.length > 0 ? `dns ${n.dns.join(", ")}` : "no resolver";
  return `egress to ${(n.allow ?? []).join(", ") || "nothing"}; ${dns} (${n.fingerprint})`;
}

function clientOpts(c: Command): Command {
  return c.option("--url <url>", "coordinator URL (or BERTH_URL)").option("--token-file <file>", "API token file (or BERTH_TOKEN_FILE)").option("--config <file>", "client config file").option("--json", "print JSON", false);
}

export async function waitReady(api: Api, name: string, want: number, timeoutMs: number, progress: (s: string) => void): Promise<PoolView> {
  const started = Date.now();
  const deadline = started + timeoutMs;
  let last = "";
  for (;;) {
    const p = await api.send("GET /v1/pools/{pool}", { pool: name });
    const ready = p.counts?.ready ?? 0;
    const err = p.provisionError && p.provisionError.at >= started - 1000 ? p.provisionError : null;
    // Why it is short, as the coordinator sees it (hosts full and which pool holds the slots, at its maximum, …).
    // The coordinator's advice to a borrower ("try again shortly") is not this wait's: it is waiting already.
    const why = ready < want && p.shortfall && !err ? p.shortfall.replace(/; try again shortly/, "") : null;
    const line = `pool ${name}: ${ready} ready (waiting for ${want}), ${p.counts?.openClaims ?? 0} provisioning${err ? `; provisioning ${err.state === "failed" ? "failed" : "is retrying"}: ${err.error}` : ""}${why ? `: ${why}` : ""}`;
    if (line !== last) progress(line);
    last = line;
    if (ready >= want) return p;
    // A provision the coordinator gave up on (a bad image, a refusal) will fail the same way again: say so now.
    if (err && err.state === "failed" && ready === 0) throw new BerthError("operation_failed", `operation_failed: pool ${name}: provisioning failed: ${err.error}`);
    if (Date.now() >= deadline) throw new BerthError("pool_exhausted", `pool_exhausted: pool ${name} reached ${ready} of ${want} ready machines before the wait ran out${why ? `: ${why}` : ""}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

export function register(program: Command): void {
  const pool = program.command("pool").description("Pools of compatible machines: desired capacity and status");
  registerEnsure(pool);
  registerLs(pool);
  registerShow(pool);
  registerResume(pool);
}

/** `berth pool ensure`: create or update a pool's desired capacity (and wait for it with --wait). */
function registerEnsure(pool: Command): void {
  clientOpts(
    pool
      .command("ensure")
      .description("Create or update a pool's desired capacity; issues fill claims while ready < min-ready")
      .argument("<name>", "pool name")
      .requiredOption("--min-ready <n>", "keep at least this many machines ready", intArg("--min-ready", 0, 1000))
      .requiredOption("--max-ready <n>", "never more than this many machines (ready + lent + in cleanup + claims)", intArg("--max-ready", 0, 1000))
      .requiredOption("--compatibility-key <key>", "what makes machines interchangeable, e.g. linux-x64-node20")
      .addOption(new Option("--access <mode>", "keeper (default) or portable (per-borrow keys; needs a coordinator started with --portable)").choices(["keeper", "portable"]).default("keeper"))
      .addOption(new Option("--provider <name>", "hosts: berth agents create machines; aws: EC2 instances (berth serve --aws-config); external: you register them with claim tokens").choices(["hosts", "aws", "external"]).default("hosts"))
      .option("--hard-ttl <duration>", "machine lifetime before rotation", durationArg("--hard-ttl"))
      .option("--heartbeat <duration>", "borrow heartbeat interval", durationArg("--heartbeat"))
      .option("--keeper-key <file>", "public key file installed on keeper machines (the keeper's own key)")
      .option("--image-id <id>", "typed identity: provider-scoped immutable image id")
      .option("--image <ref>", "what the machines boot: oci:DIR[:TAG], docker-archive:FILE, dir:PATH, REGISTRY/NAME:TAG or …@sha256:… (gvisor hosts), ami:ami-… (aws); docs/images.md")
      .addOption(new Option("--network <mode>", "none (default: gvisor machines have no network, process machines the host's) or egress (own namespace, allow list only)").choices(["none", "egress"]).default("none"))
      .option("--allow <entry>", "egress allow entry: CIDR, CIDR:PORT or NAME:PORT (repeatable; names are resolved and pinned by the agent)", (v: string, acc: string[]) => [...acc, v], [] as string[])
      .option("--dns <ip>", "a DNS resolver the machines may query (repeatable; none: pinned names only)", (v: string, acc: string[]) => [...acc, v], [] as string[])
      .addOption(new Option("--forwarding <mode>", "on (default): ssh -L/-W reach the machines' own ports; off: every forward is refused (docs/sessions.md)").choices(["on", "off"]).default("on"))
      .addOption(new Option("--files <scope>", "machine (default): SFTP sees what the machine's user sees; workspace: SFTP is confined to the workspace (docs/files.md)").choices(["machine", "workspace"]).default("machine"))
      .option("--wait", "wait until min-ready machines are ready", false)
      .addOption(new Option("--timeout <duration>", "how long --wait waits").argParser(durationArg("--timeout")).default(300_000, "5m")),
  ).action(
    (name: string, o: { minReady: number; maxReady: number; compatibilityKey: string; access: string; provider: string; hardTtl?: number; heartbeat?: number; keeperKey?: string; imageId?: string; image?: string; network: "none" | "egress"; forwarding: "on" | "off"; files: "machine" | "workspace"; allow: string[]; dns: string[]; wait: boolean; timeout: number; json: boolean; url?: string; tokenFile?: string; config?: string }) =>
      runCommand(async () => {
        // Checked here too, so a typo is refused before any request.
        const network = makePolicy(o.network, o.allow, o.dns);
        const image = o.image !== undefined ? canonicalImage(o.image) : null;
        const { api, config } = clientFrom(o);
        try {
          let keeperKey: string | null = null;
          const keyFile = o.keeperKey ?? (o.access === "keeper" && o.provider === "hosts" && config.keeperKeyFile ? `${config.keeperKeyFile}.pub` : undefined);
          if (keyFile) keeperKey = readFileSync(keyFile, "utf8").trim();
          const res = await api.send("POST /v1/pools/{pool}/ensure", { pool: name }, {
            minReady: o.minReady,
            maxReady: o.maxReady,
            compatibilityKey: o.compatibilityKey,
            access: o.access,
            provider: o.provider,
            ...(o.hardTtl ? { hardTtlMs: o.hardTtl } : {}),
            ...(o.heartbeat ? { heartbeatMs: o.heartbeat } : {}),
            ...(o.imageId ? { identity: { imageId: o.imageId } } : {}),
            ...(image !== null ? { image } : {}),
            keeperKey,
            network,
            forwarding: o.forwarding,
            files: o.files,
          });
          let view = res;
          if (o.wait) view = { ...res, ...(await waitReady(api, name, o.minReady, o.timeout, (s) => process.stderr.write(s + "\n"))) };
          if (o.json) printJson(view);
          else {
            process.stdout.write(`pool ${res.name}: ${res.access}, ${res.provider}, min ${res.minReady} / max ${res.maxReady}, ready ${view.counts?.ready ?? 0}, network ${networkLine(res.network)}${res.forwarding === "off" ? ", forwarding off" : ""}${res.files === "workspace" ? ", files workspace" : ""}${res.image ? `, image ${res.image}` : ""}\n`);
            for (const c of res.claims ?? []) process.stdout.write(`fill claim ${c.id} (expires ${new Date(c.expiresAt).toISOString()}): register with POST /v1/pools/${res.name}/machines\n`);
            if (res.note) process.stdout.write(`note: ${res.note}\n`);
          }
          return 0;
        } finally {
          await api.close();
        }
      }),
  );
}

/** `berth pool ls`: every pool. */
function registerLs(pool: Command): void {
  clientOpts(pool.command("ls").description("List pools")).action((o: { json: boolean; url?: string; tokenFile?: string; config?: string }) =>
    runCommand(async () => {
      const { api } = clientFrom(o);
      try {
        const r = await api.send("GET /v1/pools", {});
        if (o.json) printJson(r.pools);
        else printTable(["NAME", "ACCESS", "PROVIDER", "READY", "MACHINES", "MIN", "MAX", "KEY", "IMAGE"], r.pools.map((p) => [p.name, p.access, p.provider, p.ready ?? 0, p.machines ?? 0, p.minReady, p.maxReady, p.compatibilityKey, p.image ?? "-"]));
        return 0;
      } finally {
        await api.close();
      }
    }),
  );
}

/** `berth pool show`: a pool's settings, breakers, machines by state and readiness evidence. */
function registerShow(pool: Command): void {
  clientOpts(pool.command("show").description("Show a pool's settings and machines by state").argument("<name>", "pool name")).action(
    (name: string, o: { json: boolean; url?: string; tokenFile?: string; config?: string }) =>
      runCommand(async () => {
        const { api } = clientFrom(o);
        try {
          const p = await api.send("GET /v1/pools/{pool}", { pool: name });
          if (o.json) printJson(p);
          else {
            process.stdout.write(
              `pool ${p.name}\n  access          ${p.access}\n  provider        ${p.provider}\n  compatibility   ${p.compatibilityKey}\n  capacity        min ${p.minReady}, max ${p.maxReady}\n  hard TTL        ${formatDuration(p.hardTtlMs)}\n  heartbeat       ${formatDuration(p.heartbeatMs)}\n  ready           ${p.counts?.ready ?? 0}\n  lent            ${p.counts?.lent ?? 0}\n  in cleanup      ${p.counts?.cleanup ?? 0}\n  claims open     ${p.counts?.openClaims ?? 0}\n`,
            );
            process.stdout.write(`  network         ${networkLine(p.network)}\n`);
            process.stdout.write(`  image           ${p.image ?? "the host's root"}\n`);
            process.stdout.write(`  forwarding      ${p.forwarding ?? "on"}\n`);
            process.stdout.write(`  files           ${p.files ?? "machine"}\n`);
            if (p.provisionError) {
              const e = p.provisionError;
              process.stdout.write(`  provisioning    ${e.state === "failed" ? "FAILED" : "retrying"} (${new Date(e.at).toISOString()}, machine ${e.machineId}): ${e.error}\n`);
            }
            const br = p.provisionBreaker;
            if (br && br.openUntil !== null && br.openUntil > Date.now()) {
              process.stdout.write(`  launching       PAUSED until ${new Date(br.openUntil).toISOString()} (breaker open, trip ${br.trips}): ${br.cause ?? "unknown"}\n                  fix the cause, then: berth pool resume ${p.name}\n`);
            } else if (br && br.failures > 0) {
              process.stdout.write(`  launching       ${br.failures} failed provision(s) in a row: ${br.cause ?? "unknown"}\n`);
            }
            for (const pb of p.placementBreakers ?? []) {
              const open = pb.openUntil !== null && pb.openUntil > Date.now();
              const what = open ? `BACKED OFF until ${new Date(pb.openUntil!).toISOString()} (trip ${pb.trips})` : `${pb.failures} failed provision(s) in a row`;
              process.stdout.write(`  placement       ${pb.placement}: ${what}: ${pb.cause ?? "unknown"}\n`);
            }
            const states = Object.entries(p.states ?? {});
            if (states.length) process.stdout.write(`  machines        ${states.map(([s, n]) => `${s} ${n}`).join(", ")}\n`);
            if (p.network && p.network.mode !== "none" && (p.networks ?? []).length > 0) {
              process.stdout.write("  readiness evidence\n");
              printTable(
                ["    MACHINE", "STATE", "GEN", "RESULT", "POLICY", "PROBED GEN", "CHECKS", "AT"],
                (p.networks ?? []).map((m) => {
                  const e = m.evidence;
                  return [`    ${m.id}`, m.state, m.generation, e?.result ?? "-", m.policyFingerprint, e?.generation ?? "-", e ? `${e.checks.filter((c) => c.ok).length}/${e.checks.length} ok` : "-", e ? new Date(e.at).toISOString() : "-"];
                }),
              );
            }
          }
          return 0;
        } finally {
          await api.close();
        }
      }),
  );
}

/** `berth pool resume`: close a pool's provisioning breakers. */
function registerResume(pool: Command): void {
  clientOpts(pool.command("resume").description("Close a pool's provisioning breakers, the pool's and its placements' (after fixing why its launches failed), and let it fill now").argument("<name>", "pool name")).action(
    (name: string, o: { json: boolean; url?: string; tokenFile?: string; config?: string }) =>
      runCommand(async () => {
        const { api } = clientFrom(o);
        try {
          const r = await api.send("POST /v1/pools/{pool}/resume", { pool: name });
          if (o.json) printJson(r);
          else process.stdout.write(r.resumed ? `pool ${r.pool}: breaker closed; filling again\n` : `pool ${r.pool}: the breaker was not open; nothing to resume\n`);
          return 0;
        } finally {
          await api.close();
        }
      }),
  );
}
