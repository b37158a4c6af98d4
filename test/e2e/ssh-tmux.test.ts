/**
 * `berth ssh` in a real terminal: a real `berth serve` + `berth agent`, a keeper
 * borrow written as a receipt by `berth borrow`, and `berth ssh --receipt` run
 * inside a tmux session driven with send-keys. Proves: a prompt appears; each
 * tmux resize shows up as `stty size` inside; Ctrl-C interrupts a running
 * command and the prompt returns; Ctrl-Z suspends berth locally with the local
 * terminal restored, and `fg` resends the (changed) window size; `exit N`
 * returns to the local shell with the terminal restored (icanon, echo) and
 * berth's exit status N; so do SIGTERM to berth (143) and the machine side
 * closing the session (the borrow returned: 255); on gvisor the terminal is a
 * real one (tty, /dev/pts, stty, job control, less, vim: realTerminal). Also: the `--print` command line works with the
 * system ssh client, and `berth ssh ALLOCATION` without its key is refused clearly.
 * Process runtime always; gvisor where runsc and root are present.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { BIN, Cluster, berthSync } from "../helpers/cluster.js";
import { gvisorAvailability } from "../../src/agent/runtime/index.js";

const TMUX = "/usr/bin/tmux";
const noTmux = existsSync(TMUX) ? null : `tmux is not installed (${TMUX} missing)`;

/** One private tmux server with one window running a plain local shell (dash: it never repairs the terminal itself, unlike bash/readline) whose prompt is "LOCAL$ ". */
class Tmux {
  readonly socket: string;
  constructor(dir: string) {
    this.socket = join(dir, `tmux-${randomBytes(4).toString("hex")}`);
  }
  cmd(...args: string[]): string {
    const r = spawnSync(TMUX, ["-S", this.socket, ...args], { encoding: "utf8", timeout: 10_000 });
    if (r.status !== 0) throw new Error(`tmux ${args.join(" ")} failed: ${r.stderr}`);
    return r.stdout;
  }
  start(cwd: string): void {
    this.cmd("-f", "/dev/null", "new-session", "-d", "-s", "t", "-x", "100", "-y", "30", "-c", cwd, "env -i PATH=/usr/bin:/bin HOME=/tmp TERM=tmux-256color PS1='LOCAL$ ' /bin/sh -i");
    this.cmd("set-option", "-g", "status", "off");
  }
  type(text: string): void {
    this.cmd("send-keys", "-t", "t", "-l", text);
    this.cmd("send-keys", "-t", "t", "Enter");
  }
  keys(...k: string[]): void {
    this.cmd("send-keys", "-t", "t", ...k);
  }
  /** The whole pane history, wrapped lines joined, trailing blanks removed (so offsets survive a taller pane). */
  screen(): string {
    return this.cmd("capture-pane", "-p", "-J", "-S", "-", "-t", "t")
      .split("\n")
      .map((l) => l.replace(/\s+$/, ""))
      .join("\n")
      .trimEnd();
  }
  /** The last non-empty line of the visible screen. */
  lastLine(): string {
    const lines = this.cmd("capture-pane", "-p", "-t", "t").split("\n").filter((l) => l.trim().length > 0);
    return lines[lines.length - 1] ?? "";
  }
  async waitFor(re: RegExp, what: string, from = 0, ms = 30_000): Promise<RegExpMatchArray> {
    const deadline = Date.now() + ms;
    for (;;) {
      const s = this.screen().slice(from);
      const m = s.match(re);
      if (m) return m;
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what} (${re}); screen:\n${this.screen().slice(-1500)}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  kill(): void {
    spawnSync(TMUX, ["-S", this.socket, "kill-server"], { timeout: 10_000 });
  }
}

const pause = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * Ask the remote shell for `stty size` until it reports rows x cols. The resize
 * travels tmux -> SIGWINCH -> berth -> SSH window-change -> agent while the
 * typed command travels as input, so the first answer may predate it.
 */
async function remoteSize(tmux: Tmux, rows: number, cols: number): Promise<void> {
  for (let attempt = 0; ; attempt++) {
    const from = tmux.screen().length;
    const tag = `${attempt}${randomBytes(2).toString("hex")}`;
    tmux.type(`echo "sz${tag}=$(stty size)"`);
    const m = await tmux.waitFor(new RegExp(`^sz${tag}=(\\d+ \\d+)$`, "m"), `stty size (attempt ${attempt})`, from);
    if (m[1] === `${rows} ${cols}`) return;
    if (attempt >= 20) assert.fail(`the remote terminal still reports ${m[1]}, not ${rows} ${cols}`);
    await pause(100);
  }
}

/**
 * The session's terminal is a real one (on gvisor too, where the sandbox's own
 * devpts provides it): `tty` names a /dev/pts device listed in /dev/pts, `stty -a`
 * works and reports the window (rows x cols), the login shell has job control
 * (a job stopped by SIGTSTP is reported, the shell answers, `fg` resumes it),
 * and full-screen programs work (less pages and quits; vim edits and writes).
 */
async function realTerminal(tmux: Tmux): Promise<void> {
  // tty names a /dev/pts device, and that device is listed in /dev/pts.
  let from = tmux.screen().length;
  tmux.type("echo tty=$(tty); l=$(ls /dev/pts); echo ls-rc=$? $l");
  const tty = (await tmux.waitFor(/^tty=(.*)$/m, "tty's answer", from))[1] ?? "";
  assert.match(tty, /^\/dev\/pts\/\d+$/, `tty says ${tty}`);
  const lsLine = await tmux.waitFor(/^ls-rc=(\d+) ?(.*)$/m, "ls /dev/pts", from);
  assert.equal(lsLine[1], "0", `ls /dev/pts: ${lsLine[0]}`);
  assert.ok((lsLine[2] ?? "").split(/\s+/).includes(tty.slice("/dev/pts/".length)), `${tty} is listed in /dev/pts: ${lsLine[0]}`);

  // stty -a works and reports the tmux window's size.
  from = tmux.screen().length;
  tmux.type("s=$(stty -a); echo stty-rc=$?; echo \"$s\" | head -1");
  await tmux.waitFor(/rows 40; columns 132/, "stty -a's window size", from);
  await tmux.waitFor(/^stty-rc=0$/m, "stty -a's status", from);

  // Job control: a job stops on SIGTSTP, the shell reports it and gets the terminal back; fg resumes it.
  from = tmux.screen().length;
  tmux.type("sh -c 'kill -TSTP $$; echo resumed-$((3*3))'");
  await tmux.waitFor(/Stopped/, "the shell reporting the stopped job", from, 20_000);
  tmux.type("echo back-$((2+2))");
  await tmux.waitFor(/^back-4$/m, "the shell answering while the job is stopped", from, 20_000);
  tmux.type("fg");
  await tmux.waitFor(/^resumed-9$/m, "the job resumed by fg", from, 20_000);

  // less: a full-screen pager shows the first page and its prompt, q quits.
  from = tmux.screen().length;
  tmux.type("seq 1000 | less");
  await tmux.waitFor(/^39\n:\s*$/m, "less's first page and prompt", 0, 20_000); // the pager's own screen: no history before it
  tmux.keys("q");
  tmux.type("echo less-rc=$?");
  await tmux.waitFor(/^less-rc=0$/m, "less quit", from, 20_000);

  // vim: insert text, write, quit; the file holds it.
  tmux.type("vim -u NONE -N vt.txt");
  await tmux.waitFor(/"vt\.txt" \[New\]/, "vim's screen", 0, 20_000);
  // Each key waits for vim to show it took the one before: an Escape followed at once by ':' can reach vim as one
  // Alt-: key (seen on a loaded host: the text was never written).
  tmux.keys("i");
  await tmux.waitFor(/-- INSERT --/, "vim's insert mode", 0, 20_000);
  tmux.cmd("send-keys", "-t", "t", "-l", "typed-in-vim");
  await tmux.waitFor(/^typed-in-vim/m, "the typed text in vim", 0, 20_000);
  tmux.keys("Escape");
  for (const deadline = Date.now() + 20_000; /-- INSERT --/.test(tmux.lastLine()); ) {
    if (Date.now() > deadline) throw new Error(`vim stayed in insert mode after Escape; screen:\n${tmux.screen().slice(-1500)}`);
    await pause(50);
  }
  tmux.type(":wq");
  // vim leaves the terminal's input behind it when it exits: the next line is typed once the prompt is back.
  await tmux.waitFor(/vim -u NONE -N vt\.txt\nREMOTE>$/, "the prompt after vim", 0, 20_000);
  tmux.type("echo file=$(cat vt.txt)");
  await tmux.waitFor(/^file=typed-in-vim$/m, "the file vim wrote", 0, 20_000);
}

for (const runtime of ["process", "gvisor"] as const) {
  const gv = gvisorAvailability();
  const skip = noTmux ?? (runtime === "gvisor" && !gv.ok ? `gvisor runtime unavailable: ${(gv as { why: string }).why}` : null);

  test(`${runtime}: berth ssh in tmux — prompt, resize, Ctrl-C, Ctrl-Z local suspend, exit restores the terminal; --print works with system ssh`, async (t) => {
    if (skip) {
      console.log(`# skipped: ${skip}`);
      return t.skip(skip);
    }
    const cluster = await new Cluster({ runtime, minReady: 1, maxReady: 1 }).start();
    const tmux = new Tmux(cluster.dir.path);
    try {
      await cluster.ensurePool("ci");
      await cluster.waitFor("a ready machine", async () => (await cluster.readyCount("ci")) >= 1, 60_000);
      const receipt = join(cluster.dir.path, "borrow.json");
      const b = berthSync(["borrow", "ci", "--receipt", receipt, "--config", cluster.clientConfig]);
      assert.equal(b.status, 0, `berth borrow: ${b.stderr}`);

      tmux.start(process.cwd());
      await tmux.waitFor(/LOCAL\$ ?$/m, "the local prompt");
      tmux.type(`${process.execPath} ${BIN} ssh --receipt ${receipt} --config ${cluster.clientConfig}`);

      // A prompt from the machine's login shell (not the local one), then a known one.
      await tmux.waitFor(/^(?!LOCAL).*[#$] ?$/m, "the remote prompt");
      tmux.type("export PS1='REMOTE> '; echo remote-$((40+2))");
      await tmux.waitFor(/^remote-42$/m, "remote output");
      await tmux.waitFor(/^REMOTE> ?$/m, "the remote prompt");

      // Resizes of the tmux window reach the remote terminal.
      for (const [w, h] of [[90, 25], [132, 40]] as const) {
        tmux.cmd("resize-window", "-t", "t", "-x", String(w), "-y", String(h));
        await remoteSize(tmux, h, w);
      }

      // Ctrl-C interrupts the running command; the shell survives and prompts again.
      let from = tmux.screen().length;
      tmux.type("echo started; sleep 1234");
      await tmux.waitFor(/^started$/m, "sleep started", from);
      await pause(300); // let the shell fork and exec sleep
      tmux.keys("C-c");
      tmux.type("echo rc=$?");
      await tmux.waitFor(/^rc=130$/m, "the interrupted sleep's status", from);
      await tmux.waitFor(/^REMOTE> ?$/m, "the prompt after Ctrl-C", from);

      // gvisor: the sandbox's own devpts through the relay (the process runtime's PTY is the host's own).
      if (runtime === "gvisor") await realTerminal(tmux);

      // Ctrl-Z suspends berth itself: the local shell is back, with a cooked terminal.
      from = tmux.screen().length;
      tmux.keys("C-z");
      await tmux.waitFor(/Stopped.*berth|Stopped/, "the local shell reporting berth stopped", from);
      await tmux.waitFor(/^LOCAL\$ ?$/m, "the local prompt while berth is suspended", from);
      tmux.type("stty -a | tr ' ;' '\\n\\n' | grep -x -e '-\\?icanon' -e '-\\?echo' | tr '\\n' ,; echo");
      await tmux.waitFor(/^icanon,echo,$/m, "a restored local terminal while suspended", from);
      // Resize while suspended; `fg` must resend the window size.
      tmux.cmd("resize-window", "-t", "t", "-x", "101", "-y", "31");
      from = tmux.screen().length;
      tmux.type("fg");
      await remoteSize(tmux, 31, 101);

      // exit: back to the local shell, terminal restored, berth's status is the remote one.
      from = tmux.screen().length;
      tmux.type("exit 7");
      await tmux.waitFor(/^LOCAL\$ ?$/m, "the local prompt after exit", from);
      tmux.type("echo berth-rc=$?; stty -a | tr ' ;' '\\n\\n' | grep -x -e '-\\?icanon' -e '-\\?echo' | tr '\\n' ,; echo");
      await tmux.waitFor(/^berth-rc=7$/m, "berth's exit status", from);
      await tmux.waitFor(/^icanon,echo,$/m, "icanon and echo restored", from);
      assert.match(tmux.lastLine(), /^LOCAL\$ ?$/);

      // -- CMD: one command with a PTY, its status becomes berth's.
      from = tmux.screen().length;
      tmux.type(`${process.execPath} ${BIN} ssh --receipt ${receipt} --config ${cluster.clientConfig} -- sh -c 'echo "tty=$(stty size)"; exit 4'; echo cmd-rc=$?`);
      await tmux.waitFor(/^tty=31 101\r?$/m, "the command's PTY size", from);
      await tmux.waitFor(/^cmd-rc=4$/m, "the command's status", from);

      // --print: the exact system ssh command line, which works as printed.
      const p = berthSync(["ssh", "--print", "--receipt", receipt, "--config", cluster.clientConfig]);
      assert.equal(p.status, 0, p.stderr);
      const line = p.stdout.trim();
      const known = `${receipt}.known_hosts`;
      const r = JSON.parse(readFileSync(receipt, "utf8")) as { machine: { id: string; ssh: { host: string; port: number; hostKey: string } } };
      assert.equal(
        line,
        `ssh -i ${join(cluster.dir.path, "keeper_ed25519")} -p ${r.machine.ssh.port} -o UserKnownHostsFile=${known} -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes ${r.machine.id}@${r.machine.ssh.host}`,
      );
      assert.equal(readFileSync(known, "utf8"), `[${r.machine.ssh.host}]:${r.machine.ssh.port} ${r.machine.ssh.hostKey.split(" ").slice(0, 2).join(" ")}\n`);
      const viaSsh = spawnSync("sh", ["-c", `${line} -o BatchMode=yes 'echo via-ssh-$((6*7)); exit 5'`], { encoding: "utf8", timeout: 30_000, stdio: ["ignore", "pipe", "pipe"] });
      assert.equal(viaSsh.stdout, "via-ssh-42\n", viaSsh.stderr);
      assert.equal(viaSsh.status, 5);
      // The pin is real: a known_hosts line with another key is refused by ssh.
      const other = spawnSync("sh", ["-c", `${line.replace(`UserKnownHostsFile=${known}`, "UserKnownHostsFile=/dev/null")} -o BatchMode=yes true`], { encoding: "utf8", timeout: 30_000 });
      assert.notEqual(other.status, 0, "without the pinned key, strict checking refuses the host");

      // An allocation this client holds no key for: refused with a clear message (allocations: test/e2e/alloc-ssh.test.ts).
      const alloc = berthSync(["ssh", "a_dev1", "--config", cluster.clientConfig, "--key-dir", join(cluster.dir.path, "no-keys")]);
      assert.equal(alloc.status, 1);
      assert.match(alloc.stderr, /not_found: no key for allocation a_dev1/);

      // SIGTERM to berth mid-session: terminal restored, status 143.
      const sshCmd = `${process.execPath} ${BIN} ssh --receipt ${receipt} --config ${cluster.clientConfig}`;
      const cooked = "stty -a | tr ' ;' '\\n\\n' | grep -x -e '-\\?icanon' -e '-\\?echo' | tr '\\n' ,; echo";
      from = tmux.screen().length;
      tmux.type(sshCmd);
      tmux.type("echo term-$((1+1))");
      await tmux.waitFor(/^term-2$/m, "a second session", from);
      const pid = spawnSync("pgrep", ["-f", `${BIN} ssh --receipt ${receipt}`], { encoding: "utf8" }).stdout.trim();
      assert.match(pid, /^\d+$/, "one berth ssh process");
      process.kill(Number(pid), "SIGTERM");
      await tmux.waitFor(/^LOCAL\$ ?$/m, "the local prompt after SIGTERM", from);
      tmux.type(`echo sigterm-rc=$?; ${cooked}`);
      await tmux.waitFor(/^sigterm-rc=143$/m, "status 143 after SIGTERM", from);
      await tmux.waitFor(/^icanon,echo,$/m, "the terminal restored after SIGTERM", from);

      // The machine side goes away (the borrow is returned, access cut): restored, status 255.
      from = tmux.screen().length;
      tmux.type(sshCmd);
      tmux.type("echo cut-$((2+1))");
      await tmux.waitFor(/^cut-3$/m, "a third session", from);
      const back = berthSync(["return", "--receipt", receipt, "--config", cluster.clientConfig]);
      assert.equal(back.status, 0, back.stderr);
      await tmux.waitFor(/ended without an exit status|closed without an exit status/, "berth reporting the cut", from);
      await tmux.waitFor(/^LOCAL\$ ?$/m, "the local prompt after the cut", from);
      tmux.type(`echo cut-rc=$?; ${cooked}`);
      await tmux.waitFor(/^cut-rc=255$/m, "status 255 after the cut", from);
      await tmux.waitFor(/^icanon,echo,$/m, "the terminal restored after the cut", from);
    } finally {
      tmux.kill();
      await cluster.close();
    }
  });
}
