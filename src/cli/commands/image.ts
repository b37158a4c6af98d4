/**
 * `berth image ls|rm`: the images agents have cached (docs/images.md).
 *
 * Through the coordinator (default): every gvisor host's cache, listed or
 * cleaned by id (or a unique prefix), on one host (`--host`) or on every
 * host holding it. On an agent's own host, `--state-dir DIR` reads that
 * agent's cache directly; `rm --state-dir` only while no agent runs there
 * (with an agent running, remove through the coordinator, which asks it).
 * An image a machine uses is never removed (`conflict`).
 *
 * Exit codes: 0; 1 refused (in use, not found, agent running); 2 usage.
 */
import type { Command } from "commander";
import { BerthError } from "../../core/errors.js";
import { formatBytes } from "../../core/bytes.js";
import { clientFrom, iso, printJson, printTable, runCommand } from "../common.js";
import type { ConfigFlags } from "../config.js";

interface Flags extends ConfigFlags {
  json: boolean;
  host?: string;
  stateDir?: string;
}

interface ImageView {
  id: string;
  refs: string[];
  size: number;
  layers: number;
  lastUsedAt: number;
  pullMs: number;
  machines: number;
}

interface HostImages {
  host: string;
  /** null: not known here (the running agent's --image-cache-max). */
  maxBytes: number | null;
  usedBytes: number;
  images: ImageView[];
}

function opts(c: Command): Command {
  return c
    .option("--url <url>", "coordinator URL (or BERTH_URL)")
    .option("--token-file <file>", "API token file (or BERTH_TOKEN_FILE)")
    .option("--config <file>", "client config file")
    .option("--host <name>", "only this host")
    .option("--state-dir <dir>", "read the cache of the agent whose state directory this is, on this host (no coordinator)")
    .option("--json", "print JSON", false);
}

function print(hosts: HostImages[], json: boolean): void {
  if (json) return printJson(hosts);
  printTable(
    ["HOST", "IMAGE", "REFERENCE", "SIZE", "LAYERS", "MACHINES", "LAST USED"],
    hosts.flatMap((h) => h.images.map((i) => [h.host, i.id.slice(0, 12), i.refs[i.refs.length - 1] ?? "-", formatBytes(i.size), i.layers, i.machines, iso(i.lastUsedAt)])),
  );
  for (const h of hosts) process.stdout.write(`${h.host}: ${formatBytes(h.usedBytes)} cached${h.maxBytes !== null ? ` of ${formatBytes(h.maxBytes)} (--image-cache-max)` : ""}\n`);
}

/** The agent's cache in `stateDir`, opened here (loaded only for --state-dir). */
async function localCache(stateDir: string) {
  const [{ ImageCache }, { imagesInUseIn }, { silentLog }] = await Promise.all([import("../../agent/images/cache.js"), import("../../agent/runtime/gvisor-records.js"), import("../../agent/log.js")]);
  // The limit only matters to pulls, which this command never makes.
  return new ImageCache({ stateDir, maxBytes: Number.MAX_SAFE_INTEGER, inUse: () => imagesInUseIn(stateDir), log: silentLog });
}

export function register(program: Command): void {
  const image = program.command("image").description("Images cached by the agents: list, remove (docs/images.md)");

  opts(image.command("ls").description("List the images each gvisor host has cached: reference, size, machines using it")).action((o: Flags) =>
    runCommand(async () => {
      if (o.stateDir !== undefined) {
        const cache = await localCache(o.stateDir);
        const images = cache.list();
        print([{ host: `local (${o.stateDir})`, maxBytes: null, usedBytes: images.reduce((s, i) => s + i.size, 0), images }], o.json);
        return 0;
      }
      const { api } = clientFrom(o);
      try {
        const r = await api.send("GET /v1/images", {});
        print(r.hosts.filter((h) => o.host === undefined || h.host === o.host), o.json);
        if (r.unreachableHosts.length > 0) process.stderr.write(`berth: hosts not answering (their images are not listed): ${r.unreachableHosts.join(", ")}\n`);
        return 0;
      } finally {
        await api.close();
      }
    }),
  );

  opts(image.command("rm").description("Remove a cached image (id or unique prefix) from one host or every host holding it; never one a machine uses").argument("<image>", "image id (see berth image ls)")).action(
    (id: string, o: Flags) =>
      runCommand(async () => {
        const want = id.replace(/^sha256:/, "");
        if (o.stateDir !== undefined) {
          const [{ AgentStore, AgentLockedError }] = await Promise.all([import("../../agent/store/store.js")]);
          let store: ReturnType<typeof AgentStore.open>;
          try {
            // Holding the agent's lock: no agent starts a machine of it meanwhile.
            store = AgentStore.open(o.stateDir);
          } catch (e) {
            if (e instanceof AgentLockedError) throw new BerthError("conflict", `conflict: an agent is running on ${o.stateDir}; remove the image through the coordinator (berth image rm ${id}), which asks that agent`);
            throw e;
          }
          try {
            const r = (await localCache(o.stateDir)).remove(want);
            if (o.json) printJson({ removed: [{ host: "local", ...r }], refused: [] });
            else process.stdout.write(`removed image ${r.id.slice(0, 12)} (${formatBytes(r.size)})\n`);
            return 0;
          } finally {
            store.close();
          }
        }
        const { api } = clientFrom(o);
        try {
          const r = await api.send("POST /v1/images/{image}/remove", { image: want }, o.host !== undefined ? { host: o.host } : {});
          if (o.json) printJson(r);
          else {
            for (const x of r.removed) process.stdout.write(`${x.host}: removed image ${x.id.slice(0, 12)} (${formatBytes(x.size)})\n`);
            for (const x of r.refused) process.stderr.write(`berth: ${x.host}: ${x.message}\n`);
          }
          return r.refused.length > 0 ? 1 : 0;
        } finally {
          await api.close();
        }
      }),
  );
}
