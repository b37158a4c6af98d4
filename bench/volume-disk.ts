/**
 * The cost of a volume's disk limit (src/agent/volume-disk.ts): the agent's
 * own `Volumes.ensure` of a volume with a mounted ext4 image of the size's
 * disk versus a plain directory (`--disk-enforce off`), and sequential write
 * throughput into each (1 MiB writes, fsync at the end). Runs alternate
 * (image, plain, image, …) on the same filesystem; medians; the load average
 * is printed with the figures. Needs root and loop devices.
 *
 *   node dist/bench/volume-disk.js --runs 9 --size-mib 20480 --write-mib 256
 */
import { closeSync, fsyncSync, mkdtempSync, openSync, rmSync, writeSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { AgentStore } from "../src/agent/store/store.js";
import { Volumes } from "../src/agent/volumes.js";
import { probeDisk } from "../src/agent/volume-disk.js";
import { arg, dist, ms, printTable, round, writeResult } from "./lib.js";

const runs = Number(arg("runs", "9"));
const sizeMib = Number(arg("size-mib", "20480"));
const writeMib = Number(arg("write-mib", "256"));
const base = arg("dir", tmpdir());

const cap = probeDisk();
if (!cap.can) {
  process.stdout.write(`skipped: ${cap.why}\n`);
  process.exit(0);
}

const log = { info: () => undefined, warn: () => undefined, error: () => undefined, debug: () => undefined } as unknown as ConstructorParameters<typeof Volumes>[0]["log"];

function writeInto(dir: string): number {
  const chunk = Buffer.alloc(2 ** 20, 0x5a);
  const t = process.hrtime.bigint();
  const fd = openSync(join(dir, "blob"), "w");
  try {
    for (let i = 0; i < writeMib; i++) writeSync(fd, chunk);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
  return writeMib / (ms(t) / 1000);
}

const load0 = loadavg();
const dir = mkdtempSync(join(base, "berth-bench-disk-"));
const store = AgentStore.open(join(dir, "state"));
try {
  const image = new Volumes({ stateDir: join(dir, "state"), records: store.volumes, now: Date.now, log, disk: { mode: "required", cap } });
  const plain = new Volumes({ stateDir: join(dir, "state"), records: store.volumes, now: Date.now, log, disk: { mode: "off", cap } });
  const create = { image: [] as number[], plain: [] as number[] };
  const release = { image: [] as number[], plain: [] as number[] };
  const mbps = { image: [] as number[], plain: [] as number[] };
  for (let r = 0; r < runs; r++) {
    for (const kind of r % 2 === 0 ? (["image", "plain"] as const) : (["plain", "image"] as const)) {
      const v = kind === "image" ? image : plain;
      const id = `${kind}${r}`;
      let t = process.hrtime.bigint();
      const rec = v.ensure(id, sizeMib);
      create[kind].push(ms(t));
      if (kind === "image" && !rec.diskEnforced) throw new Error(`the image volume was not enforced: ${rec.diskWhy}`);
      mbps[kind].push(writeInto(join(rec.path, "data")));
      t = process.hrtime.bigint();
      v.release(id, false);
      release[kind].push(ms(t));
    }
  }
  const load1 = loadavg();
  const row = (what: string, a: number[], b: number[]) => {
    const [da, db] = [dist(a), dist(b)];
    return { what, image: da.p50, plain: db.p50, "image − plain": round(da.p50 - db.p50), "image / plain": round(da.p50 / db.p50, 2) };
  };
  const rows = [row("create ms (p50)", create.image, create.plain), row("release ms (p50)", release.image, release.plain), row(`write ${writeMib} MiB, MB/s (p50)`, mbps.image, mbps.plain)];
  printTable(`volume disk limit: ${sizeMib} MiB image vs plain directory, ${runs} alternating runs, load average ${load0.map((x) => x.toFixed(2)).join(" ")} → ${load1.map((x) => x.toFixed(2)).join(" ")}`, rows);
  const path = writeResult("volume-disk", { runs, sizeMib, writeMib, loadBefore: load0, loadAfter: load1, rows, raw: { create, release, mbps } });
  process.stdout.write(`\nwrote ${path}\n`);
} finally {
  store.close();
  rmSync(dir, { recursive: true, force: true });
}
