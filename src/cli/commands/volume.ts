/**
 * `berth volume ls|show|verify|reset|rm|quarantine`: allocations' workspace
 * volumes, through the coordinator (which asks the host agent). Exit codes:
 * 0; 1 when `verify` finds a volume damaged (its problems are printed), and
 * for refusals; 2 for usage.
 */
import type { Command } from "commander";
import { clientFrom, printJson, printTable, runCommand } from "../common.js";
import { BerthError } from "../../core/errors.js";
import { ApiError } from "../../client/http.js";
import type { ConfigFlags } from "../config.js";

interface Flags extends ConfigFlags {
  json: boolean;
}

type Api = ReturnType<typeof clientFrom>["api"];

function withApi(o: Flags, fn: (api: Api) => Promise<number>): Promise<void> {
  return runCommand(async () => {
    const { api } = clientFrom(o);
    try {
      return await fn(api);
    } finally {
      await api.close();
    }
  });
}

function clientOpts(c: Command): Command {
  return c.option("--url <url>", "coordinator URL (or BERTH_URL)").option("--token-file <file>", "API token file (or BERTH_TOKEN_FILE)").option("--config <file>", "client config file").option("--json", "print JSON", false);
}

/** List the volumes of your allocations (an operator: the organisation's). */
async function listVolumes(api: Api, o: Flags): Promise<number> {
  const r = await api.send("GET /v1/volumes", {});
  if (o.json) printJson(r);
  else {
    printTable(["ALLOCATION", "STATE", "ALLOC STATE", "HOST", "CHECK"], r.volumes.map((v) => [v.allocationId, v.state, v.allocationState ?? "", v.hostName ?? "", v.check ? (v.check.ok ? "ok" : "DAMAGED") : "-"]));
    if (r.unreachableHosts.length > 0) process.stderr.write(`berth: hosts not answering (their volumes are not listed): ${r.unreachableHosts.join(", ")}\n`);
  }
  return 0;
}

/** One allocation's volume: record, identity, disk, check. */
async function showVolume(api: Api, id: string, o: Flags): Promise<number> {
  const v = await api.send("GET /v1/volumes/{allocation}", { allocation: id });
  if (o.json) printJson(v);
  else
    process.stdout.write(
      `volume of ${v.allocationId} on ${v.hostName ?? "?"}\n  state      ${v.state}\n  identity   dev ${v.dev ?? "-"} inode ${v.ino ?? "-"}\n  path       ${v.path}\n` +
        (v.diskMib !== null && v.diskMib !== undefined ? `  disk       ${v.diskMib} MiB, ${v.diskEnforced ? "enforced (ext4 image on a loop device)" : `not enforced (${v.diskWhy ?? "?"}); accounted only`}\n` : "") +
        `  check      ${v.check ? (v.check.ok ? "ok" : `DAMAGED: ${v.check.problems.join("; ")}`) : "-"}\n`,
    );
  return 0;
}

/** The structural check of one volume or of every one; 1 when any is damaged or a host does not answer. */
async function verifyVolumes(api: Api, id: string | undefined, o: Flags & { all: boolean }): Promise<number> {
  if (o.all === (id !== undefined)) throw new BerthError("invalid_request", "invalid_request: name one allocation or --all");
  if (!o.all) {
    const c = await api.send("POST /v1/volumes/{allocation}/verify", { allocation: id! });
    if (o.json) printJson(c);
    else process.stdout.write(c.ok ? `volume of ${c.allocationId}: ok\n` : `volume of ${c.allocationId}: DAMAGED\n${c.problems.map((p) => `  - ${p}\n`).join("")}`);
    return c.ok ? 0 : 1;
  }
  // Every volume with a record in use (ready); GET /v1/volumes checks each on its agent.
  const r = await api.send("GET /v1/volumes", {});
  const checked = r.volumes.filter((v) => v.check !== null);
  const damaged = checked.filter((v) => !v.check!.ok);
  if (o.json) printJson({ checked: checked.map((v) => v.check), unreachableHosts: r.unreachableHosts });
  else {
    for (const v of checked) process.stdout.write(v.check!.ok ? `volume of ${v.allocationId}: ok\n` : `volume of ${v.allocationId}: DAMAGED\n${v.check!.problems.map((p) => `  - ${p}\n`).join("")}`);
    process.stdout.write(`${checked.length} volume(s) checked, ${damaged.length} damaged\n`);
    if (r.unreachableHosts.length > 0) process.stderr.write(`berth: hosts not answering (their volumes are not checked): ${r.unreachableHosts.join(", ")}\n`);
  }
  return damaged.length > 0 || r.unreachableHosts.length > 0 ? 1 : 0;
}

/** Empty named volumes or every one, each on its own; 1 when any is refused or a host does not answer. */
async function resetVolumes(api: Api, ids: string[], o: Flags & { all: boolean }): Promise<number> {
  if (o.all === ids.length > 0) throw new BerthError("invalid_request", "invalid_request: name allocations or --all");
  // One named volume: its refusal is the command's error (stderr, its code), as for every other command.
  const one = !o.all && ids.length === 1;
  let unreachable: string[] = [];
  if (o.all) {
    const r = await api.send("GET /v1/volumes", {});
    ids = r.volumes.map((v) => v.allocationId);
    unreachable = r.unreachableHosts;
  }
  // Each on its own: one refusal does not stop the others; every outcome is printed.
  const results: Array<{ allocationId: string; removed: number } | { allocationId: string; error: { code: string; message: string } }> = [];
  for (const id of ids) {
    try {
      results.push(await api.send("POST /v1/volumes/{allocation}/reset", { allocation: id }));
    } catch (e) {
      if (!(e instanceof ApiError) || one) throw e; // a refusal of this one; an unreachable coordinator ends the command
      results.push({ allocationId: id, error: { code: e.code, message: e.message } });
    }
  }
  const refused = results.filter((r) => "error" in r).length;
  if (o.json) printJson(one ? results[0] : { results, unreachableHosts: unreachable });
  else {
    for (const r of results) process.stdout.write("error" in r ? `volume of ${r.allocationId}: REFUSED: ${r.error.message}\n` : `volume of ${r.allocationId}: reset (${r.removed} entries removed)\n`);
    if (!one) process.stdout.write(`${results.length - refused} volume(s) reset, ${refused} refused\n`);
    if (unreachable.length > 0) process.stderr.write(`berth: hosts not answering (their volumes are not reset): ${unreachable.join(", ")}\n`);
  }
  return refused > 0 || unreachable.length > 0 ? 1 : 0;
}

/** Remove a kept volume. */
async function removeVolume(api: Api, id: string, o: Flags): Promise<number> {
  const r = await api.send("POST /v1/volumes/{allocation}/remove", { allocation: id });
  if (o.json) printJson(r);
  else process.stdout.write(`volume of ${r.allocationId}: removed\n`);
  return 0;
}

/** Directories moved aside, per host. */
async function listQuarantined(api: Api, o: Flags): Promise<number> {
  const r = await api.send("GET /v1/volume-quarantine", {});
  if (o.json) printJson(r);
  else {
    printTable(["HOST", "ID", "DIRECTORY"], r.hosts.flatMap((h) => h.quarantined.map((n) => [h.hostName, h.hostId, n])));
    if (r.unreachableHosts.length > 0) process.stderr.write(`berth: hosts not answering (not listed): ${r.unreachableHosts.join(", ")}\n`);
  }
  return 0;
}

/** Remove one moved-aside directory. */
async function removeQuarantined(api: Api, host: string, name: string, o: Flags): Promise<number> {
  const r = await api.send("POST /v1/volume-quarantine/{host}/{name}/remove", { host, name });
  if (o.json) printJson(r);
  else process.stdout.write(`host ${r.hostId}: ${r.removed} removed\n`);
  return 0;
}

export function register(program: Command): void {
  const volume = program.command("volume").description("Workspace volumes of allocations: list, inspect, verify, reset (never by hand on the host)");
  clientOpts(volume.command("ls").description("List the volumes of your allocations (an operator: the organisation's)")).action((o: Flags) => withApi(o, (api) => listVolumes(api, o)));
  clientOpts(volume.command("show").description("Show one allocation's volume: record, identity, check").argument("<allocation>", "allocation id")).action((id: string, o: Flags) =>
    withApi(o, (api) => showVolume(api, id, o)),
  );
  clientOpts(
    volume
      .command("verify")
      .description("Structural check: record, directory identity (device, inode), marker; exits 1 when damaged")
      .argument("[allocation]", "allocation id")
      .option("--all", "every volume you can see (berth volume ls); exits 1 when any is damaged or a host does not answer", false),
  ).action((id: string | undefined, o: Flags & { all: boolean }) => withApi(o, (api) => verifyVolumes(api, id, o)));
  clientOpts(
    volume
      .command("reset")
      .description("Empty allocations' volumes (same directory, same identity); a damaged volume is refused; exits 1 when any is refused or a host does not answer")
      .argument("[allocation...]", "allocation ids")
      .option("--all", "every volume you can see (berth volume ls)", false),
  ).action((ids: string[], o: Flags & { all: boolean }) => withApi(o, (api) => resetVolumes(api, ids, o)));
  clientOpts(volume.command("rm").description("Remove a kept volume (after berth alloc release ID --keep-volume); refused while the allocation is not released").argument("<allocation>", "allocation id")).action((id: string, o: Flags) =>
    withApi(o, (api) => removeVolume(api, id, o)),
  );
  const q = volume.command("quarantine").description("Directories an agent found at a volume's path without its record and moved aside, never adopted (operators)");
  clientOpts(q.command("ls").description("List them per host")).action((o: Flags) => withApi(o, (api) => listQuarantined(api, o)));
  clientOpts(q.command("rm").description("Remove one moved-aside directory (its contents are deleted)").argument("<host-id>", "host id (berth volume quarantine ls)").argument("<directory>", "the directory's name")).action((host: string, name: string, o: Flags) =>
    withApi(o, (api) => removeQuarantined(api, host, name, o)),
  );
}
