/**
 * The agent's allocation routes (registered by http.ts with the same
 * host-call authentication as every agent route):
 *
 *   GET  /v1/agent/holds                         -> {holds: [HoldRecord], held: n}
 *   GET  /v1/agent/holds/{allocation}            -> HoldRecord | 404 (never held here)
 *   POST /v1/agent/holds/{allocation}/observe    {floor} -> HoldRecord (a `fenced` record: none held, floor raised)
 *   GET  /v1/agent/holds/{allocation}/sandbox    -> SandboxView: whether the allocation's sandbox runs, asked of
 *                                                the runtime now (the coordinator's watch: a dead one is `failed`)
 *   POST /v1/agent/standing                      {epoch, standing} -> {epoch, standing} once stored and every
 *                                                launch that began before it has ended (standing.ts)
 *   GET  /v1/agent/volumes                       -> {volumes: [VolumeView], quarantined: [dir name]} (unrecorded
 *                                                directories moved aside: volumes.ts)
 *   GET  /v1/agent/volumes/{allocation}          -> VolumeView (with a structural check)
 *   POST /v1/agent/volumes/{allocation}/verify   -> VolumeCheck
 *   POST /v1/agent/volumes/{allocation}/reset    -> {removed}  (refused on a volume that fails verify)
 *   POST /v1/agent/volumes/{allocation}/remove   -> {allocationId, state: "clean"} (a kept volume; refused while
 *                                                its allocation holds a slot here)
 *   POST /v1/agent/volume-quarantine/{name}/remove -> {removed} (one directory moved aside, proven gone)
 *
 * A hold observation is what a replacement launch actor reads before it
 * decides (core/allocation-takeover.ts); it comes from the agent's store,
 * which only the lock-holding agent process writes. The replacement of a
 * lapsed actor observes with `observe`: when no hold is held, the floor is
 * raised to the generation it is about to take, in the transaction that
 * reads, before the answer; a late hold of the lapsed actor is refused
 * afterwards whichever arrives first.
 */
import { z } from "zod";
import { BerthError } from "../core/errors.js";
import { parseId } from "../core/ids.js";
import { allocationMachineId } from "../core/allocation-access.js";
import type { HttpServer } from "../http/server.js";
import type { IncomingMessage } from "node:http";
import type { HoldTable } from "./store/holds.js";
import type { VolumeRecord, VolumeTable } from "./store/volumes.js";
import type { Volumes } from "./volumes.js";
import { AGENT_STANDINGS, type StandingRecord } from "./standing.js";

export interface AllocHttpDeps {
  holds: HoldTable;
  /** The volume records. */
  records: VolumeTable;
  volumes: Volumes;
  /** The clock (epoch ms). */
  now: () => number;
  /** Stores a newer standing durably, waits for the launches under way, and says what is stored. */
  setStanding: (next: StandingRecord) => Promise<StandingRecord>;
  /** Whether the allocation's sandbox runs now (the runtime is asked, not the record). */
  sandbox: (allocationId: string) => Promise<SandboxView>;
}

/**
 * What the agent sees of an allocation's sandbox: `running` (the recorded
 * incarnation runs), `stopped` (the record says running but the runtime has
 * no running sandbox: killed from outside, e.g. by its memory cgroup),
 * `mismatch` (recovery found it not matching its record), `none` (no
 * running machine of it: never launched here, or destroyed).
 */
export interface SandboxView {
  allocationId: string;
  machineId: string;
  sandbox: "running" | "stopped" | "mismatch" | "none";
  why: string | null;
}

const StandingBody = z.object({ epoch: z.number().int().min(1).max(Number.MAX_SAFE_INTEGER), standing: z.enum(AGENT_STANDINGS) }).strict();
const ObserveBody = z.object({ floor: z.number().int().min(1).max(Number.MAX_SAFE_INTEGER) }).strict();

export function registerAllocRoutes(app: HttpServer, auth: { auth: (req: IncomingMessage) => void }, d: AllocHttpDeps): void {
  // The marker token stays on the host: it proves the directory, it is not shown.
  const view = ({ marker: _marker, ...v }: VolumeRecord) => ({ ...v, check: v.state === "ready" ? d.volumes.verify(v.allocationId) : null });
  const volumeOf = (raw: string): VolumeRecord => {
    const v = d.records.get(parseId(raw, "allocation id"));
    if (!v) throw new BerthError("not_found", `not_found: allocation ${raw} has no workspace volume on this host`);
    return v;
  };
  app.get("/v1/agent/holds", auth, async () => ({ holds: d.holds.list(), held: d.holds.countHeld() }));
  app.get("/v1/agent/holds/:allocation", auth, async (req) => {
    const h = d.holds.get(parseId(req.params.allocation!, "allocation id"));
    if (!h) throw new BerthError("not_found", `not_found: allocation ${req.params.allocation!} never held a slot on this host`);
    return h;
  });
  app.post("/v1/agent/holds/:allocation/observe", { auth: auth.auth, body: ObserveBody }, async (req) => {
    const id = parseId(req.params.allocation!, "allocation id");
    return d.holds.observe(id, allocationMachineId(id), req.body.floor, d.now());
  });
  app.get("/v1/agent/holds/:allocation/sandbox", auth, async (req) => d.sandbox(parseId(req.params.allocation!, "allocation id")));
  app.post("/v1/agent/standing", { auth: auth.auth, body: StandingBody }, async (req) => d.setStanding(req.body));
  app.get("/v1/agent/volumes", auth, async () => ({ volumes: d.records.list().map(view), quarantined: d.volumes.quarantined() }));
  app.get("/v1/agent/volumes/:allocation", auth, async (req) => view(volumeOf(req.params.allocation!)));
  app.post("/v1/agent/volumes/:allocation/verify", auth, async (req) => d.volumes.verify(volumeOf(req.params.allocation!).allocationId));
  app.post("/v1/agent/volumes/:allocation/remove", auth, async (req) => {
    const v = volumeOf(req.params.allocation!);
    const h = d.holds.get(v.allocationId);
    if (h && h.state === "held") throw new BerthError("conflict", `conflict: allocation ${v.allocationId} still holds its slot on this host; its volume is removed by its release`);
    return { allocationId: v.allocationId, ...d.volumes.removeKept(v.allocationId) };
  });
  app.post("/v1/agent/volume-quarantine/:name/remove", auth, async (req) => d.volumes.removeQuarantined(req.params.name!));
  app.post("/v1/agent/volumes/:allocation/reset", auth, async (req) => d.volumes.reset(volumeOf(req.params.allocation!).allocationId));
}
