/**
 * A test target in a network namespace of its own, joined to the host by a
 * veth pair (10.214.<n>.0/30): a TCP server that answers on an allowed port,
 * another that a policy leaves out, and a tiny DNS responder (UDP 53) that
 * answers A queries for every name with the target's address. Test traffic
 * never leaves this machine: every address is on a veth this helper creates.
 */
import { spawn, type ChildProcess, execFileSync } from "node:child_process";
import { Resolver } from "node:dns/promises";
import { randomBytes } from "node:crypto";

export interface NetnsTarget {
  netns: string;
  ip: string;
  hostIp: string;
  /** Answers "hello\n". */
  allowedPort: number;
  /** Also listens (answers "nope\n"), but policies in tests leave it out. */
  deniedPort: number;
  /** Resolves a name through the target's DNS responder (the agent's pinning resolver in tests). */
  resolve(name: string): Promise<string[]>;
  close(): Promise<void>;
}

const SERVER = String.raw`
const net = require("net"), dgram = require("dgram");
const [ip, a, d] = process.argv.slice(1);
const serve = (text) => (s) => { s.on("error", () => {}); s.end(text); };
net.createServer(serve("hello\n")).listen(Number(a), "0.0.0.0");
net.createServer(serve("nope\n")).listen(Number(d), "0.0.0.0");
const u = dgram.createSocket("udp4");
u.on("message", (m, r) => {
  // Echo the question, answer one A record with the target's address.
  let i = 12; while (m[i] !== 0) i += m[i] + 1; const q = m.subarray(12, i + 5);
  const h = Buffer.from([m[0], m[1], 0x81, 0x80, 0, 1, 0, 1, 0, 0, 0, 0]);
  const ans = Buffer.concat([Buffer.from([0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4]), Buffer.from(ip.split(".").map(Number))]);
  u.send(Buffer.concat([h, q, ans]), r.port, r.address);
});
u.bind(53, "0.0.0.0", () => process.stdout.write("ready\n"));
`;

function sh(args: string[]): void {
  execFileSync(args[0]!, args.slice(1), { stdio: ["ignore", "ignore", "pipe"] });
}

export async function startNetnsTarget(n = 1 + (randomBytes(1)[0]! % 200)): Promise<NetnsTarget> {
  const tag = randomBytes(3).toString("hex");
  const netns = `berth-test-${tag}`;
  const hostIf = `bt${tag}`;
  const hostIp = `10.214.${n}.1`;
  const ip = `10.214.${n}.2`;
  sh(["ip", "netns", "add", netns]);
  let server: ChildProcess | null = null;
  const close = async (): Promise<void> => {
    server?.kill("SIGKILL");
    try {
      sh(["ip", "link", "del", hostIf]);
    } catch {
      /* gone */
    }
    try {
      sh(["ip", "netns", "del", netns]);
    } catch {
      /* gone */
    }
  };
  try {
    sh(["ip", "link", "add", hostIf, "type", "veth", "peer", "name", "eth0", "netns", netns]);
    sh(["ip", "addr", "add", `${hostIp}/30`, "dev", hostIf]);
    sh(["sysctl", "-q", "-w", `net.ipv4.conf.${hostIf}.forwarding=1`]);
    sh(["ip", "link", "set", hostIf, "up"]);
    sh(["ip", "-n", netns, "addr", "add", `${ip}/30`, "dev", "eth0"]);
    sh(["ip", "-n", netns, "link", "set", "lo", "up"]);
    sh(["ip", "-n", netns, "link", "set", "eth0", "up"]);
    sh(["ip", "-n", netns, "route", "add", "default", "via", hostIp]);
    server = spawn("ip", ["netns", "exec", netns, process.execPath, "-e", SERVER, ip, "8080", "9090"], { stdio: ["ignore", "pipe", "inherit"] });
    await new Promise<void>((resolve, reject) => {
      server!.stdout!.once("data", () => resolve());
      server!.once("exit", (c) => reject(new Error(`target server exited ${c}`)));
    });
  } catch (e) {
    await close();
    throw e;
  }
  const resolver = new Resolver({ timeout: 1000, tries: 1 });
  resolver.setServers([ip]);
  return { netns, ip, hostIp, allowedPort: 8080, deniedPort: 9090, resolve: (name) => resolver.resolve4(name), close };
}
