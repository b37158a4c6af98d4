/**
 * `bench/runtime-cycle --compare runsc|image`: two variants of a gvisor
 * machine on a real deployment (`berth serve` on SQLite + `berth agent`),
 * alternating, medians and ratios in one run (the machine is shared: the
 * ratios are what to read, not the absolute figures).
 *
 *   runsc: the agent on `--old-runsc` (default /opt/runsc-20221219/runsc)
 *          and on `--new-runsc` (default: runsc on PATH), each on the
 *          platform `auto` picks for it (ptrace for the old one, systrap for
 *          0.0~20240729 without /dev/kvm);
 *   image: a pool of the host's root against a pool of an OCI image (busybox
 *          and perl with its libraries, written by the bench as an OCI
 *          layout), both on the runsc on PATH; plus the first boot of an
 *          image the agent has not seen yet (pull + verify + unpack + boot).
 *
 * Per round (`--rounds`, default 3; the order of the variants flips every
 * round) and variant, a fresh cluster:
 *   create       : `--creates` times (default 5): ensure pool `mk` of one
 *                  machine → that machine ready in the store; then drained;
 *   first boot   : (image only) `--first-boots` times (default 2): the same
 *                  with an image never seen before (one extra layer unique to
 *                  the sample), so the agent pulls and unpacks it;
 *   borrow → SSH ready, borrow → first byte, return → ready: `--runs` cycles
 *                  (default 30) on a keeper pool of 2, as runtime-cycle.
 * Printed: per step, each variant's median over rounds of the round's p50,
 * and the ratio second / first.
 */
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { arg, dist, printTable, round, writeResult } from "./lib.js";
import { ensureHostsPool, firstByte, gvisorSkipReason, sleep, sshTo, startCluster, waitMachineReady, waitReadyCount, type BenchCluster, type Borrowed } from "./cluster.js";
import { Api } from "../src/cli/api.js";
import { buildImage, busyboxLayer, perlLayer, tarOf, writeLayout } from "../test/helpers/oci-images.js";
import { findRunsc } from "../src/agent/runtime/gvisor-runsc.js";

interface Variant {
  name: string;
  agentArgs: string[];
  image: string | null;
  /** Makes a layout of an image the agent has not seen (first boots). */
  freshImage?: () => Promise<string>;
}

type Steps = Record<string, number[]>;

const median = (xs: number[]): number => {
  const s = [...xs].filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
};

async function machinesLive(c: BenchCluster, pool: string): Promise<number> {
  const r = await c.coord.store.readCommitted<{ n: number }>("SELECT COUNT(*) AS n FROM machines WHERE pool = ? AND state <> 'destroyed'", [pool]);
  return Number(r?.n ?? 0);
}

/** Ensure a pool of one machine of `image`, wait until it is ready; the wall time. Then drain it and wait until it is gone. */
async function createOnce(c: BenchCluster, pool: string, image: string | null): Promise<number> {
  const t0 = performance.now();
  await c.admin.call("POST", `/v1/pools/${pool}/ensure`, { minReady: 1, maxReady: 1, compatibilityKey: "bench", access: "keeper", provider: "hosts", keeperKey: c.keeper.publicKey, image });
  await waitReadyCount(c, pool, 1, 300_000);
  const t = performance.now() - t0;
  await c.admin.call("POST", `/v1/pools/${pool}/drain`, {});
  const deadline = Date.now() + 120_000;
  while ((await machinesLive(c, pool)) > 0) {
    if (Date.now() > deadline) throw new Error(`pool ${pool}: machines still live 120 s after the drain`);
    await sleep(20);
  }
  return t;
}

async function cycles(c: BenchCluster, runs: number, steps: Steps): Promise<void> {
  const api = new Api(c.coord.url, await c.coord.token("member"), { connections: 1 });
  try {
    for (let i = 0; i < runs; i++) {
      await waitReadyCount(c, "rt", 1, 60_000);
      const t0 = performance.now();
      const b = await api.call<Borrowed>("POST", "/v1/pools/rt/borrow", {});
      const client = await sshTo(b, c.keeper.privateKey);
      steps["borrow → SSH ready"]!.push(performance.now() - t0);
      steps["borrow → first byte"]!.push((await firstByte(client, "echo ok")) - t0);
      client.end();
      const t1 = performance.now();
      await api.call("POST", `/v1/borrows/${b.borrowId}/return`, { token: b.borrowToken });
      const state = await waitMachineReady(c, b.machine.id, 60_000);
      if (state === "ready") steps["return → ready"]!.push(performance.now() - t1);
      else {
        steps["returns not ready"]!.push(1);
        await waitReadyCount(c, "rt", 2, 120_000);
      }
    }
  } finally {
    await api.close();
  }
}

async function round1(v: Variant, creates: number, firstBoots: number, runs: number): Promise<{ steps: Steps; runsc: unknown }> {
  const steps: Steps = { create: [], "first boot of a new image": [], "borrow → SSH ready": [], "borrow → first byte": [], "return → ready": [], "returns not ready": [] };
  const c = await startCluster({ engine: "sqlite", runtime: "gvisor", slots: 4, agentArgs: v.agentArgs });
  try {
    const hosts = await c.admin.call<{ hosts: Array<{ runsc: unknown }> }>("GET", "/v1/hosts");
    const runsc = hosts.hosts[0]?.runsc ?? null;
    // The pool of the cycles first (its image, if any, is pulled here: not measured).
    await ensureHostsPool(c, "rt", "keeper", 2, { image: v.image });
    for (let i = 0; i < creates; i++) steps.create!.push(await createOnce(c, `mk${i}`, v.image));
    if (v.freshImage) for (let i = 0; i < firstBoots; i++) steps["first boot of a new image"]!.push(await createOnce(c, `fb${i}`, await v.freshImage()));
    await cycles(c, runs, steps);
    return { steps, runsc };
  } finally {
    await c.close();
  }
}

export async function runCompare(kind: string): Promise<void> {
  const gv = gvisorSkipReason();
  if (gv) {
    process.stdout.write(`${gv}\n`);
    return;
  }
  const rounds = Number(arg("rounds", "3"));
  const creates = Number(arg("creates", "5"));
  const firstBoots = Number(arg("first-boots", "2"));
  const runs = Number(arg("runs", "30"));
  const work = mkdtempSync(join(tmpdir(), "berth-bench-compare-"));
  let variants: Variant[];
  try {
    if (kind === "runsc") {
      const oldRunsc = arg("old-runsc", "/opt/runsc-20221219/runsc");
      const newRunsc = arg("new-runsc", findRunsc() ?? "runsc");
      if (!existsSync(oldRunsc)) {
        process.stdout.write(`runsc comparison skipped: ${oldRunsc} does not exist (--old-runsc PATH)\n`);
        return;
      }
      variants = [
        { name: "old runsc", agentArgs: ["--runsc", oldRunsc], image: null },
        { name: "new runsc", agentArgs: ["--runsc", newRunsc], image: null },
      ];
    } else if (kind === "image") {
      const layers = [await busyboxLayer(), await perlLayer()];
      const dir = join(work, "layout");
      writeLayout(dir, buildImage({ layers, env: ["PATH=/usr/bin:/bin"] }), "v1");
      let n = 0;
      const freshImage = async (): Promise<string> => {
        const d = join(work, `fresh-${n}`);
        writeLayout(d, buildImage({ layers: [...layers, await tarOf([{ name: "etc/berth-bench", content: `${n++} ${Date.now()}\n` }])], env: ["PATH=/usr/bin:/bin"] }), "v1");
        return `oci:${d}:v1`;
      };
      variants = [
        { name: "host root", agentArgs: [], image: null },
        { name: "image", agentArgs: [], image: `oci:${dir}:v1`, freshImage },
      ];
    } else {
      throw new Error(`--compare ${kind}: runsc or image`);
    }
    const per: Array<Array<{ steps: Steps; runsc: unknown }>> = variants.map(() => []);
    for (let r = 0; r < rounds; r++) {
      const order = r % 2 === 0 ? [0, 1] : [1, 0];
      for (const i of order) {
        const v = variants[i]!;
        process.stderr.write(`round ${r + 1}/${rounds}: ${v.name}\n`);
        per[i]!.push(await round1(v, creates, firstBoots, runs));
      }
    }
    const stepNames = Object.keys(per[0]![0]!.steps).filter((s) => s !== "returns not ready");
    const rows = [];
    for (const step of stepNames) {
      const p50s = per.map((rs) => rs.map((x) => (x.steps[step]!.length ? dist(x.steps[step]!).p50 : NaN)));
      const p99s = per.map((rs) => rs.map((x) => (x.steps[step]!.length ? dist(x.steps[step]!).p99 : NaN)));
      const a = median(p50s[0]!);
      const b = median(p50s[1]!);
      if (!Number.isFinite(a) && !Number.isFinite(b)) continue;
      rows.push({
        step,
        [`${variants[0]!.name} p50`]: round(a, 1),
        [`${variants[1]!.name} p50`]: round(b, 1),
        [`ratio ${variants[1]!.name} / ${variants[0]!.name}`]: Number.isFinite(a) && Number.isFinite(b) ? round(b / a, 2) : "—",
        [`${variants[0]!.name} p99`]: round(median(p99s[0]!), 1),
        [`${variants[1]!.name} p99`]: round(median(p99s[1]!), 1),
        "round p50s": p50s.map((xs) => xs.map((x) => Math.round(x)).join("/")).join(" | "),
      });
    }
    const runscs = per.map((rs) => JSON.stringify(rs[0]?.runsc ?? null));
    printTable(
      `gvisor ${kind}: ${variants.map((v, i) => `${v.name} = ${runscs[i]}`).join("; ")} (ms; medians over ${rounds} alternating rounds of each round's p50; ${creates} creates, ${runs} cycles per round)`,
      rows,
    );
    const notReady = per.map((rs) => rs.reduce((s, x) => s + x.steps["returns not ready"]!.length, 0));
    if (notReady.some((n) => n > 0)) process.stdout.write(`returns that did not end ready: ${variants.map((v, i) => `${v.name} ${notReady[i]}`).join(", ")}\n`);
    const path = writeResult(`runtime-compare-${kind}`, { rounds, creates, firstBoots, runs, variants: variants.map((v, i) => ({ name: v.name, agentArgs: v.agentArgs, image: v.image, runsc: per[i]![0]?.runsc ?? null, rounds: per[i]!.map((x) => x.steps) })), rows });
    process.stdout.write(`\nwrote ${path}\n`);
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}
