/**
 * A private tmux server with one window running a plain local shell (dash,
 * prompt "LOCAL$ "), driven with send-keys: what a person at a terminal does.
 */
import { existsSync } from "node:fs";
import { join } from "node:path";
import { spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";

export const TMUX = "/usr/bin/tmux";
export const noTmux = existsSync(TMUX) ? null : `tmux is not installed (${TMUX} missing)`;

export class Tmux {
  readonly socket: string;
  constructor(dir: string) {
    this.socket = join(dir, `tmux-${randomBytes(4).toString("hex")}`);
  }
  cmd(...args: string[]): string {
    const r = spawnSync(TMUX, ["-S", this.socket, ...args], { encoding: "utf8", timeout: 10_000 });
    if (r.status !== 0) throw new Error(`tmux ${args.join(" ")} failed: ${r.stderr}`);
    return r.stdout;
  }
  /** `env` is the shell's whole environment (besides PATH, HOME, TERM, PS1). */
  start(cwd: string, env: Record<string, string> = {}): void {
    const extra = Object.entries(env).map(([k, v]) => `${k}='${v}'`);
    this.cmd("-f", "/dev/null", "new-session", "-d", "-s", "t", "-x", "160", "-y", "40", "-c", cwd, ["env", "-i", `PATH=${process.env.PATH ?? "/usr/bin:/bin"}`, "HOME=/tmp", "TERM=tmux-256color", "PS1='LOCAL$ '", ...extra, "/bin/sh", "-i"].join(" "));
    this.cmd("set-option", "-g", "status", "off");
  }
  type(text: string): void {
    this.cmd("send-keys", "-t", "t", "-l", text);
    this.cmd("send-keys", "-t", "t", "Enter");
  }
  keys(...k: string[]): void {
    this.cmd("send-keys", "-t", "t", ...k);
  }
  /** The whole pane history, wrapped lines joined, trailing blanks removed. */
  screen(): string {
    return this.cmd("capture-pane", "-p", "-J", "-S", "-", "-t", "t")
      .split("\n")
      .map((l) => l.replace(/\s+$/, ""))
      .join("\n")
      .trimEnd();
  }
  async waitFor(re: RegExp, what: string, from = 0, ms = 60_000): Promise<RegExpMatchArray> {
    const deadline = Date.now() + ms;
    for (;;) {
      const s = this.screen().slice(from);
      const m = s.match(re);
      if (m) return m;
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what} (${re}); screen:\n${this.screen().slice(-2500)}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  kill(): void {
    spawnSync(TMUX, ["-S", this.socket, "kill-server"], { timeout: 10_000 });
  }
}
