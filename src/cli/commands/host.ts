/**
 * `berth host ls | activate` (docs/host-identity.md): the enrolled hosts with
 * their credential state, and the one-way switch of a host (or all) from the
 * shared enroll token to its own identity key.
 *
 * Exit codes: 0 ok; 1 refused (host_busy: lent machines, use --force);
 * 2 usage; 69 the agent could not be reached.
 */
import { Option, type Command } from "commander";
import { BerthError } from "../../core/errors.js";
import { gib } from "../../core/allocation-sizes.js";
import { clientFrom, durationArg, iso, printJson, printTable, runCommand } from "../common.js";
import type { Api } from "../api.js";
import type { RouteReply } from "../../protocol/api.js";

type HostView = RouteReply<"GET /v1/hosts">["hosts"][number];

type Activated = RouteReply<"POST /v1/hosts/{host}/activate">;

function clientOpts(c: Command): Command {
  return c.option("--url <url>", "coordinator URL (or BERTH_URL)").option("--token-file <file>", "API token file (or BERTH_TOKEN_FILE)").option("--config <file>", "client config file").option("--json", "print JSON", false);
}

/** `gvisor systrap (runsc 0.0~20240729.0)`, or the bare kind. */
function runtimeCell(h: HostView): string {
  return h.runsc ? `${h.runtime} ${h.runsc.platform} (runsc ${h.runsc.version})` : h.runtime;
}

async function listHosts(api: Api): Promise<HostView[]> {
  return (await api.send("GET /v1/hosts", {})).hosts;
}

async function waitActive(api: Api, names: string[], timeoutMs: number, say: (s: string) => void): Promise<HostView[]> {
  const deadline = Date.now() + timeoutMs;
  let last = "";
  for (;;) {
    const hosts = (await listHosts(api)).filter((h) => names.includes(h.name));
    const line = hosts.map((h) => `${h.name}: ${h.identity.state}${h.identity.owedReports ? ` (${h.identity.owedReports} report(s) owed)` : ""}`).join(", ");
    if (line !== last) say(line);
    last = line;
    if (hosts.every((h) => h.identity.state === "active")) return hosts;
    if (Date.now() >= deadline) throw new BerthError("operation_failed", `operation_failed: not every host was active before the wait ran out (${line}); see \`berth host ls\` and the agents' logs`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

export function register(program: Command): void {
  const host = program.command("host").description("Enrolled hosts: credential state, and the switch to per-host identity keys");
  registerLs(host);
  registerResetIdentity(host);
  registerRm(host);
  registerActivate(host);
}

/** `berth host ls`: every host, its runtime and credential state. */
function registerLs(host: Command): void {
  clientOpts(host.command("ls").description("List hosts: runtime (runsc release and gVisor platform), credential state, switch step, owed reports, agent version")).action(
    (o: { json: boolean; url?: string; tokenFile?: string; config?: string }) =>
      runCommand(async () => {
        const { api } = clientFrom(o);
        try {
          const hosts = await listHosts(api);
          if (o.json) printJson(hosts);
          else
            printTable(
              ["NAME", "ID", "RUNTIME", "CREDENTIAL", "STEP", "OWED", "AGENT", "SLOTS", "DISK", "KEY", "SINCE"],
              hosts.map((h) => [h.name, h.id, runtimeCell(h), h.identity.state === "legacy" ? "enroll-token" : `key (${h.identity.state})`, h.identity.agentStep, h.identity.owedReports, h.identity.agentVersion, `${h.usedSlots}/${h.capacity.slots}`, h.capacity.diskMib === null || h.capacity.diskMib === undefined ? "-" : `${gib(h.capacity.diskMib)} GiB`, h.identity.keyFingerprint, iso(h.identity.since)]),
            );
          for (const h of hosts) if (!o.json && h.runtimeWarning) process.stderr.write(`warning: host ${h.name}: ${h.runtimeWarning}\n`);
          return 0;
        } finally {
          await api.close();
        }
      }),
  );
}

/** `berth host reset-identity`: back to awaiting its agent, with a one-time enroll token. */
function registerResetIdentity(host: Command): void {
  clientOpts(
    host
      .command("reset-identity")
      .summary("Put a host back to awaiting its agent, with a one-time enroll token that binds a new identity key")
      .description(
        "Put a host back to awaiting its agent: its recorded identity key is forgotten, its host credentials are " +
          "revoked, and a one-time enroll token is printed (once). Start the host's real agent with that token " +
          "(--enroll-token-file): its enrollment proves its key, the host is active on it, and the token is spent. " +
          "The shared enroll token is still refused for the host. Refused while the host lends a machine (host_busy). " +
          "Needs an admin token; audited (host_identity_reset).",
      )
      .argument("<host>", "host name (see `berth host ls`)"),
  ).action((name: string, o: { json: boolean; url?: string; tokenFile?: string; config?: string }) =>
    runCommand(async () => {
      const { api } = clientFrom(o);
      try {
        const r = await api.send("POST /v1/hosts/{host}/reset-identity", { host: name }, {});
        if (o.json) printJson(r);
        else {
          process.stderr.write(
            `host ${r.host} (${r.hostId}) awaits its agent. Write the one-time enroll token below to a file (mode 0600) and start the host's agent with --enroll-token-file FILE; it is shown only now.\n`,
          );
          process.stdout.write(`${r.enrollToken}\n`);
        }
        return 0;
      } finally {
        await api.close();
      }
    }),
  );
}

/** `berth host rm`: drain, destroy and forget a host. */
function registerRm(host: Command): void {
  clientOpts(
    host
      .command("rm")
      .summary("Remove a host: drain and destroy its machines, then forget it (any state, a stranded one included)")
      .description(
        "Remove a host, whatever its state (legacy, switching, stranded, awaiting, active). It takes no new machine " +
          "or allocation from the first call on; its machines are drained and destroyed by its agent; its row, " +
          "credentials and capacity go once nothing of it is live. Refused (host_busy) while it lends a machine or " +
          "holds a live allocation, unless --force, which ends those borrows (their sessions are cut) and releases " +
          "those allocations. Without --wait the answer may be `removing`: call again (or add --wait) to finish. " +
          "Needs an admin token; audited (host_removing, host_removed).",
      )
      .argument("<host>", "host name (see `berth host ls`)")
      .option("--force", "end the borrows and release the allocations of the host instead of refusing", false)
      .option("--wait", "wait until the host is removed", false)
      .addOption(new Option("--timeout <duration>", "how long --wait waits").argParser(durationArg("--timeout")).default(120_000, "2m")),
  ).action((name: string, o: { force: boolean; wait: boolean; timeout: number; json: boolean; url?: string; tokenFile?: string; config?: string }) =>
    runCommand(async () => {
      const { api } = clientFrom(o);
      try {
        const deadline = Date.now() + o.timeout;
        let r = await api.send("POST /v1/hosts/{host}/remove", { host: name }, { force: o.force });
        while (o.wait && r.state !== "removed") {
          if (Date.now() >= deadline) {
            throw new BerthError(
              "operation_failed",
              `operation_failed: host ${name} still has ${r.machines} machine(s) and ${r.allocations} allocation(s) live when the wait ran out; its agent destroys them (see its log), then run \`berth host rm ${name}\` again`,
            );
          }
          await new Promise((res) => setTimeout(res, 1000));
          // Later calls only drain what is left: the first one already ended the borrows it was allowed to.
          r = await api.send("POST /v1/hosts/{host}/remove", { host: name }, { force: o.force });
        }
        if (o.json) printJson(r);
        else if (r.state === "removed") process.stderr.write(`host ${r.host} (${r.hostId}) removed.\n`);
        else process.stderr.write(`host ${r.host} (${r.hostId}) is being removed: ${r.machines} machine(s) and ${r.allocations} allocation(s) still live; run \`berth host rm ${name}\` again (or add --wait) to finish.\n`);
        return 0;
      } finally {
        await api.close();
      }
    }),
  );
}

/** `berth host activate`: from the shared enroll token to the host's own identity key. */
function registerActivate(host: Command): void {
  clientOpts(
    host
      .command("activate")
      .summary("Switch a host (or every host) from the shared enroll token to its own identity key")
      .description(
        "Switch a host (or every host) from the shared enroll token to its own identity key. One way: the agent " +
          "retires every sandbox (new ones replace them once it is active) and removes its token file, and the enroll " +
          "token is refused for the host's name from then on (host_activated). A host that lends a machine is refused " +
          "(host_busy) unless --force, which ends those borrows (their sessions are cut) with the reason host_activated.",
      )
      .argument("[host]", "host name (see `berth host ls`)")
      .option("--all", "every host still on the enroll token", false)
      .option("--force", "end the borrows of lent machines instead of refusing", false)
      .option("--wait", "wait until the hosts are active", false)
      .addOption(new Option("--timeout <duration>", "how long --wait waits").argParser(durationArg("--timeout")).default(120_000, "2m")),
  ).action((name: string | undefined, o: { all: boolean; force: boolean; wait: boolean; timeout: number; json: boolean; url?: string; tokenFile?: string; config?: string }) =>
    runCommand(async () => {
      if ((name === undefined) === !o.all) {
        process.stderr.write("berth: give one host name or --all (see `berth host activate --help`)\n");
        return 2;
      }
      const { api } = clientFrom(o);
      try {
        const names = o.all ? (await listHosts(api)).filter((h) => h.identity.state !== "active").map((h) => h.name) : [name!];
        const results: Activated[] = [];
        let failed: unknown = null;
        for (const n of names) {
          try {
            const r = await api.send("POST /v1/hosts/{host}/activate", { host: n }, { force: o.force });
            results.push(r);
            if (!o.json) process.stdout.write(`host ${r.host}: ${r.state}; ${r.machines} machine(s) to retire${r.endedBorrows ? `, ${r.endedBorrows} borrow(s) ended` : ""}\n`);
          } catch (e) {
            failed ??= e;
            if (o.all) process.stderr.write(`berth: host ${n}: ${(e as Error).message}\n`);
          }
        }
        let hosts: HostView[] | null = null;
        if (o.wait && results.length > 0) hosts = await waitActive(api, results.map((r) => r.host), o.timeout, (s) => process.stderr.write(s + "\n"));
        if (o.json) printJson({ activated: results, hosts });
        if (failed !== null) throw failed;
        return 0;
      } finally {
        await api.close();
      }
    }),
  );
}
