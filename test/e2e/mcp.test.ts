/**
 * `berth mcp` driven by the MCP SDK's own client, over stdio and over
 * Streamable HTTP, against a real `berth up` (coordinator + agent, process
 * runtime): the tools, stdin, files, a command past its timeout, 100 MB of
 * output (truncated, retrievable, bounded memory), bad input, and every
 * borrowed machine returned when the client goes away.
 */
import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { BIN } from "../helpers/cluster.js";
import { call, httpClient, httpMcp, peakRssKiB, stdioMcp, UpRig } from "../helpers/mcp.js";

const HUNDRED_MB = 100 * 1024 * 1024;
/** `yes` prints this 16-byte line over and over: byte k of the output is LINE[k % 16]. */
const LINE = "0123456789abcde\n";
/**
 * What the server may grow by (peak RSS) while a command prints 100 MB: inline heads, the SSH window, a few chunks,
 * and chunk buffers the garbage collector has not taken back yet. Measured 36–51 MiB, the same with 200 MB of output
 * (it does not grow with the output); a server that held the output would grow past 100 MiB.
 */
const RSS_GROWTH_BOUND_KIB = 64 * 1024;

describe("berth mcp over stdio", { timeout: 300_000 }, () => {
  const rig = new UpRig();
  before(() => rig.start());
  after(() => rig.close());

  test("tools are listed with schemas; list_pools shows the default pool", async () => {
    const m = await stdioMcp(rig);
    try {
      const tools = (await m.client.listTools()).tools;
      assert.deepEqual(tools.map((t) => t.name).sort(), ["borrow_machine", "list_files", "list_pools", "read_file", "read_output", "return_machine", "run_command", "write_file"]);
      const run = tools.find((t) => t.name === "run_command")!;
      assert.deepEqual((run.inputSchema.required as string[]).sort(), ["command", "handle"]);
      assert.match(run.description ?? "", /argv array run exactly/);
      const pools = await call(m.client, "list_pools", {});
      assert.equal(pools.isError, false, pools.text);
      const p = (pools.json.pools as Record<string, unknown>[]).find((x) => x.name === "default")!;
      assert.equal(p.access, "keeper");
      assert.equal(p.default, true);
      assert.equal(p.min_ready, 2);
    } finally {
      await m.client.close();
    }
  });

  test("borrow, run with stdin (argv exact, shell only when asked), cwd and env, write and read files (text and binary), list, return", async () => {
    const m = await stdioMcp(rig);
    try {
      const b = await call(m.client, "borrow_machine", {});
      assert.equal(b.isError, false, b.text);
      const h = b.json.handle as string;
      assert.match(h, /^b_/);
      assert.ok(Date.parse(b.json.hard_deadline as string) > Date.now());

      const cat = await call(m.client, "run_command", { handle: h, command: ["cat"], stdin: "through stdin\n" });
      assert.equal(cat.json.stdout, "through stdin\n", cat.text);
      assert.equal(cat.json.exit_status, 0);
      // argv is exact: no word splitting, no expansion.
      const exact = await call(m.client, "run_command", { handle: h, command: ["printf", "%s|", "a b", "$HOME", "*"] });
      assert.equal(exact.json.stdout, "a b|$HOME|*|", exact.text);
      const sh = await call(m.client, "run_command", { handle: h, command: "echo \"$GREETING\" | tr a-z A-Z; exit 3", shell: true, env: { GREETING: "hi there" } });
      assert.equal(sh.json.stdout, "HI THERE\n", sh.text);
      assert.equal(sh.json.exit_status, 3);
      const bin = await call(m.client, "run_command", { handle: h, command: ["wc", "-c"], stdin_base64: Buffer.alloc(300, 0xff).toString("base64") });
      assert.equal((bin.json.stdout as string).trim(), "300");

      const w = await call(m.client, "write_file", { handle: h, path: "src/notes.txt", content: "héllo\n" });
      assert.equal(w.isError, false, w.text);
      assert.equal(w.json.size, 7);
      const pwd = await call(m.client, "run_command", { handle: h, command: ["cat", "notes.txt"], cwd: "src" });
      assert.equal(pwd.json.stdout, "héllo\n", pwd.text);
      const r = await call(m.client, "read_file", { handle: h, path: "src/notes.txt" });
      assert.equal(r.json.encoding, "utf8");
      assert.equal(r.json.content, "héllo\n");
      const all = Buffer.from(Array.from({ length: 256 }, (_, i) => i));
      await call(m.client, "write_file", { handle: h, path: "bytes.bin", content: all.toString("base64"), encoding: "base64" });
      const rb = await call(m.client, "read_file", { handle: h, path: "bytes.bin" });
      assert.equal(rb.json.encoding, "base64");
      assert.deepEqual(Buffer.from(rb.json.content as string, "base64"), all);
      const part = await call(m.client, "read_file", { handle: h, path: "bytes.bin", offset: 250, length: 100 });
      assert.deepEqual(Buffer.from(part.json.content as string, "base64"), all.subarray(250));
      await call(m.client, "write_file", { handle: h, path: "src/notes.txt", content: "more\n", append: true });
      assert.equal((await call(m.client, "read_file", { handle: h, path: "src/notes.txt" })).json.content, "héllo\nmore\n");
      const ls = await call(m.client, "list_files", { handle: h, depth: 2 });
      const entries = ls.json.entries as { path: string; type: string; size: number }[];
      assert.deepEqual(
        entries.filter((e) => e.path !== ".bash_history").map((e) => [e.path, e.type]),
        [["bytes.bin", "file"], ["src", "directory"], ["src/notes.txt", "file"]],
      );
      assert.equal(entries.find((e) => e.path === "bytes.bin")!.size, 256);

      const ret = await call(m.client, "return_machine", { handle: h });
      assert.equal(ret.isError, false, ret.text);
      assert.equal(ret.json.repeated, false);
      const again = await call(m.client, "return_machine", { handle: h });
      assert.equal(again.isError, false);
      assert.equal(again.json.repeated, true);
      const used = await call(m.client, "run_command", { handle: h, command: ["true"] });
      assert.equal(used.isError, true);
      assert.match(used.text, /^machine_returned: /);
      assert.match(used.text, /\nhint: /);
    } finally {
      await m.client.close();
    }
    await rig.settled();
  });

  test("a command past its timeout is ended (even one that ignores TERM and HUP) and the call says so, with the output so far", async () => {
    const m = await stdioMcp(rig);
    try {
      const h = (await call(m.client, "borrow_machine", {})).json.handle as string;
      const t = await call(m.client, "run_command", { handle: h, command: ["sh", "-c", "trap '' TERM HUP INT; echo $$ > pid; echo started; while :; do sleep 1; done"], timeout_seconds: 1 });
      assert.equal(t.isError, true);
      assert.match(t.text, /^command_timeout: the command ran past its timeout of 1 s and was ended/);
      assert.equal(t.json.timed_out, true);
      assert.equal(t.json.stdout, "started\n");
      // The command's process is gone (the session was closed and the gateway ended its group).
      await rig.waitFor("the timed-out command's process to be gone", async () => {
        const r = await call(m.client, "run_command", { handle: h, command: "kill -0 \"$(cat pid)\" 2>/dev/null && echo alive || echo gone", shell: true });
        return r.json.stdout === "gone\n" ? true : null;
      }, 20_000);
    } finally {
      await m.client.close();
    }
    await rig.settled();
  });

  test("100 MB of output: the result shows the first 16 KiB and says so; every byte is retrievable by offset from a 0600 spill file; the server's memory stays bounded; the spill goes at session end", async (t) => {
    const spill = mkdtempSync(join(tmpdir(), "berth-mcp-spill-"));
    const m = await stdioMcp(rig, ["--spill-dir", spill]);
    try {
      const b = await call(m.client, "borrow_machine", {});
      assert.equal(b.isError, false, b.text);
      const h = b.json.handle as string;
      await call(m.client, "run_command", { handle: h, command: ["true"] });
      const before = peakRssKiB(m.pid);
      const r = await call(m.client, "run_command", { handle: h, command: `yes 0123456789abcde | head -c ${HUNDRED_MB}; echo done >&2`, shell: true, timeout_seconds: 300 });
      const grew = peakRssKiB(m.pid) - before;
      t.diagnostic(`berth mcp peak RSS ${before} KiB before, grew ${grew} KiB while 100 MB went through (bound ${RSS_GROWTH_BOUND_KIB} KiB)`);
      assert.equal(r.isError, false, r.text.slice(0, 500));
      assert.equal(r.json.stdout_bytes, HUNDRED_MB);
      assert.equal((r.json.stdout as string).length, 16 * 1024);
      assert.equal(r.json.stdout as string, LINE.repeat(1024));
      assert.match(r.json.stdout_truncated as string, /^shows the first 16384 of 104857600 bytes; read the rest with read_output\(output_id="out_\d+", stream="stdout", offset=16384\)$/);
      assert.equal(r.json.stderr, "done\n");
      assert.ok(grew < RSS_GROWTH_BOUND_KIB, `peak RSS grew by ${grew} KiB while 100 MB went through`);
      const id = r.json.output_id as string;
      // The spill: one private directory, one 0600 file holding every byte.
      const [dir] = readdirSync(spill);
      assert.equal(statSync(join(spill, dir!)).mode & 0o777, 0o700);
      const file = join(spill, dir!, `${id}.stdout`);
      assert.equal(statSync(file).size, HUNDRED_MB);
      assert.equal(statSync(file).mode & 0o777, 0o600);
      for (const offset of [16384, 50 * 1024 * 1024 + 5, HUNDRED_MB - 20]) {
        const o = await call(m.client, "read_output", { output_id: id, stream: "stdout", offset, length: 40 });
        const want = Array.from({ length: Math.min(40, HUNDRED_MB - offset) }, (_, i) => LINE[(offset + i) % 16]).join("");
        assert.equal(o.json.data, want, `offset ${offset}`);
        assert.equal(o.json.next_offset, offset + want.length < HUNDRED_MB ? offset + want.length : null);
      }
      const bad = await call(m.client, "read_output", { output_id: "out_999", stream: "stdout" });
      assert.match(bad.text, /^unknown_output: /);
      await call(m.client, "return_machine", { handle: h });
    } finally {
      await m.client.close();
    }
    await m.exited;
    assert.deepEqual(readdirSync(spill), [], "the session's spill directory is deleted when it ends");
    await rig.settled();
  });

  test("bad input: unknown handle, another session's handle, paths leaving the workspace, a string command without shell, arguments off the schema", async () => {
    const a = await stdioMcp(rig);
    const b = await stdioMcp(rig);
    try {
      const h = (await call(a.client, "borrow_machine", {})).json.handle as string;
      const unknown = await call(a.client, "run_command", { handle: "b_doesnotexist", command: ["true"] });
      assert.match(unknown.text, /^unknown_handle: "b_doesnotexist" is not a machine this session borrowed\nhint: /);
      // A real, live borrow of another session is not this session's.
      for (const [tool, args] of [
        ["run_command", { command: ["true"] }],
        ["read_file", { path: "x" }],
        ["write_file", { path: "x", content: "x" }],
        ["list_files", {}],
        ["return_machine", {}],
      ] as const) {
        const other = await call(b.client, tool, { handle: h, ...args });
        assert.equal(other.isError, true, tool);
        assert.match(other.text, /^unknown_handle: /, tool);
      }
      assert.equal((await rig.pool()).lent, 1, "the other session's attempts did not return or touch the machine");
      for (const path of ["../escape", "/etc/passwd", "a/../../escape"]) {
        const r = await call(a.client, "read_file", { handle: h, path });
        assert.match(r.text, /^path_outside_workspace: /, path);
      }
      await call(a.client, "run_command", { handle: h, command: ["ln", "-s", "/etc", "etc-link"] });
      const viaLink = await call(a.client, "read_file", { handle: h, path: "etc-link/hostname" });
      assert.match(viaLink.text, /^path_outside_workspace: .*through a symbolic link/);
      const writeLink = await call(a.client, "write_file", { handle: h, path: "etc-link/berth-was-here", content: "x" });
      assert.match(writeLink.text, /^path_outside_workspace: /);
      assert.equal(existsSync("/etc/berth-was-here"), false);
      const cwdOut = await call(a.client, "run_command", { handle: h, command: ["pwd"], cwd: "/" });
      assert.match(cwdOut.text, /^path_outside_workspace: /);
      const str = await call(a.client, "run_command", { handle: h, command: "ls -la" });
      assert.match(str.text, /^invalid_request: command is an array of arguments \(argv\)/);
      const schema = await call(a.client, "run_command", { handle: h, command: ["true"], timeout_seconds: -1 });
      assert.equal(schema.isError, true);
      assert.match(schema.text, /^invalid_request: .*timeout_seconds/s);
      const env = await call(a.client, "run_command", { handle: h, command: ["true"], env: { "A B": "x" } });
      assert.match(env.text, /^invalid_request: env name "A B"/);
      const big = await call(a.client, "read_file", { handle: h, path: "missing.txt" });
      assert.match(big.text, /^file_not_found: /);
    } finally {
      await a.client.close();
      await b.client.close();
    }
    await rig.settled();
  });

  test("killing the MCP client (SIGKILL) returns every machine its session borrowed: the pool is back to its ready count", async () => {
    const sdk = (p: string) => JSON.stringify(import.meta.resolve(`@modelcontextprotocol/sdk/${p}`));
    const script = `
      import { Client } from ${sdk("client/index.js")};
      import { StdioClientTransport } from ${sdk("client/stdio.js")};
      const t = new StdioClientTransport({ command: process.execPath, args: [${JSON.stringify(BIN)}, "mcp", "--config", ${JSON.stringify(rig.config)}], stderr: "ignore" });
      const c = new Client({ name: "doomed", version: "1" });
      await c.connect(t);
      const handles = [], machines = [];
      for (let i = 0; i < 2; i++) {
        const b = JSON.parse((await c.callTool({ name: "borrow_machine", arguments: {} })).content[0].text);
        handles.push(b.handle);
        machines.push(b.machine);
      }
      console.log(JSON.stringify({ handles, machines, pid: t.pid }));
      setInterval(() => {}, 1000);`;
    const doomed = spawn(process.execPath, ["--input-type=module", "-e", script], { stdio: ["ignore", "pipe", "inherit"], env: { ...process.env, BERTH_PG_URL: "" } });
    const line = await new Promise<string>((resolve, reject) => {
      let out = "";
      doomed.stdout!.on("data", (d: Buffer) => {
        out += d.toString();
        if (out.includes("\n")) resolve(out.split("\n")[0]!);
      });
      doomed.once("exit", (code) => reject(new Error(`the client exited ${code} before borrowing`)));
    });
    const { handles, machines, pid } = JSON.parse(line) as { handles: string[]; machines: string[]; pid: number };
    assert.equal(handles.length, 2);
    assert.equal((await rig.pool()).lent, 2);
    doomed.kill("SIGKILL");
    // berth mcp sees its stdin close, returns both machines, and exits.
    await rig.waitFor("berth mcp to exit", async () => {
      try {
        process.kill(pid, 0);
        return null;
      } catch {
        return true;
      }
    }, 30_000);
    // Returned, not abandoned: the very machines are ready again (an abandoned borrow's machine is quarantined and replaced).
    const p = await rig.settled(machines);
    assert.equal(p.lent, 0);
  });

  test("SIGTERM to berth mcp returns its machines, then it exits 143", async () => {
    const m = await stdioMcp(rig);
    const machines = [(await call(m.client, "borrow_machine", {})).json.machine as string, (await call(m.client, "borrow_machine", {})).json.machine as string];
    assert.equal((await rig.pool()).lent, 2);
    process.kill(m.pid, "SIGTERM");
    await rig.waitFor("berth mcp to exit", async () => {
      try {
        process.kill(m.pid, 0);
        return null;
      } catch {
        return true;
      }
    }, 30_000);
    assert.match(m.stderr(), /session ended \(SIGTERM\): returning 2 machines/);
    await rig.settled(machines);
  });
});

describe("berth mcp over Streamable HTTP", { timeout: 300_000 }, () => {
  const rig = new UpRig();
  before(() => rig.start());
  after(() => rig.close());

  test("a bearer berth token is required and bound to its session; tools work as over stdio (stdin, files, timeout, 100 MB); another organisation's session cannot use a handle", async () => {
    const server = await httpMcp(rig);
    try {
      const token = rig.berthToken("local");
      const noAuth = await fetch(server.url, { method: "POST", headers: { "content-type": "application/json", accept: "application/json, text/event-stream" }, body: "{}" });
      assert.equal(noAuth.status, 401);
      await assert.rejects(httpClient(server.url, "berth_not_a_real_token"), /401|unauthorized/i);

      const { client, transport } = await httpClient(server.url, token);
      assert.equal((await client.listTools()).tools.length, 8);
      const h = (await call(client, "borrow_machine", {})).json.handle as string;
      assert.match(h, /^b_/);
      const cat = await call(client, "run_command", { handle: h, command: ["cat"], stdin: "over http\n" });
      assert.equal(cat.json.stdout, "over http\n", cat.text);
      await call(client, "write_file", { handle: h, path: "f.txt", content: "file over http" });
      assert.equal((await call(client, "read_file", { handle: h, path: "f.txt" })).json.content, "file over http");
      const t = await call(client, "run_command", { handle: h, command: ["sleep", "600"], timeout_seconds: 1 });
      assert.match(t.text, /^command_timeout: /);
      const big = await call(client, "run_command", { handle: h, command: `yes 0123456789abcde | head -c ${HUNDRED_MB}`, shell: true, timeout_seconds: 300 });
      assert.equal(big.json.stdout_bytes, HUNDRED_MB, big.text.slice(0, 300));
      const tail = await call(client, "read_output", { output_id: big.json.output_id as string, stream: "stdout", offset: HUNDRED_MB - 16 });
      assert.equal(tail.json.data, LINE);

      // The session id with another token: refused as if unknown.
      const other = await fetch(server.url, {
        method: "POST",
        headers: { "content-type": "application/json", accept: "application/json, text/event-stream", authorization: `Bearer ${rig.berthToken("local")}`, "mcp-session-id": transport.sessionId! },
        body: JSON.stringify({ jsonrpc: "2.0", id: 9, method: "tools/list" }),
      });
      assert.equal(other.status, 404);

      // Another organisation: its own session, which does not see this pool nor this handle.
      const foreign = await httpClient(server.url, rig.berthToken("elsewhere"));
      const fp = await call(foreign.client, "list_pools", {});
      assert.deepEqual(fp.json.pools, []);
      const fr = await call(foreign.client, "run_command", { handle: h, command: ["true"] });
      assert.match(fr.text, /^unknown_handle: /);
      const fb = await call(foreign.client, "borrow_machine", { pool: "default" });
      assert.match(fb.text, /^not_found: /);
      await foreign.transport.terminateSession();
      await foreign.client.close();

      assert.equal((await call(client, "return_machine", { handle: h })).isError, false);
      await transport.terminateSession();
      await client.close();
    } finally {
      await server.close();
    }
    await rig.settled();
  });

  test("a client that dies (SIGKILL) has its machines returned once its event stream closes; SIGTERM to the server returns the rest", async () => {
    const server = await httpMcp(rig, ["--idle-timeout", "600"]);
    try {
      const token = rig.berthToken("local");
      const sdk = (p: string) => JSON.stringify(import.meta.resolve(`@modelcontextprotocol/sdk/${p}`));
      const script = `
        import { Client } from ${sdk("client/index.js")};
        import { StreamableHTTPClientTransport } from ${sdk("client/streamableHttp.js")};
        const t = new StreamableHTTPClientTransport(new URL(${JSON.stringify(server.url)}), { requestInit: { headers: { authorization: "Bearer " + process.env.T } } });
        const c = new Client({ name: "doomed", version: "1" });
        await c.connect(t);
        const machines = [];
        for (let i = 0; i < 2; i++) machines.push(JSON.parse((await c.callTool({ name: "borrow_machine", arguments: {} })).content[0].text).machine);
        console.log(JSON.stringify(machines));
        setInterval(() => {}, 1000);`;
      const doomed = spawn(process.execPath, ["--input-type=module", "-e", script], { stdio: ["ignore", "pipe", "inherit"], env: { ...process.env, T: token } });
      const machines = await new Promise<string[]>((resolve, reject) => {
        let out = "";
        doomed.stdout!.on("data", (d: Buffer) => {
          out += d.toString();
          if (out.includes("\n")) resolve(JSON.parse(out.split("\n")[0]!) as string[]);
        });
        doomed.once("exit", (code) => reject(new Error(`the client exited ${code} before borrowing`)));
      });
      assert.equal((await rig.pool()).lent, 2);
      doomed.kill("SIGKILL");
      await rig.settled(machines);
      assert.match(server.output(), /ended \(the client disconnected\): returning 2 machines/);

      // A live session when the server is stopped: returned too.
      const { client } = await httpClient(server.url, token);
      const last = (await call(client, "borrow_machine", {})).json.machine as string;
      assert.equal((await rig.pool()).lent, 1);
      await server.close();
      assert.equal(server.child.exitCode, 143, server.output());
      await rig.settled([last]);
      await client.close().catch(() => undefined);
    } finally {
      await server.close();
    }
  });
});
