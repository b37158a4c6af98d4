/** The coordinator's address:port pairs a machine must never reach (from the agent's --coordinator URL). */
import { lookup } from "node:dns/promises";
import { ipToInt } from "../../core/network-policy.js";

export async function coordinatorServices(url: string): Promise<Array<{ ip: string; port: number }>> {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    return [];
  }
  const port = Number(u.port || (u.protocol === "https:" ? 443 : 80));
  const host = u.hostname.replace(/^\[|\]$/g, "");
  let ips: string[];
  if (ipToInt(host) !== null) ips = [host];
  else {
    try {
      ips = (await lookup(host, { all: true, family: 4 })).map((a) => a.address);
    } catch {
      ips = [];
    }
  }
  // Loopback is the machine's own inside its namespace; the host's addresses are refused whole (input hook).
  return ips.filter((ip) => !ip.startsWith("127.")).map((ip) => ({ ip, port }));
}
