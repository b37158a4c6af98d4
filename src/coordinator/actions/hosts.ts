/**
 * Host enrollment. An agent presents an agent-role API token and describes
 * itself; the coordinator records the host (idempotently by name) and answers
 * with the token it will use to call the agent. That token is derived from
 * the coordinator's secret (HMAC over the host id), so the database holds
 * no credential at all; the agent stores only its hash.
 */
import { createHmac } from "node:crypto";
import { newId } from "../../core/ids.js";
import type { Ctx } from "../context.js";
import type { Principal } from "../auth.js";
import { requireRole } from "../auth.js";
import { setDue, poolRef } from "../../store/rows.js";

export interface EnrollInput {
  name: string;
  url: string;
  runtime: "process" | "gvisor";
  capacity: { vcpu: number; memoryMb: number; slots: number };
  ssh: { host: string; port: number; hostKey: string; fingerprint: string };
}

export function hostCallToken(secret: Uint8Array, hostId: string): string {
  return "bhc_" + createHmac("sha256", secret).update(`host-call:${hostId}`).digest("base64url");
}

export interface HostRow {
  id: string;
  org: string;
  name: string;
  url: string;
  runtime: string;
  vcpu: number;
  memory_mb: number;
  slots: number;
  used_slots: number;
  ssh_host: string;
  ssh_port: number;
  host_key: string;
  fingerprint: string;
  enrolled_at: number;
}

export async function enrollHost(ctx: Ctx, p: Principal, input: EnrollInput, secret: Uint8Array): Promise<{ hostId: string; hostCallToken: string }> {
  requireRole(p, "agent");
  const now = ctx.now();
  const fresh = newId("h", ctx.randomBytes);
  const hostId = await ctx.store.transaction(async (tx) => {
    const existing = await tx.get<HostRow>(`SELECT * FROM hosts WHERE org = ? AND name = ?${tx.forUpdate}`, [p.org, input.name]);
    if (existing) {
      await tx.run("UPDATE hosts SET url = ?, runtime = ?, vcpu = ?, memory_mb = ?, slots = ?, ssh_host = ?, ssh_port = ?, host_key = ?, fingerprint = ?, enrolled_at = ? WHERE id = ?", [
        input.url, input.runtime, input.capacity.vcpu, input.capacity.memoryMb, input.capacity.slots, input.ssh.host, input.ssh.port, input.ssh.hostKey, input.ssh.fingerprint, now, existing.id,
      ]);
      // Machines on this host learn its (possibly new) gateway address.
      await tx.run("UPDATE machines SET ssh_host = ?, ssh_port = ?, host_key = ? WHERE host_id = ? AND state <> 'destroyed'", [input.ssh.host, input.ssh.port, input.ssh.hostKey, existing.id]);
      return existing.id;
    }
    await tx.run(
      "INSERT INTO hosts (id, org, name, url, runtime, vcpu, memory_mb, slots, used_slots, ssh_host, ssh_port, host_key, fingerprint, enrolled_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?, ?)",
      [fresh, p.org, input.name, input.url, input.runtime, input.capacity.vcpu, input.capacity.memoryMb, input.capacity.slots, input.ssh.host, input.ssh.port, input.ssh.hostKey, input.ssh.fingerprint, now],
    );
    // New capacity: every hosts-provider pool of the org may now be filled.
    const pools = await tx.all<{ name: string }>("SELECT name FROM pools WHERE org = ? AND provider = 'hosts'", [p.org]);
    for (const pool of pools) await setDue(tx, "fill", poolRef(p.org, pool.name), now);
    return fresh;
  });
  ctx.kick();
  return { hostId, hostCallToken: hostCallToken(secret, hostId) };
}

export async function listHosts(ctx: Ctx, p: Principal): Promise<HostRow[]> {
  return ctx.store.transaction((tx) => tx.all<HostRow>("SELECT * FROM hosts WHERE org = ? ORDER BY name", [p.org]));
}
