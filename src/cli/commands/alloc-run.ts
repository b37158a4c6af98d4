/** Bodies of `berth alloc …` and `berth owner …` (loaded only when one of them runs). */
import { randomBytes } from "node:crypto";
import { BerthError } from "../../core/errors.js";
import { newId } from "../../core/ids.js";
import { gib } from "../../core/allocation-sizes.js";
import { formatDuration } from "../../core/durations.js";
import { ApiError, type Api } from "../api.js";
import { clientFrom, iso, printJson, printTable, runCommand } from "../common.js";
import type { ConfigFlags } from "../config.js";
import { allocationKey, allocationKeyDir } from "../alloc-keys.js";
import { waitReady, type AllocationView } from "./alloc-wait.js";

interface Flags extends ConfigFlags {
  json: boolean;
}

async function withApi(o: Flags, fn: (api: Api) => Promise<void>): Promise<void> {
  await runCommand(async () => {
    const { api } = clientFrom(o);
    try {
      await fn(api);
      return 0;
    } finally {
      await api.close();
    }
  });
}

/** A disk figure: GiB, or MiB below 1 GiB (a test size); "-" when not counted (before the disk dimension, or not declared by a host's agent). */
function diskText(mib: number | null | undefined): string {
  if (mib === null || mib === undefined) return "-";
  return mib > 0 && mib < 1024 ? `${mib} MiB` : `${gib(mib)} GiB`;
}

function printAllocation(a: AllocationView): void {
  process.stdout.write(
    `allocation ${a.id}${a.created === false ? " (already created with this id)" : ""}\n` +
      `  state      ${a.state}${a.reason ? ` (${a.reason})` : ""}\n` +
      `  size       ${a.size}: ${a.vcpu} vCPU, ${gib(a.memoryMib)} GiB, disk ${diskText(a.diskMib)}\n` +
      `  owner      ${a.owner}\n` +
      `  host       ${a.plan.hostName} (${a.hostId}), placed ${iso(a.plan.placedAt)} by ${a.plan.strategy}\n` +
      `  expires    ${iso(a.expiresAt)}\n` +
      (a.launch
        ? `  key        ${a.launch.fingerprint}\n` +
          (a.launch.readyAt ? `  ready      ${iso(a.launch.readyAt)} (${((a.launch.readyAt - a.createdAt) / 1000).toFixed(1)}s after create)\n` : "") +
          (a.launch.runtime ? `  runtime    ${a.launch.runtime}; size ${a.launch.enforcement}\n` : "") +
          (a.launch.error ? `  last error ${a.launch.error} (attempt ${a.launch.attempts})\n` : "") +
          (a.launch.volume?.disk ? `  disk       ${a.launch.volume.disk.enforced ? `enforced: ${a.launch.volume.disk.how}` : `not enforced (${a.launch.volume.disk.how}); accounted only`}\n` : "") +
          (a.launch.volumeFrom ? `  volume     attached: the kept volume of ${a.launch.volumeFrom}\n` : "") +
          (a.launch.release ? `  volume     ${a.launch.release.volume} at release\n` : "")
        : "  launch     none (created without a public key: placed and charged only)\n") +
      (a.access ? `  ssh        berth ssh ${a.id}   (${a.access.user}@${a.access.host}:${a.access.port}, host key ${a.access.hostKeyFingerprint})\n` : ""),
  );
}

/** Create with a client-chosen id, so a lost answer is retried safely with the same id. */
export function create(o: Flags & { size: string; id?: string; for?: number; strategy: string; owner?: string; wait: boolean; waitTimeout?: number; keyDir?: string; key: boolean; volume?: string }): Promise<void> {
  return withApi(o, async (api) => {
    const id = o.id ?? newId("al", (n) => randomBytes(n));
    // The private key is on disk before the request leaves: an allocation that exists always has its key here.
    const key = o.key ? allocationKey(allocationKeyDir(o.keyDir), id) : null;
    const body = {
      id, size: o.size, strategy: o.strategy,
      ...(o.for !== undefined ? { durationMs: o.for } : {}), ...(o.owner ? { owner: o.owner } : {}), ...(key ? { publicKey: key.pair.publicKey } : {}),
      ...(o.volume !== undefined ? { volume: o.volume } : {}),
    };
    let a: AllocationView | null = null;
    for (let attempt = 0; a === null; attempt++) {
      try {
        a = await api.send("POST /v1/allocations", {}, body);
      } catch (e) {
        // Only a transport failure (no answer) is retried; every refusal is final.
        if (e instanceof ApiError || e instanceof BerthError || attempt >= 2) throw e;
        await new Promise((r) => setTimeout(r, 500 * (attempt + 1)));
      }
    }
    if (key && !o.json) process.stderr.write(`berth: ${a.id}: key ${key.pair.fingerprint} in ${key.file}${key.reused ? " (already there)" : ""}\n`);
    if (o.wait && key) {
      a = { ...(await waitReady(api, a.id, o.waitTimeout ?? 600_000)), created: a.created! };
    }
    if (o.json) printJson(a);
    else printAllocation(a);
  });
}

export function list(o: Flags & { all: boolean }): Promise<void> {
  return withApi(o, async (api) => {
    const r = await api.send("GET /v1/allocations", {}, undefined, o.all ? { query: "all=true" } : {});
    if (o.json) printJson(r.allocations);
    else printTable(["ID", "STATE", "SIZE", "HOST", "OWNER", "EXPIRES"], r.allocations.map((a) => [a.id, a.state, a.size, a.plan.hostName, a.owner, iso(a.expiresAt)]));
  });
}

export function show(id: string, o: Flags): Promise<void> {
  return withApi(o, async (api) => {
    const a = await api.send("GET /v1/allocations/{id}", { id });
    if (o.json) printJson(a);
    else printAllocation(a);
  });
}

export function release(id: string, o: Flags & { keepVolume: boolean }): Promise<void> {
  return withApi(o, async (api) => {
    const a = await api.send("POST /v1/allocations/{id}/release", { id }, { keepVolume: o.keepVolume });
    if (o.json) printJson(a);
    else process.stdout.write(`allocation ${a.id}: ${a.state}${a.state === "released" ? "; slot and budget returned" : "; slot and budget stay charged until cleanup is proven"}\n`);
  });
}

/** An operator ends a quarantine; the choice of volume must be said. */
export function resolve(id: string, o: Flags & { keepVolume?: boolean; destroy?: boolean; hostGone?: boolean }): Promise<void> {
  return withApi(o, async (api) => {
    if (!o.keepVolume && !o.destroy && !o.hostGone) throw new BerthError("invalid_request", "invalid_request: say what happens to the workspace volume: --keep-volume or --destroy (or --host-gone when its host is gone for good)");
    const a = await api.send("POST /v1/allocations/{id}/resolve", { id }, { volume: o.hostGone ? "host_gone" : o.keepVolume ? "keep" : "destroy" });
    if (o.json) printJson(a);
    else process.stdout.write(`allocation ${a.id}: ${a.state === "released" ? "released; slot and budget returned" : `resolution under way (volume ${o.keepVolume ? "kept" : "destroyed"}); slot and budget come back once the agent proves the sandbox gone (berth alloc show ${a.id})`}
`);
  });
}

/** A failed allocation's sandbox started again; the answer comes at once, the state follows (berth alloc show). */
export function restart(id: string, o: Flags): Promise<void> {
  return withApi(o, async (api) => {
    const a = await api.send("POST /v1/allocations/{id}/restart", { id });
    if (o.json) printJson(a);
    else process.stdout.write(`allocation ${a.id}: restart under way on ${a.plan.hostName} (same volume); it is ready again once its sandbox runs (berth alloc show ${a.id})\n`);
  });
}

export function plan(o: Flags & { size: string; strategy: string }): Promise<void> {
  return withApi(o, async (api) => {
    const p = await api.send("POST /v1/allocations/plan", {}, { size: o.size, strategy: o.strategy });
    if (o.json) {
      printJson(p);
      return;
    }
    process.stdout.write(`plan for ${p.size.name} (${p.size.vcpu} vCPU, ${gib(p.size.memoryMib)} GiB, disk ${diskText(p.size.diskMib)}) by ${p.strategy}: ${p.decision.chosen ? `would place on ${p.decision.chosen.name}` : "no host fits"}\n`);
    process.stdout.write(`budget: ${p.budget === null ? "you are not admitted to allocate" : p.budget.fits ? "fits" : p.budget.message}\n`);
    printTable(["HOST", "ID", "FITS", "WHY NOT"], p.decision.verdicts.map((v) => [v.name, v.hostId, v.fits ? "yes" : "no", v.fits ? "" : (v.reason ?? "")]));
  });
}

export function sizes(o: Flags): Promise<void> {
  return withApi(o, async (api) => {
    const r = await api.send("GET /v1/sizes", {});
    if (o.json) printJson(r);
    else {
      printTable(["SIZE", "VCPU", "MEMORY", "DISK"], r.sizes.map((s) => [s.name, s.vcpu, `${gib(s.memoryMib)} GiB`, diskText(s.diskMib)]));
      process.stdout.write(`longest lifetime: ${formatDuration(r.maxDurationMs)}\n`);
    }
  });
}

export function hosts(o: Flags): Promise<void> {
  return withApi(o, async (api) => {
    const r = await api.send("GET /v1/host-accounts", {});
    if (o.json) printJson(r.hosts);
    else
      printTable(
        ["HOST", "ID", "STANDING", "VCPU", "MEMORY", "DISK", "SLOTS"],
        r.hosts.map((h) => [
          h.name, h.hostId, h.reported ?? h.standing, `${h.used.vcpu}/${h.capacity.vcpu}`, `${gib(h.used.memoryMib)}/${gib(h.capacity.memoryMib)} GiB`,
          h.capacity.diskMib === null || h.capacity.diskMib === undefined ? "-" : `${gib(h.used.diskMib ?? 0)}/${gib(h.capacity.diskMib)} GiB`, `${h.used.slots}/${h.capacity.slots}`,
        ]),
      );
  });
}

export function standing(host: string, to: string, o: Flags & { hostGone?: boolean }): Promise<void> {
  return withApi(o, async (api) => {
    const r = await api.send("POST /v1/hosts/{host}/standing", { host }, { standing: to, ...(o.hostGone ? { hostGone: true } : {}) });
    if (o.json) printJson(r);
    else if (r.standing === "withdrawing") process.stdout.write(`host ${r.hostId}: withdrawing (recorded; its agent has not acknowledged yet: retried until it does, and it takes no new allocation meanwhile; see berth alloc hosts)\n`);
    else process.stdout.write(`host ${r.hostId}: ${r.standing}\n`);
  });
}

/** "16GiB", "512MiB", "16G", "16" (GiB) -> MiB. */
export function parseMemory(s: string, flag = "--memory"): number {
  const m = /^(-?\d+(?:\.\d+)?)\s*(GiB|G|MiB|M)?$/i.exec(s.trim());
  if (!m) throw new BerthError("invalid_request", `invalid_request: ${flag} ${JSON.stringify(s)} is not a size; use e.g. 16GiB or 512MiB`);
  const v = Number(m[1]);
  const unit = (m[2] ?? "GiB").toLowerCase();
  return Math.round(unit.startsWith("m") ? v : v * 1024);
}

export function budget(id: string, o: Flags & { vcpu: number; memory: string; disk?: string; count: number }, verb: "admit" | "budget"): Promise<void> {
  return withApi(o, async (api) => {
    const body = { vcpu: o.vcpu, memoryMib: parseMemory(o.memory, "--memory"), ...(o.disk !== undefined ? { diskMib: parseMemory(o.disk, "--disk") } : {}), count: o.count };
    const r = await api.send(verb === "admit" ? "POST /v1/owners/{tokenId}/admit" : "POST /v1/owners/{tokenId}/budget", { tokenId: id }, body);
    if (o.json) printJson(r);
    else
      process.stdout.write(
        `owner ${r.owner}: budget ${r.budget.vcpu} vCPU, ${gib(r.budget.memoryMib)} GiB, disk ${diskText(r.budget.diskMib)}, ${r.budget.count} allocations; ` +
          `in use ${r.used.vcpu} vCPU, ${gib(r.used.memoryMib)} GiB, disk ${diskText(r.used.diskMib)}, ${r.used.count}\n`,
      );
  });
}

export function owners(o: Flags): Promise<void> {
  return withApi(o, async (api) => {
    const r = await api.send("GET /v1/owners", {});
    if (o.json) printJson(r.owners);
    else
      printTable(
        ["OWNER", "VCPU", "MEMORY", "DISK", "ALLOCATIONS"],
        r.owners.map((w) => [w.owner, `${w.used.vcpu}/${w.budget.vcpu}`, `${gib(w.used.memoryMib)}/${gib(w.budget.memoryMib)} GiB`, `${gib(w.used.diskMib ?? 0)}/${gib(w.budget.diskMib ?? 0)} GiB`, `${w.used.count}/${w.budget.count}`]),
      );
  });
}
