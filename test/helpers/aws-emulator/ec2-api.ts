/**
 * The EC2 Query API actions of the emulator: form-encoded requests in,
 * `<ActionResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">` XML out,
 * member names as the ec2 protocol spells them (instanceState, tagSet, …).
 *
 * Eventual consistency: an instance younger than `describeLagMs` is not
 * listed and its id is InvalidInstanceID.NotFound to every call but
 * RunInstances' idempotency. Paging: `MaxResults` with instance ids is
 * InvalidParameterCombination, as on EC2; DescribeInstances filters each
 * page after cutting it, so a page may hold fewer items than asked, or none,
 * and still carry a NextToken.
 */
import { randomUUID } from "node:crypto";
import type { AwsEmulator } from "./emulator.js";
import { errorXml, esc } from "./emulator.js";
import type { EmulatedInstance } from "./instance.js";

const CODES: Record<string, number> = { pending: 0, running: 16, "shutting-down": 32, terminated: 48, stopping: 64, stopped: 80 };

/** `Prefix.1`, `Prefix.2`, … values. */
function list(p: URLSearchParams, prefix: string): string[] {
  const out: string[] = [];
  for (let i = 1; p.has(`${prefix}.${i}`); i++) out.push(p.get(`${prefix}.${i}`)!);
  return out;
}

function filters(p: URLSearchParams): Array<{ name: string; values: string[] }> {
  const out: Array<{ name: string; values: string[] }> = [];
  for (let i = 1; p.has(`Filter.${i}.Name`); i++) out.push({ name: p.get(`Filter.${i}.Name`)!, values: list(p, `Filter.${i}.Value`) });
  return out;
}

function matches(i: EmulatedInstance, f: { name: string; values: string[] }): boolean {
  if (f.name === "client-token") return f.values.includes(i.clientToken);
  if (f.name === "instance-state-name") return f.values.includes(i.state);
  if (f.name === "instance-id") return f.values.includes(i.id);
  if (f.name.startsWith("tag:")) return f.values.includes(i.tags[f.name.slice(4)] ?? "\0");
  throw new Error(`emulator: filter ${f.name} is not supported`);
}

function stateXml(tag: string, s: string): string {
  return `<${tag}><code>${CODES[s] ?? 0}</code><name>${s}</name></${tag}>`;
}

function instanceXml(i: EmulatedInstance): string {
  const tags = Object.entries(i.tags)
    .map(([k, v]) => `<item><key>${esc(k)}</key><value>${esc(v)}</value></item>`)
    .join("");
  const addr = i.state === "terminated" ? "" : `<privateIpAddress>${i.ip}</privateIpAddress>${i.publicIp ? `<ipAddress>${i.ip}</ipAddress>` : ""}`;
  const reason = i.stateReason ? `<stateReason><code>${esc(i.stateReason.code)}</code><message>${esc(i.stateReason.message)}</message></stateReason>` : "";
  const lifecycle = i.spot ? "<instanceLifecycle>spot</instanceLifecycle>" : "";
  return `<item><instanceId>${i.id}</instanceId><imageId>${esc(i.tags["emu:image"] ?? "")}</imageId>${stateXml("instanceState", i.state)}${reason}<instanceType>${esc(i.instanceType)}</instanceType><subnetId>${esc(i.subnetId)}</subnetId><launchTime>${new Date(i.launchedAt).toISOString()}</launchTime>${addr}${lifecycle}<clientToken>${esc(i.clientToken)}</clientToken><tagSet>${tags}</tagSet></item>`;
}

/** One page of a list call: `MaxResults` (capped by the emulator's page size) from the offset `NextToken` names. */
function page<T>(all: T[], p: URLSearchParams, cap: number): { items: T[]; next: string } {
  const size = Math.min(Number(p.get("MaxResults") ?? cap) || cap, cap);
  const from = p.has("NextToken") ? Number(Buffer.from(p.get("NextToken")!, "base64url").toString("utf8")) : 0;
  const items = all.slice(from, from + size);
  const more = from + size < all.length;
  return { items, next: more ? `<nextToken>${Buffer.from(String(from + size)).toString("base64url")}</nextToken>` : "" };
}

function reply(action: string, inner: string): { status: number; body: string } {
  return { status: 200, body: `<?xml version="1.0" encoding="UTF-8"?>\n<${action}Response xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>${randomUUID()}</requestId>${inner}</${action}Response>` };
}

function notFound(ids: string[]): { status: number; body: string } {
  return { status: 400, body: errorXml("InvalidInstanceID.NotFound", `The instance IDs '${ids.join(", ")}' do not exist`) };
}

/**
 * Why a spot launch is refused, as EC2 answers it: no spot capacity for the
 * type in the subnet's zone, a MaxPrice below the spot price, or the
 * account's spot limit reached; null when it may launch.
 */
function spotRefusal(emu: AwsEmulator, p: URLSearchParams, type: string, subnet: string, region: EmulatedInstance[]): { status: number; body: string } | null {
  const f = emu.faults;
  if (f.noSpotCapacity.includes(type) || f.noSpotCapacity.includes(subnet) || f.noSpotCapacity.includes(`${type}@${subnet}`)) {
    return { status: 500, body: errorXml("InsufficientInstanceCapacity", "There is no Spot capacity available that matches your request.") };
  }
  const max = p.get("InstanceMarketOptions.SpotOptions.MaxPrice");
  const price = f.spotPrices[type];
  if (max !== null && price !== undefined && Number(max) < Number(price)) {
    return { status: 400, body: errorXml("SpotMaxPriceTooLow", `Your Spot request price of ${max} is lower than the minimum required Spot request fulfillment price of ${price}.`) };
  }
  if (region.filter((i) => i.spot && i.state !== "terminated" && i.state !== "shutting-down").length >= f.maxSpotInstances) {
    return { status: 400, body: errorXml("MaxSpotInstanceCountExceeded", "Max spot instance count exceeded") };
  }
  return null;
}

export async function ec2Action(emu: AwsEmulator, action: string, p: URLSearchParams, region: string): Promise<{ status: number; body: string }> {
  // Each region is its own namespace: ids, client tokens and filters see only its instances.
  const all = new Map(emu.inRegion(region).map((i) => [i.id, i]));
  // What the read side lists yet (eventual consistency after a launch).
  const here = new Map([...all].filter(([, i]) => emu.visible(i)));
  if ((action === "DescribeInstances" || action === "DescribeInstanceStatus") && p.has("MaxResults") && p.has("InstanceId.1")) {
    return { status: 400, body: errorXml("InvalidParameterCombination", "The parameter instancesSet cannot be used with the parameter maxResults") };
  }
  switch (action) {
    case "RunInstances": {
      const refusal = emu.faults.runRefusals.shift();
      if (refusal) return { status: 400, body: errorXml(refusal, `emulated ${refusal}: no instance launched`) };
      const type = p.get("InstanceType") ?? "m1.small";
      // The subnet is on the call, or on its primary network interface (EC2 refuses both at once).
      if (p.has("SubnetId") && p.has("NetworkInterface.1.DeviceIndex")) {
        return { status: 400, body: errorXml("InvalidParameterCombination", "Network interfaces and an instance-level subnet ID may not be specified on the same request") };
      }
      const subnet = p.get("SubnetId") ?? p.get("NetworkInterface.1.SubnetId") ?? "";
      const token = p.get("ClientToken") ?? randomUUID();
      // Idempotency: the same client token returns the instance it launched, whatever its state;
      // the same token with other parameters (region and zone aside) is IdempotentParameterMismatch.
      let inst = [...all.values()].find((i) => i.clientToken === token && p.get("ClientToken"));
      const spot = p.get("InstanceMarketOptions.MarketType") === "spot";
      if (inst && (inst.instanceType !== type || inst.subnetId !== subnet || inst.tags["emu:image"] !== (p.get("ImageId") ?? "") || inst.spot !== spot)) {
        return { status: 400, body: errorXml("IdempotentParameterMismatch", "Arguments on this idempotent request are inconsistent with arguments used in previous request(s).") };
      }
      // No capacity for this type in this subnet's zone (InsufficientInstanceCapacity names both; nothing launched).
      if (!inst && (emu.faults.noCapacity.includes(type) || emu.faults.noCapacity.includes(subnet) || emu.faults.noCapacity.includes(`${type}@${subnet}`))) {
        return { status: 500, body: errorXml("InsufficientInstanceCapacity", `We currently do not have sufficient ${type} capacity in the Availability Zone of ${subnet}. Our system will be working on provisioning additional capacity.`) };
      }
      if (!inst && spot) {
        const refusal = spotRefusal(emu, p, type, subnet, [...all.values()]);
        if (refusal) return refusal;
      }
      if (!inst) {
        const tags: Record<string, string> = { "emu:image": p.get("ImageId") ?? "" };
        for (let s = 1; p.has(`TagSpecification.${s}.ResourceType`); s++) {
          if (p.get(`TagSpecification.${s}.ResourceType`) !== "instance") continue;
          for (let t = 1; p.has(`TagSpecification.${s}.Tag.${t}.Key`); t++) tags[p.get(`TagSpecification.${s}.Tag.${t}.Key`)!] = p.get(`TagSpecification.${s}.Tag.${t}.Value`) ?? "";
        }
        inst = emu.newInstance(tags, token, region);
        inst.instanceType = type;
        inst.subnetId = subnet;
        // A public IPv4 address only when the call asks for one (the emulated subnets do not map them on launch).
        inst.publicIp = p.get("NetworkInterface.1.AssociatePublicIpAddress") === "true";
        inst.spot = spot;
        inst.launchParams = Object.fromEntries([...p.entries()].filter(([k]) => !k.startsWith("TagSpecification.")));
      }
      return reply(action, `<reservationId>r-${inst.id.slice(2)}</reservationId><ownerId>000000000000</ownerId><instancesSet>${instanceXml(inst)}</instancesSet>`);
    }
    case "DescribeInstances": {
      const ids = list(p, "InstanceId");
      const missing = ids.filter((id) => !here.has(id));
      if (missing.length > 0) return notFound(missing);
      const fs = filters(p);
      const keep = (i: EmulatedInstance) => (ids.length === 0 || ids.includes(i.id)) && fs.every((f) => matches(i, f));
      // Paged only when the caller asks for pages (MaxResults), as on AWS; the filters apply to each page after it is cut.
      const pg = p.has("MaxResults") ? page([...here.values()], p, emu.faults.pageSize) : { items: [...here.values()], next: "" };
      const items = pg.items.filter(keep).map((i) => `<item><reservationId>r-${i.id.slice(2)}</reservationId><ownerId>000000000000</ownerId><instancesSet>${instanceXml(i)}</instancesSet></item>`).join("");
      return reply(action, `<reservationSet>${items}</reservationSet>${pg.next}`);
    }
    case "DescribeInstanceStatus": {
      const ids = list(p, "InstanceId");
      const missing = ids.filter((id) => !here.has(id));
      if (missing.length > 0) return notFound(missing);
      // Without IncludeAllInstances only running instances are listed; terminated ones are not listed here (DescribeInstances still shows them for a while).
      const all = p.get("IncludeAllInstances") === "true";
      const found = [...here.values()].filter((i) => (ids.length === 0 || ids.includes(i.id)) && i.state !== "terminated" && (all || i.state === "running"));
      const pg = page(found, p, emu.faults.pageSize);
      const check = (bad: boolean, name: string) => `<${name}><status>${bad ? "impaired" : "ok"}</status><details><item><name>reachability</name><status>${bad ? "failed" : "passed"}</status></item></details></${name}>`;
      const items = pg.items.map((i) => {
        const running = i.state === "running";
        const checks = running ? check(i.impaired === "system", "systemStatus") + check(i.impaired === "instance", "instanceStatus") : "<systemStatus><status>not-applicable</status></systemStatus><instanceStatus><status>not-applicable</status></instanceStatus>";
        return `<item><instanceId>${i.id}</instanceId><availabilityZone>${region}a</availabilityZone>${stateXml("instanceState", i.state)}${checks}</item>`;
      });
      return reply(action, `<instanceStatusSet>${items.join("")}</instanceStatusSet>${pg.next}`);
    }
    case "RebootInstances": {
      const ids = list(p, "InstanceId");
      const missing = ids.filter((id) => !here.has(id));
      if (missing.length > 0) return notFound(missing);
      for (const id of ids) {
        const inst = here.get(id)!;
        if (inst.state !== "running") continue;
        if (emu.faults.rebootsIgnored > 0) {
          emu.faults.rebootsIgnored--;
          continue;
        }
        await emu.reboot(inst);
      }
      return reply(action, "<return>true</return>");
    }
    case "TerminateInstances": {
      const ids = list(p, "InstanceId");
      const missing = ids.filter((id) => !here.has(id));
      if (missing.length > 0) return notFound(missing);
      const items: string[] = [];
      for (const id of ids) {
        const inst = here.get(id)!;
        const before = inst.state;
        await emu.terminate(inst);
        items.push(`<item><instanceId>${id}</instanceId>${stateXml("currentState", inst.state)}${stateXml("previousState", before)}</item>`);
      }
      return reply(action, `<instancesSet>${items.join("")}</instancesSet>`);
    }
    default:
      return { status: 400, body: errorXml("InvalidAction", `The action ${action} is not valid for this web service (emulator).`) };
  }
}
