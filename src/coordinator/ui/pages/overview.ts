/**
 * The overview: every pool of the organisation with its machines as ready /
 * lent / cleanup against min and max; every host with its capacity per
 * dimension, runtime (gvisor: the platform and runsc release, and the
 * warning an old runsc brings), standing and agent version; and the quarantine list
 * with reasons and ages.
 */
import type { PoolRecord } from "../../../core/pool.js";
import type { Principal } from "../../auth.js";
import type { Store } from "../../../store/store.js";
import { listPools } from "../../../store/pools.js";
import { countMachinesByPoolState, listQuarantined, type MachineRow } from "../../../store/machines.js";
import { listHosts, runtimeDetailOf, type HostRow } from "../../../store/hosts.js";
import { listHostAccounts } from "../../../store/host-accounts.js";
import type { HostAccount } from "../../../core/allocation-placement.js";
import { html, type Html } from "../html.js";
import { action, since, bar, capacity, gib, stateClass, type View } from "../layout.js";
import { allows } from "../../auth.js";

export interface OverviewData {
  pools: Array<{ pool: PoolRecord; states: Map<string, number> }>;
  hosts: Array<{ host: HostRow; account: HostAccount | undefined }>;
  quarantined: MachineRow[];
}

export async function loadOverview(store: Store, p: Principal): Promise<OverviewData> {
  return store.transaction(async (tx) => {
    const pools = await listPools(tx, p.org);
    const counts = await countMachinesByPoolState(tx, p.org);
    const byPool = new Map<string, Map<string, number>>();
    for (const c of counts) {
      let m = byPool.get(c.pool);
      if (!m) byPool.set(c.pool, (m = new Map()));
      m.set(c.state, c.n);
    }
    const accounts = new Map((await listHostAccounts(tx, p.org)).map((a) => [a.hostId, a]));
    const hosts = (await listHosts(tx, p.org)).map((host) => ({ host, account: accounts.get(host.id) }));
    return { pools: pools.map((pool) => ({ pool, states: byPool.get(pool.name) ?? new Map() })), hosts, quarantined: await listQuarantined(tx, p.org) };
  }, { name: "ui_overview" });
}

function poolRow(v: View, pool: PoolRecord, states: Map<string, number>): Html {
  const sum = (cls: string) => [...states].filter(([s]) => stateClass(s) === cls).reduce((a, [, n]) => a + n, 0);
  const others = [...states].filter(([s]) => stateClass(s) === "other" && s !== "destroyed" && states.get(s)! > 0);
  return html`<tr data-pool="${pool.name}"><td><a href="/ui/pools/${pool.name}">${pool.name}</a></td><td>${pool.access}</td><td>${pool.provider}</td>
<td>${bar(
    [
      { label: "ready", n: sum("ready"), cls: "ready" },
      { label: "lent", n: sum("lent"), cls: "lent" },
      { label: "cleanup", n: sum("cleanup"), cls: "cleanup" },
    ],
    pool.maxReady,
    { min: pool.minReady, label: `pool ${pool.name}`, text: `ready ${sum("ready")} · lent ${sum("lent")} · cleanup ${sum("cleanup")} (min ${pool.minReady}, max ${pool.maxReady})` },
  )}</td>
<td>${others.length ? others.map(([s, n]) => `${s} ${n}`).join(", ") : html`<span class="muted">none</span>`}</td>
<td>${allows(v.principal, "operator") && pool.maxReady > 0 ? action({ action: `/ui/pools/${pool.name}/drain`, label: "Drain pool", confirm: `Drain pool ${pool.name}? Its capacity drops to zero and its ready machines are destroyed.` }) : ""}</td></tr>`;
}

/** `gvisor systrap (runsc 0.0~20240729.0)` as `berth host ls` says it, and the warning of an old runsc under it. */
function runtimeCell(host: HostRow): Html {
  const d = runtimeDetailOf(host);
  const text = d?.runsc ? `${host.runtime} ${d.runsc.platform} (runsc ${d.runsc.version})` : host.runtime;
  return html`<td>${text}${d?.warning ? html`<br><span class="muted" role="note">${d.warning}</span>` : ""}</td>`;
}

function hostRow(host: HostRow, a: HostAccount | undefined): Html {
  return html`<tr data-host="${host.name}" id="host-${host.name}"><td>${host.name}</td>${runtimeCell(host)}<td>${a?.standing ?? "—"}</td><td>${host.agent_version ?? html`<span class="muted">not reported</span>`}</td>
<td>${capacity("machine slots", host.used_slots, host.slots)}</td>
<td>${a ? html`${capacity("vCPU", a.used.vcpu, a.capacity.vcpu)}<br>${capacity("memory", gib(a.used.memoryMib), gib(a.capacity.memoryMib), " GiB")}<br>${capacity("allocation slots", a.used.slots, a.capacity.slots)}` : html`<span class="muted">no account</span>`}</td></tr>`;
}

export function renderOverview(v: View, d: OverviewData): Html {
  return html`<h2 id="pools">Pools (${d.pools.length})</h2>
${d.pools.length === 0 ? html`<p class="muted">No pools in this organisation.</p>` : html`<table aria-labelledby="pools"><thead><tr><th>Pool</th><th>Access</th><th>Provider</th><th>Capacity (ready / lent / cleanup against min and max)</th><th>Other states</th><th>Action</th></tr></thead>
<tbody>${d.pools.map((x) => poolRow(v, x.pool, x.states))}</tbody></table>`}
<h2 id="hosts">Hosts (${d.hosts.length})</h2>
${d.hosts.length === 0 ? html`<p class="muted">No hosts enrolled in this organisation.</p>` : html`<table aria-labelledby="hosts"><thead><tr><th>Host</th><th>Runtime</th><th>Standing</th><th>Agent version</th><th>Machines</th><th>Allocations: vCPU, memory, slots</th></tr></thead>
<tbody>${d.hosts.map((x) => hostRow(x.host, x.account))}</tbody></table>`}
<h2 id="quarantine">Quarantine (${d.quarantined.length})</h2>
${d.quarantined.length === 0 ? html`<p class="muted">No machine is quarantined.</p>` : html`<table aria-labelledby="quarantine"><thead><tr><th>Machine</th><th>Pool</th><th>Reason</th><th>Quarantined for</th><th>Generation</th></tr></thead>
<tbody>${d.quarantined.map((m) => html`<tr><td><a href="/ui/machines/${m.id}">${m.id}</a></td><td>${m.pool}</td><td>${m.reason ?? "—"}</td><td>${since(v.now, m.state_since)}</td><td class="num">${m.generation}</td></tr>`)}</tbody></table>`}`;
}
