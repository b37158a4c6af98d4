/**
 * berth-pty-relay (src/agent/runtime/pty-relay.c) on the host, under a real
 * PTY (node-pty), as the gvisor runtime runs it inside a sandbox: the command
 * gets a terminal of its own (another /dev/pts device, its controlling
 * terminal) with the outer size; a resize reaches it on SIGWINCH; INT to the
 * relay reaches the command's foreground group; all output written before the
 * command's end arrives; the relay exits with the command's status.
 * Skipped where the relay was not built (no C compiler at build time).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdtempSync, readlinkSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import pty from "node-pty";

const RELAY = fileURLToPath(new URL("../../berth-pty-relay", import.meta.url));
const skip = existsSync(RELAY) ? null : `the relay was not built (${RELAY} missing)`;

function run(argv: string[]): { p: pty.IPty; out: () => string; exited: Promise<{ exitCode: number; signal?: number }> } {
  const p = pty.spawn(RELAY, argv, { cols: 91, rows: 27, cwd: "/", env: { PATH: "/usr/bin:/bin", TERM: "xterm" } });
  let text = "";
  p.onData((d) => (text += d));
  const exited = new Promise<{ exitCode: number; signal?: number }>((r) => p.onExit(r));
  return { p, out: () => text, exited };
}

async function until(what: string, f: () => boolean, ms = 10_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!f()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

test("the relay gives the command its own terminal, passes size, INT and output on, and exits as the command did", async (t) => {
  if (skip) return t.skip(skip);
  const dir = mkdtempSync(join(tmpdir(), "berth-relay-"));
  const flag = join(dir, "go");
  try {
    const r = run(["/bin/sh", "-c", `echo "tty=$(tty)"; stty size; trap 'echo got-int' INT; trap 'echo size=$(stty size)' WINCH; echo armed; while [ ! -e "$1" ]; do sleep 0.05; done; head -c 300000 /dev/zero | tr '\\0' x; echo; echo end; exit 7`, "sh", flag]);
    await until("the command's tty line", () => /tty=\/dev\/pts\/\d+/.test(r.out()));
    const inner = /tty=(\/dev\/pts\/\d+)/.exec(r.out())![1]!;
    assert.notEqual(inner, readlinkSync(`/proc/${r.p.pid}/fd/0`), "the command's terminal is not the relay's own");
    await until("the outer size", () => /27 91/.test(r.out()));
    await until("armed", () => r.out().includes("armed"));
    r.p.resize(100, 40);
    await until("the new size inside", () => r.out().includes("size=40 100"));
    process.kill(r.p.pid, "SIGINT");
    await until("INT reaching the command", () => r.out().includes("got-int"));
    writeFileSync(flag, "");
    const st = await r.exited;
    assert.equal(st.exitCode, 7);
    const xs = (r.out().match(/x/g) ?? []).length;
    assert.ok(xs >= 300_000, `all output arrived (${xs} of 300000 x)`);
    assert.match(r.out(), /end\r?\n/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
