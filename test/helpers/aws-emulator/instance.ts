/**
 * One emulated EC2 instance: a real local sandbox. Its "disk" is a directory
 * (cloud-init instance id, kernel boot id, sshd host key, homes, /etc/berth);
 * its "OS" runs real processes: SSM commands run with bash in the sandbox
 * (BERTH_GUEST_ROOT = the directory, system tools that need root on a real
 * guest — useradd, systemd-run, systemctl, pkill, crontab, sshd -T — are small
 * shims in .emu/bin), and an SSH server (ssh2) on its own loopback address
 * authorizes keys from the root-owned key file the guest programs write,
 * honouring OpenSSH's expiry-time option. Every process carries the marker
 * BERTH_EMU_INSTANCE=<id> (sessions also BERTH_EMU_USER=<user>), so a reboot
 * really kills them all and writes a new boot id; a terminate does the same
 * and never boots again. Loopback only.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync, existsSync, chmodSync } from "node:fs";
import { join } from "node:path";
import { randomUUID } from "node:crypto";
import ssh2, { type AuthContext, type PublicKeyAuthContext } from "ssh2";
import { generateSshKeyPair } from "../../../src/core/ssh-keys.js";
import { allPids, readEnviron } from "../../../src/agent/runtime/procfs.js";

export type InstanceState = "pending" | "running" | "shutting-down" | "terminated" | "stopping" | "stopped";

const SHIMS: Record<string, string> = {
  useradd: `#!/bin/bash\nu="\${@: -1}"\nmkdir -p "$BERTH_GUEST_ROOT/home/$u"\ngrep -q "^$u:" "$BERTH_GUEST_ROOT/etc/passwd" 2>/dev/null || echo "$u:x:1000:1000::/home/$u:/bin/bash" >> "$BERTH_GUEST_ROOT/etc/passwd"\n`,
  systemctl: `#!/bin/bash\n# stop <unit>.timer: kill the emulated timer; enable: see below; reload: the emulated sshd reads keys on every login (fails when .emu/fail-reload exists)\nif [ "$1" = reload ] && [ -f "$BERTH_GUEST_ROOT/.emu/fail-reload" ]; then echo "Failed to reload $2.service: Job for $2.service canceled." >&2; exit 1; fi\n# enable <unit>.service: wanted by multi-user.target, so the emulated boot runs it\nif [ "$1" = enable ]; then w="$BERTH_GUEST_ROOT/etc/systemd/system/multi-user.target.wants"; mkdir -p "$w"; ln -sf "../$2" "$w/$2"; fi\nif [ "$1" = stop ]; then u="\${2%.timer}"; f="$BERTH_GUEST_ROOT/run/units/$u.pid"; [ -f "$f" ] && kill -KILL -- "-$(cat "$f")" 2>/dev/null; rm -f "$f"; fi\nexit 0\n`,
  "systemd-run": `#!/bin/bash\nunit=""; secs=""\nwhile [ $# -gt 0 ]; do case "$1" in --unit) unit="$2"; shift 2;; --on-active=*) secs="\${1#--on-active=}"; secs="\${secs%s}"; shift;; --*) shift;; *) break;; esac; done\nmkdir -p "$BERTH_GUEST_ROOT/run/units"\nsetsid bash -c 'sleep "$0"; exec "$@"' "$secs" "$@" </dev/null >/dev/null 2>&1 9>&- &\necho $! > "$BERTH_GUEST_ROOT/run/units/$unit.pid"\n`,
  pkill: `#!/bin/bash\n# pkill -KILL -u USER: the instance's processes of that user (by marker)\nsig=KILL; u=""\nwhile [ $# -gt 0 ]; do case "$1" in -u) u="$2"; shift 2;; -*) sig="\${1#-}"; shift;; *) shift;; esac; done\nn=0\nfor e in /proc/[0-9]*/environ; do p="\${e#/proc/}"; p="\${p%/environ}"\n  if tr '\\0' '\\n' < "$e" 2>/dev/null | grep -qx "BERTH_EMU_INSTANCE=$BERTH_EMU_INSTANCE" && tr '\\0' '\\n' < "$e" 2>/dev/null | grep -qx "BERTH_EMU_USER=$u"; then kill -"$sig" "$p" 2>/dev/null && n=$((n+1)); fi\ndone\n[ "$n" -gt 0 ]\n`,
  crontab: `#!/bin/bash\nexit 0\n`,
  // sshd -T -C user=U,…: the effective AuthorizedKeysFile for U, as OpenSSH prints it: the berth drop-in for U
  // applies unless .emu/no-dropins exists (an sshd_config without `Include /etc/ssh/sshd_config.d/*.conf`).
  sshd: `#!/bin/bash\nu="$(printf '%s' "$*" | sed -n 's/.*user=\\([^, ]*\\).*/\\1/p')"\nif [ ! -f "$BERTH_GUEST_ROOT/.emu/no-dropins" ] && [ -f "$BERTH_GUEST_ROOT/etc/ssh/sshd_config.d/50-berth-$u.conf" ]; then echo "authorizedkeysfile /etc/berth/keys/%u"; else echo "authorizedkeysfile .ssh/authorized_keys .ssh/authorized_keys2"; fi\n`,
};

export interface Invocation {
  commandId: string;
  comment: string;
  script: string;
  /** GetCommandInvocation's statuses as SSM names them (no DeliveryTimedOut here: that is a StatusDetails of TimedOut). */
  status: "Pending" | "InProgress" | "Delayed" | "Success" | "Failed" | "TimedOut" | "Cancelling" | "Cancelled";
  /** StatusDetails: the status, or why it ended (DeliveryTimedOut, ExecutionTimedOut). */
  details?: string;
  /** AWS-RunShellScript's executionTimeout, seconds: a run longer than this is killed and ends TimedOut. */
  executionTimeoutS?: number;
  /** Kills the running script (set while it runs). */
  kill?: () => void;
  code: number;
  stdout: string;
  stderr: string;
  requestedAt: number;
}

export class EmulatedInstance {
  state: InstanceState = "pending";
  /** The region it was launched in (set by the emulator). */
  region = "us-east-1";
  /** InstanceType and SubnetId of the RunInstances call that launched it. */
  instanceType = "m1.small";
  subnetId = "";
  /** A public IPv4 address was requested at launch (served on the same loopback address as the private one). */
  publicIp = false;
  /** The RunInstances parameters it was launched with, as sent on the wire (tags aside). */
  launchParams: Record<string, string> = {};
  readonly root: string;
  readonly hostKey = generateSshKeyPair("emulated-host");
  ssmOnline = false;
  /** Until this time (ms) DescribeInstances does not list it and calls naming its id answer InvalidInstanceID.NotFound (eventual consistency after RunInstances). */
  visibleAt = 0;
  /** A RebootInstances is in progress (requested, the new boot not up yet): another request is coalesced into it. */
  rebooting = false;
  /** Launched as a spot instance (InstanceMarketOptions.MarketType=spot). */
  spot = false;
  /** A spot interruption notice, as IMDS answers spot/instance-action: {action, time}. */
  interruption: { action: "terminate" | "stop"; time: string } | null = null;
  /** Why it last changed state (StateReason), e.g. Server.SpotInstanceTermination. */
  stateReason: { code: string; message: string } | null = null;
  /** Failed status checks (DescribeInstanceStatus): the system (AWS hardware/network) or the instance (its OS) reachability check. */
  impaired: "system" | "instance" | null = null;
  #server: ssh2.Server | null = null;
  readonly #conns = new Set<ssh2.Connection>();
  readonly #children = new Set<ChildProcess>();

  constructor(
    readonly id: string,
    readonly tags: Record<string, string>,
    readonly clientToken: string,
    readonly ip: string,
    readonly sshPort: number,
    baseDir: string,
    readonly launchedAt: number,
  ) {
    this.root = join(baseDir, id);
    for (const d of ["var/lib/cloud/data", "proc/sys/kernel/random", "etc/ssh", "home", "tmp", "run", ".emu/bin"]) mkdirSync(join(this.root, d), { recursive: true });
    writeFileSync(join(this.root, "var/lib/cloud/data/instance-id"), `${id}\n`);
    writeFileSync(join(this.root, "etc/ssh/ssh_host_ed25519_key.pub"), `${this.hostKey.publicKey.split(" ").slice(0, 2).join(" ")} root@${id}\n`);
    for (const [name, text] of Object.entries(SHIMS)) {
      const p = join(this.root, ".emu/bin", name);
      writeFileSync(p, text);
      chmodSync(p, 0o755);
    }
  }

  bootId(): string {
    const p = join(this.root, "proc/sys/kernel/random/boot_id");
    return existsSync(p) ? readFileSync(p, "utf8").trim() : "";
  }

  /** Power on: a new boot id, the enabled services run (as systemd runs multi-user.target's), sshd listening, then the SSM agent online. */
  async boot(): Promise<void> {
    writeFileSync(join(this.root, "proc/sys/kernel/random/boot_id"), `${randomUUID()}\n`);
    const wants = join(this.root, "etc/systemd/system/multi-user.target.wants");
    for (const unit of existsSync(wants) ? readdirSync(wants).sort() : []) {
      const exec = /^ExecStart=(.+)$/m.exec(readFileSync(join(wants, unit), "utf8"))?.[1];
      if (exec) await this.run(`exec ${exec}`);
    }
    await this.#startSshd();
    this.ssmOnline = true;
  }

  /** Power off: every process of the instance killed, every SSH connection cut. */
  async halt(): Promise<void> {
    this.ssmOnline = false;
    for (const c of this.#conns) c.end();
    this.#conns.clear();
    await new Promise<void>((r) => (this.#server ? this.#server.close(() => r()) : r()));
    this.#server = null;
    for (const ch of this.#children) ch.kill("SIGKILL");
    this.killMarked();
    // /run is a tmpfs: the transient units' records go with the boot.
    rmSync(join(this.root, "run/units"), { recursive: true, force: true });
  }

  /** SIGKILL to every process carrying this instance's marker. Returns how many. */
  killMarked(): number {
    let n = 0;
    for (const pid of allPids()) {
      if (pid === process.pid) continue;
      if (readEnviron(pid).split("\0").includes(`BERTH_EMU_INSTANCE=${this.id}`)) {
        try {
          process.kill(pid, "SIGKILL");
          n++;
        } catch {
          /* gone */
        }
      }
    }
    return n;
  }

  /** Live processes of this instance (by marker). */
  processes(): number[] {
    return allPids().filter((pid) => pid !== process.pid && readEnviron(pid).split("\0").includes(`BERTH_EMU_INSTANCE=${this.id}`));
  }

  env(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
    return { PATH: `${join(this.root, ".emu/bin")}:${process.env.PATH ?? "/usr/bin:/bin"}`, BERTH_GUEST_ROOT: this.root, BERTH_EMU_INSTANCE: this.id, LANG: "C", ...extra };
  }

  /** Runs an SSM shell script the way the agent would; resolves with its exit status and output. `ctl.kill` is set to end it (its whole process group). */
  run(script: string, ctl: { kill?: () => void } = {}): Promise<{ code: number; stdout: string; stderr: string }> {
    return new Promise((resolve) => {
      const ch = spawn("bash", ["-c", script], { cwd: this.root, env: this.env(), stdio: ["ignore", "pipe", "pipe"], detached: true });
      this.#children.add(ch);
      ctl.kill = () => {
        try {
          process.kill(-ch.pid!, "SIGKILL");
        } catch {
          /* gone */
        }
      };
      let out = "";
      let err = "";
      ch.stdout.on("data", (d: Buffer) => (out += d.toString()));
      ch.stderr.on("data", (d: Buffer) => (err += d.toString()));
      ch.on("close", (code) => {
        this.#children.delete(ch);
        resolve({ code: code ?? -1, stdout: out, stderr: err });
      });
    });
  }

  /** Authorized keys of a user: [{blob, expiresAt}] from the root-owned key file. */
  #keysOf(user: string): Array<{ blob: Buffer; expiresAt: number | null }> {
    if (!/^[a-z_][a-z0-9_-]{0,31}$/.test(user)) return [];
    let text = "";
    try {
      text = readFileSync(join(this.root, "etc/berth/keys", user), "utf8");
    } catch {
      return [];
    }
    const out: Array<{ blob: Buffer; expiresAt: number | null }> = [];
    for (const line of text.split("\n")) {
      const m = /^(?:expiry-time="(\d{4})(\d\d)(\d\d)(\d\d)(\d\d)(\d\d)Z"\s+)?(\S+)\s+(\S+)/.exec(line.trim());
      if (!m) continue;
      const expiresAt = m[1] ? Date.UTC(+m[1], +m[2]! - 1, +m[3]!, +m[4]!, +m[5]!, +m[6]!) : null;
      out.push({ blob: Buffer.from(m[8]!, "base64"), expiresAt });
    }
    return out;
  }

  async #startSshd(): Promise<void> {
    const server = new ssh2.Server({ hostKeys: [this.hostKey.privateKey] }, (client) => {
      this.#conns.add(client);
      let user = "";
      client.on("error", () => undefined);
      client.on("close", () => this.#conns.delete(client));
      client.on("authentication", (ctx: AuthContext) => {
        if (ctx.method !== "publickey") return ctx.reject(["publickey"]);
        const pk = ctx as PublicKeyAuthContext;
        const now = Date.now();
        const ok = this.#keysOf(pk.username).some((k) => k.blob.equals(pk.key.data) && (k.expiresAt === null || now < k.expiresAt));
        if (!ok) return pk.reject(["publickey"]);
        if (!pk.signature || !pk.blob) return pk.accept();
        const parsed = ssh2.utils.parseKey(pk.key.data);
        const pub = Array.isArray(parsed) ? parsed[0] : parsed;
        if (!pub || pub instanceof Error || pub.verify(pk.blob, pk.signature, pk.hashAlgo) !== true) return pk.reject(["publickey"]);
        user = pk.username;
        pk.accept();
      });
      client.on("ready", () => {
        client.on("session", (accept) => {
          const session = accept();
          session.on("exec", (acceptExec, _reject, info) => {
            const stream = acceptExec();
            const home = join(this.root, "home", user);
            mkdirSync(home, { recursive: true });
            const ch = spawn("bash", ["-c", info.command], { cwd: home, env: this.env({ HOME: home, USER: user, BERTH_EMU_USER: user }), stdio: ["pipe", "pipe", "pipe"], detached: true });
            this.#children.add(ch);
            ch.stdout.pipe(stream, { end: false });
            ch.stderr.pipe(stream.stderr, { end: false });
            stream.pipe(ch.stdin).on("error", () => undefined);
            ch.on("close", (code, signal) => {
              this.#children.delete(ch);
              try {
                if (signal) stream.exit(signal.replace(/^SIG/, ""), false, "");
                else stream.exit(code ?? 255);
                stream.end();
              } catch {
                /* channel gone */
              }
            });
          });
        });
      });
    });
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(this.sshPort, this.ip, () => resolve());
    });
    this.#server = server;
  }
}
