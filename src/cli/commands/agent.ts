/**
 * `berth agent`: the long-running host daemon (see src/agent/agent.ts).
 *
 * Exit codes: 0 stopped by SIGTERM/SIGINT; 1 could not start (the message
 * says why); 2 usage; 3 another agent holds the state directory; 4 the state
 * directory's identity floor needs a newer agent.
 * Secrets never come from argv: the enroll token is read from
 * --enroll-token-file or BERTH_ENROLL_TOKEN.
 */
import { homedir } from "node:os";
import { join, resolve as resolvePath } from "node:path";
import { Command, InvalidArgumentError, Option } from "commander";
import pino from "pino";
import { parseBytes } from "../../core/bytes.js";
import { durationArg, intArg } from "../common.js";
import { httpLimitOptions, httpLimitsFrom, type HttpLimitFlags } from "../http-limits.js";

function positiveInt(what: string) {
  return (v: string): number => {
    const n = Number(v);
    if (!Number.isSafeInteger(n) || n <= 0) throw new InvalidArgumentError(`${what} must be a positive integer`);
    return n;
  };
}

function bytesArg(what: string) {
  return (v: string): number => {
    try {
      return parseBytes(v, what);
    } catch (e) {
      throw new InvalidArgumentError((e as Error).message.replace(/^invalid_request: /, ""));
    }
  };
}

function defaultStateDir(): string {
  const base = process.env.XDG_STATE_HOME ?? join(homedir(), ".local", "state");
  return join(base, "berth", "agent");
}

export function register(program: Command): void {
  const agentCommand = program
    .command("agent")
    .summary("Run the host agent: sandboxes, the SSH gateway, and the API the coordinator calls")
    .description(
      [
        "Run the host agent. It owns the machines (sandboxes) of this host, serves SSH to them with",
        "per-borrow keys, enforces every key's expiry itself (also while the coordinator is down), and",
        "answers the coordinator's operations (create, install_key, remove_key, fence, scrub, destroy).",
        "",
        "Runtimes:",
        "  gvisor   one runsc sandbox per machine (needs runsc and root).",
        "  process  plain child processes in a directory. NO ISOLATION: commands run as the agent's",
        "           user and can read what it reads. For a laptop, tests or trusted CI only.",
        "  auto     gvisor where runsc is installed and the agent is root, else process.",
        "",
        "One agent per state directory: a second one on the same directory refuses to start.",
        "The enroll token is read from --enroll-token-file or BERTH_ENROLL_TOKEN, never from the command line.",
        "It is used once: a new host enrolls with its own Ed25519 identity key (identity_ed25519 in the",
        "state directory), after which the token file is removed and the key alone proves the host",
        "(docs/host-identity.md).",
      ].join("\n"),
    )
    .option("--state-dir <dir>", "the agent's state directory (store, machines, SSH host key)", defaultStateDir())
    .option("--coordinator <url>", "coordinator URL to enroll with (omit to run without one)")
    .option("--enroll-token-file <file>", "file holding the enroll token (or set BERTH_ENROLL_TOKEN)")
    .option("--listen <host:port>", "address of the agent's HTTP API", "127.0.0.1:0")
    .option("--ssh-listen <host:port>", "address of the SSH gateway", "127.0.0.1:0")
    .option("--advertise-host <host>", "host name the coordinator and clients use to reach this agent (default: the listen host)")
    .addOption(new Option("--runtime <kind>", "sandbox runtime").choices(["auto", "process", "gvisor"]).default("auto"))
    .option("--runsc <path>", "the runsc binary of the gvisor runtime (default: runsc on PATH)")
    .addOption(
      new Option("--runsc-platform <platform>", "gVisor platform: auto picks the fastest this runsc and host offer (kvm where /dev/kvm exists, else systrap, else ptrace)")
        .choices(["auto", "kvm", "systrap", "ptrace"])
        .default("auto"),
    )
    .addOption(
      new Option("--image-cache-max <size>", "most the image cache may hold, unpacked (e.g. 20G); an image or layer over it is refused")
        .argParser(bytesArg("--image-cache-max"))
        .default(20 * 2 ** 30, "20G"),
    )
    .option("--registry-auth <file>", "registry credentials, Docker's config.json shape ({\"auths\": {\"HOST:PORT\": {\"auth\": base64(user:password)}}}); mode 0600")
    .option("--insecure-registry <host:port>", "reach this registry over plain HTTP (repeatable; loopback registries always are)", (v: string, acc: string[]) => [...acc, v], [] as string[])
    .option("--slots <n>", "machines this host offers", positiveInt("--slots"), 4)
    .option("--vcpu <n>", "vCPUs this host offers (default: every CPU of this host)", positiveInt("--vcpu"))
    .option("--memory-mb <n>", "memory this host offers, in MiB (default: this host's memory minus max(1 GiB, 10 %) kept for the host)", positiveInt("--memory-mb"))
    .addOption(
      new Option("--disk-enforce <mode>", "limit each allocation volume's disk by a mounted ext4 image: required (refuse to start where it cannot), auto (where it can; else accounted only), off")
        .choices(["required", "auto", "off"])
        .default("auto"),
    )
    .addOption(new Option("--disk <size>", "disk this host offers to allocation volumes, e.g. 200G (default: the space free on the filesystem of its volumes directory minus max(2 GiB, 10 % of that filesystem))").argParser(bytesArg("--disk")))
    .option("--name <name>", "this host's name at the coordinator (default: the system host name)")
    .option("--no-network", "refuse machines with a network policy (egress) on this host")
    .option("--network-range <cidr>", "address range of machine networks, a /30 per machine (default 10.213.0.0/16)")
    .option("--network-resolver <ip>", "resolve allow-list names through this DNS server instead of the host's resolver")
    .option("--network-probe-deny <host:port>", "an extra target every readiness probe must find refused (repeatable)", (v: string, acc: string[]) => [...acc, v], [] as string[])
    .option("--network-probe-refused-resolver <ip>", "a resolver every readiness probe must find refused unless the policy allows it (repeatable)", (v: string, acc: string[]) => [...acc, v], [] as string[])
    .option("--ssh-auth-timeout <duration>", "SSH gateway: a connection must authenticate within this from its TCP connection, else it is closed (default 30s)", durationArg("--ssh-auth-timeout"))
    .option("--ssh-max-unauthenticated <n>", "SSH gateway: connections not yet authenticated at once, 0 for no cap (default 128)", intArg("--ssh-max-unauthenticated", 0, 1_000_000))
    .option("--ssh-max-unauthenticated-per-address <n>", "SSH gateway: such connections from one client address, 0 for no cap (default 32)", intArg("--ssh-max-unauthenticated-per-address", 0, 1_000_000))
    // For `berth up`, which runs the agent in a session of its own: its end (even kill -9) closes the pipe.
    .addOption(new Option("--stop-on-stdin-eof", "stop (as on SIGTERM) when standard input reaches end of file").hideHelp())
    .addOption(new Option("--log-level <level>", "log level (logs go to stderr)").choices(["debug", "info", "warn", "error"]).default("info"));
  httpLimitOptions(agentCommand, "agent API")
    .addHelpText(
      "after",
      "\nExit codes: 0 stopped by SIGTERM/SIGINT, 1 could not start, 2 usage, 3 another agent holds the state directory,\n" +
        "4 the state directory switched to host identity and needs a newer agent.\n" +
        "Once ready it prints one line to stdout: `berth agent ready api=URL ssh=HOST:PORT host=ID runtime=KIND`\n" +
        "(gvisor adds `runsc=VERSION platform=PLATFORM`). A runsc older than 0.0~20240729 still runs sandboxes, with\n" +
        "one warning on stderr naming what breaks (docs/runtimes.md).",
    )
    .action(runAgent);
}

/** The flags of `berth agent`, as commander parses them. */
interface AgentFlags extends HttpLimitFlags {
  stateDir: string;
  coordinator?: string;
  enrollTokenFile?: string;
  listen: string;
  sshListen: string;
  advertiseHost?: string;
  runtime: "auto" | "process" | "gvisor";
  runsc?: string;
  runscPlatform: "auto" | "kvm" | "systrap" | "ptrace";
  imageCacheMax: number;
  registryAuth?: string;
  insecureRegistry: string[];
  slots: number;
  vcpu?: number;
  memoryMb?: number;
  disk?: number;
  diskEnforce: "required" | "auto" | "off";
  name?: string;
  logLevel: string;
  network: boolean;
  networkRange?: string;
  networkResolver?: string;
  networkProbeDeny: string[];
  networkProbeRefusedResolver: string[];
  stopOnStdinEof?: boolean;
  sshAuthTimeout?: number;
  sshMaxUnauthenticated?: number;
  sshMaxUnauthenticatedPerAddress?: number;
}

/**
 * The agent's run: signal handlers first, the agent's modules loaded, the
 * agent started (exit 1, 3 or 4 with the reason if it cannot), the ready
 * line printed, then it runs until a stop signal.
 */
async function runAgent(o: AgentFlags): Promise<void> {
  const log = pino({ level: o.logLevel, base: { component: "agent" } }, pino.destination({ dest: 2, sync: true }));
  // Handlers first: a signal that arrives while starting (or right after the
  // ready line) stops the agent cleanly instead of killing it mid-write.
  let signalled: string | null = null;
  let onSignal: (signal: string) => void = (signal) => {
    signalled = signal;
  };
  process.once("SIGTERM", () => onSignal("SIGTERM"));
  process.once("SIGINT", () => onSignal("SIGINT"));
  if (o.stopOnStdinEof) {
    process.stdin.on("end", () => onSignal("stdin EOF"));
    process.stdin.on("error", () => onSignal("stdin EOF"));
    process.stdin.resume();
  }
  // Loaded only here: every other command starts without the agent.
  const [{ startAgent }, { readEnrollToken }, { AgentLockedError }, { FloorRefusedError }] = await Promise.all([
    import("../../agent/agent.js"),
    import("../../agent/enroll.js"),
    import("../../agent/store/store.js"),
    import("../../agent/identity/floor.js"),
  ]);
  let agent: Awaited<ReturnType<typeof startAgent>>;
  try {
    // The file is read by the agent only if it needs the token: a host on its identity key removed it.
    const enrollToken = o.coordinator !== undefined && o.enrollTokenFile === undefined ? readEnrollToken(undefined, process.env) : null;
    agent = await startAgent(await agentOptions(o, enrollToken, log));
  } catch (e) {
    const msg = e instanceof Error ? e.message : String(e);
    process.stderr.write(`berth agent: ${msg}\n`);
    process.exit(e instanceof AgentLockedError ? 3 : e instanceof FloorRefusedError ? 4 : 1);
  }
  await new Promise<void>((resolve) => {
    onSignal = (signal) => {
      log.info({ signal }, "stopping");
      void agent.stop().then(resolve, resolve);
    };
    if (signalled !== null) onSignal(signalled);
    else {
      const d = agent.runtime.detail;
      // The one line an operator must not miss, whatever the log level.
      if (d.warning) process.stderr.write(`berth agent: warning: ${d.warning}\n`);
      const runsc = d.runsc ? ` runsc=${d.runsc.version} platform=${d.runsc.platform}` : "";
      process.stdout.write(
        `berth agent ready api=${agent.url} ssh=${agent.ssh.host}:${agent.ssh.port} host=${agent.hostId ?? "-"} runtime=${agent.runtime.kind}${runsc}\n`,
      );
    }
  });
  process.exit(0);
}

/** What `startAgent` is given, from the flags. */
async function agentOptions(o: AgentFlags, enrollToken: string | null, log: pino.Logger) {
  return {
    stateDir: o.stateDir,
    coordinatorUrl: o.coordinator,
    enrollToken: enrollToken ?? undefined,
    enrollTokenFile: o.coordinator !== undefined ? o.enrollTokenFile : undefined,
    listen: o.listen,
    sshListen: o.sshListen,
    advertiseHost: o.advertiseHost,
    runtime: o.runtime,
    gvisor: { ...(o.runsc !== undefined ? { runsc: resolvePath(o.runsc) } : {}), platform: o.runscPlatform },
    images: {
      maxBytes: o.imageCacheMax,
      registry: { ...(o.registryAuth !== undefined ? { authFile: resolvePath(o.registryAuth) } : {}), insecure: o.insecureRegistry },
    },
    slots: o.slots,
    ...(o.vcpu !== undefined ? { vcpu: o.vcpu } : {}),
    ...(o.memoryMb !== undefined ? { memoryMib: o.memoryMb } : {}),
    ...(o.disk !== undefined ? { diskMib: Math.floor(o.disk / 2 ** 20) } : {}),
    diskEnforce: o.diskEnforce,
    name: o.name,
    log,
    network: o.network ? await networkOptions(o) : (false as const),
    httpLimits: httpLimitsFrom(o),
    sshAdmission: {
      ...(o.sshAuthTimeout !== undefined ? { authTimeoutMs: o.sshAuthTimeout } : {}),
      ...(o.sshMaxUnauthenticated !== undefined ? { maxUnauthenticated: o.sshMaxUnauthenticated } : {}),
      ...(o.sshMaxUnauthenticatedPerAddress !== undefined ? { maxUnauthenticatedPerAddress: o.sshMaxUnauthenticatedPerAddress } : {}),
    },
  };
}

/** The agent's machine-network options from its flags (docs/network.md). */
async function networkOptions(o: { networkRange?: string; networkResolver?: string; networkProbeDeny: string[]; networkProbeRefusedResolver: string[] }) {
  const deny = o.networkProbeDeny.map((t) => {
    const m = /^(\d{1,3}(?:\.\d{1,3}){3}):(\d{1,5})$/.exec(t);
    if (!m) throw new Error(`--network-probe-deny ${t}: use IPV4:PORT`);
    return { host: m[1]!, port: Number(m[2]), why: "configured deny target" };
  });
  let resolve: ((name: string) => Promise<string[]>) | undefined;
  if (o.networkResolver) {
    const { Resolver } = await import("node:dns/promises");
    const r = new Resolver({ timeout: 2000, tries: 2 });
    r.setServers([o.networkResolver]);
    resolve = (name) => r.resolve4(name);
  }
  return {
    ...(o.networkRange ? { range: o.networkRange } : {}),
    ...(resolve ? { resolve } : {}),
    probe: { deny, ...(o.networkProbeRefusedResolver.length > 0 ? { refusedResolvers: o.networkProbeRefusedResolver } : {}) },
  };
}
