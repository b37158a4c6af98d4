/**
 * `berth cp` in a real terminal (tmux, driven with send-keys), against a real
 * `berth serve` + `berth agent` (process runtime) and a keeper borrow: on a
 * TTY the progress line appears, is rewritten in place as bytes move (one
 * line on the screen, its percentage rising), and ends with a newline (the
 * next prompt starts its own line); Ctrl-C mid-copy prints the interruption
 * on its own line, removes the partial file on both sides and exits 130.
 * Piped (not a TTY), no progress is written at all.
 */
import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdirSync, readdirSync, truncateSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { BIN, Cluster, berth } from "../helpers/cluster.js";
import { Tmux, noTmux } from "../helpers/tmux.js";

describe("berth cp on a terminal", { skip: noTmux ?? false, timeout: 240_000 }, () => {
  const c = new Cluster({ runtime: "process", minReady: 1, maxReady: 1, slots: 2 });
  let tmux: Tmux | null = null;
  before(async () => {
    await c.start();
    await c.ensurePool("ci");
    await c.waitFor("a ready machine", async () => (await c.readyCount("ci")) >= 1, 60_000);
  });
  after(async () => {
    tmux?.kill();
    await c.close();
  });

  test("progress appears, updates in place and ends with a newline; Ctrl-C removes the partial files and exits 130", async () => {
    const dir = join(c.dir.path, "tty");
    mkdirSync(dir);
    const receipt = join(dir, "b.json");
    const cfg = ["--config", c.clientConfig];
    let r = await berth(["borrow", "ci", "--receipt", receipt, ...cfg]);
    assert.equal(r.status, 0, r.stderr);
    // The pool's heartbeat period is 60 s and a loaded host may take longer: heartbeat as a borrower would.
    const beat = setInterval(() => void berth(["heartbeat", "--receipt", receipt, ...cfg]), 15_000).unref();
    r = await berth(["ssh", "--receipt", receipt, ...cfg, "--", "pwd", "-P"]);
    assert.equal(r.status, 0, r.stderr);
    const ws = r.stdout.trim();
    assert.ok(existsSync(ws), `workspace ${ws} on this host`);
    const partials = (d: string) => readdirSync(d).filter((n) => n.includes("partial"));

    // Not a terminal (stderr piped): no progress at all.
    writeFileSync(join(dir, "small.bin"), Buffer.alloc(2 * 1024 * 1024, 7));
    r = await berth(["cp", "--receipt", receipt, ...cfg, "small.bin", ":"], { cwd: dir });
    assert.equal(r.status, 0, r.stderr);
    assert.doesNotMatch(r.stderr, /%/);

    tmux = new Tmux(dir);
    tmux.start(dir);
    await tmux.waitFor(/LOCAL\$$/, "the local prompt");
    const cp = `${process.execPath} ${BIN} cp --receipt ${receipt} --config ${c.clientConfig}`;

    // Up: 512 MiB (sparse here; every byte still crosses), long enough to watch the line move.
    writeFileSync(join(dir, "big.bin"), "");
    truncateSync(join(dir, "big.bin"), 512 * 1024 * 1024);
    tmux.type(`${cp} big.bin : ; echo "status=$?"`);
    const seen = new Set<number>();
    for (;;) {
      const screen = tmux.screen();
      const lines = screen.split("\n").filter((l) => /^big\.bin {2}\d+% {2}[\d.]+ MB {2}[\d.]+ MB\/s$/.test(l));
      assert.ok(lines.length <= 1, `the progress is one line rewritten in place, not a line per update:\n${screen}`);
      if (lines[0]) seen.add(Number(/ (\d+)%/.exec(lines[0])![1]));
      if (/status=\d+/.test(screen)) break;
      await new Promise((res) => setTimeout(res, 30));
    }
    const screen = tmux.screen();
    assert.match(screen, /status=0/, screen);
    // The finished line reads 100% and the shell's next output starts on a line of its own.
    assert.match(screen, /\nbig\.bin {2}100% {2}536\.9 MB {2}[\d.]+ MB\/s\nstatus=0\n/, screen);
    assert.ok([...seen].some((p) => p < 100), `the line was seen before the end (percentages seen: ${[...seen].join(", ")})`);
    assert.ok(seen.size >= 2, `the line was updated (percentages seen: ${[...seen].join(", ")})`);
    assert.deepEqual(partials(ws), []);

    // Down: 1 GiB made on the machine; Ctrl-C once the line shows the copy under way.
    r = await berth(["ssh", "--receipt", receipt, ...cfg, "--", "truncate", "-s", "1G", "zeros.bin"]);
    assert.equal(r.status, 0, r.stderr);
    tmux.type("clear");
    await tmux.waitFor(/LOCAL\$$/, "the prompt after clear");
    const from = tmux.screen().length;
    tmux.type(`${cp} :zeros.bin zeros.bin ; echo "status=$?"`);
    await tmux.waitFor(/zeros\.bin {2}\d+% {2}[\d.]+ MB/, "the download's progress line", from - 1);
    tmux.keys("C-c");
    const m = await tmux.waitFor(/status=(\d+)/, "the copy's exit status", from - 1);
    const after = tmux.screen().slice(from - 1);
    assert.equal(m[1], "130", after);
    // The interruption is reported on a line of its own (the open progress line was ended first).
    assert.match(after, /\nberth: interrupted by SIGINT; the copy was stopped and its partial files removed\nstatus=130/, after);
    assert.deepEqual(partials(dir), [], "no partial file left here");
    assert.equal(existsSync(join(dir, "zeros.bin")), false, "nothing under the local name");
    assert.deepEqual(partials(ws), [], "nor on the machine");

    clearInterval(beat);
    r = await berth(["return", "--receipt", receipt, ...cfg]);
    assert.equal(r.status, 0, r.stderr);
  });
});
