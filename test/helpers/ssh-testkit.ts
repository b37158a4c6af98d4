/**
 * Support for gateway tests and benches: a minimal in-memory key authority
 * (the real one is the agent daemon's keys.ts) and a small promise wrapper
 * around the ssh2 client. Not used by the agent itself.
 */
import ssh2 from "ssh2";
import type { ClientChannel, PseudoTtyOptions } from "ssh2";
import type { InstalledKey, KeyAuthority } from "../../src/agent/contracts.js";
import { fingerprintOf, parsePublicKey } from "../../src/core/ssh-public-key.js";

/** Keys per machine and a current generation per machine; `now < expiresAt` authorizes. */
export class MemoryKeys implements KeyAuthority {
  private readonly keys = new Map<string, InstalledKey>();
  private readonly generations = new Map<string, number>();
  private readonly listeners: ((machineId: string, fingerprint: string, grantId: string) => void)[] = [];

  generation(machineId: string): number {
    return this.generations.get(machineId) ?? 1;
  }

  install(k: Omit<InstalledKey, "generation" | "mode"> & Partial<Pick<InstalledKey, "generation" | "mode">>): InstalledKey {
    const key: InstalledKey = { mode: "grant", generation: this.generation(k.machineId), ...k };
    this.keys.set(`${key.machineId} ${key.fingerprint}`, key);
    return key;
  }

  /** Remove a key and tell listeners (what the daemon does on revoke-key). */
  remove(machineId: string, fingerprint: string): void {
    const k = this.keys.get(`${machineId} ${fingerprint}`);
    this.keys.delete(`${machineId} ${fingerprint}`);
    if (k) for (const l of this.listeners) l(machineId, fingerprint, k.grantId);
  }

  /** Move a machine to the next generation without removing its keys (they stop authorizing). */
  advance(machineId: string, notify = false): number {
    const g = this.generation(machineId) + 1;
    this.generations.set(machineId, g);
    if (notify) for (const k of this.keys.values()) if (k.machineId === machineId) for (const l of this.listeners) l(machineId, k.fingerprint, k.grantId);
    return g;
  }

  authorize(machineId: string, fingerprint: string, now: number): InstalledKey | null {
    const k = this.keys.get(`${machineId} ${fingerprint}`);
    if (!k || k.generation !== this.generation(machineId)) return null;
    if (k.expiresAt !== null && now >= k.expiresAt) return null;
    return k;
  }

  onRevoked(listener: (machineId: string, fingerprint: string, grantId: string) => void): void {
    this.listeners.push(listener);
  }
}

export interface ConnectOptions {
  port: number;
  username: string;
  privateKey: string;
  /** Pinned host key line; the connection fails if the server presents another. */
  hostKey?: string;
}

/** Connect and authenticate; rejects with the client's error (e.g. "All configured authentication methods failed"). */
export function connect(o: ConnectOptions): Promise<ssh2.Client> {
  const pinned = o.hostKey ? parsePublicKey(o.hostKey).fingerprint : null;
  return new Promise((resolve, reject) => {
    const c = new ssh2.Client();
    c.once("ready", () => resolve(c));
    c.once("error", reject);
    c.connect({
      host: "127.0.0.1",
      port: o.port,
      username: o.username,
      privateKey: o.privateKey,
      readyTimeout: 10_000,
      hostVerifier: (key: Buffer) => {
        if (!pinned) return true;
        return fingerprintOf(key) === pinned;
      },
    });
  });
}

export interface ExecResult {
  stdout: Buffer;
  stderr: Buffer;
  code: number | null;
  signal: string | null;
  /** Bytes of stdout received when the exit status arrived. */
  stdoutAtExit: number;
}

/** Run one command on a connection and collect everything. */
export function run(c: ssh2.Client, command: string, opts: { pty?: PseudoTtyOptions; env?: Record<string, string>; stdin?: string } = {}): Promise<ExecResult> {
  return new Promise((resolve, reject) => {
    c.exec(command, { ...(opts.pty ? { pty: opts.pty } : {}), ...(opts.env ? { env: opts.env } : {}) }, (err, ch) => {
      if (err) return reject(err);
      const out: Buffer[] = [];
      const errb: Buffer[] = [];
      let outLen = 0;
      let code: number | null = null;
      let signal: string | null = null;
      let atExit = -1;
      ch.on("data", (b: Buffer) => {
        out.push(b);
        outLen += b.length;
      });
      ch.stderr.on("data", (b: Buffer) => errb.push(b));
      ch.on("exit", (c2: number | null, sig?: string) => {
        atExit = outLen;
        if (typeof c2 === "number") code = c2;
        else signal = sig ?? null;
        if (c2 === null && sig) signal = sig;
      });
      ch.on("close", () => resolve({ stdout: Buffer.concat(out), stderr: Buffer.concat(errb), code, signal, stdoutAtExit: atExit }));
      if (opts.stdin !== undefined) ch.end(opts.stdin);
    });
  });
}

/** An interactive channel with a helper to wait for output matching a pattern. */
export class Term {
  readonly ch: ClientChannel;
  text = "";
  closed = false;
  exit: { code: number | null; signal: string | null } | null = null;
  private waiters: (() => void)[] = [];

  constructor(ch: ClientChannel) {
    this.ch = ch;
    ch.on("data", (b: Buffer) => {
      this.text += b.toString("utf8");
      this.notify();
    });
    ch.stderr.on("data", (b: Buffer) => {
      this.text += b.toString("utf8");
      this.notify();
    });
    ch.on("exit", (code: number | null, sig?: string) => {
      this.exit = { code: typeof code === "number" ? code : null, signal: sig ?? null };
    });
    ch.on("close", () => {
      this.closed = true;
      this.notify();
    });
  }

  static open(c: ssh2.Client, pty: PseudoTtyOptions | false, command?: string): Promise<Term> {
    return new Promise((resolve, reject) => {
      const cb = (err: Error | undefined, ch: ClientChannel) => (err ? reject(err) : resolve(new Term(ch)));
      if (command !== undefined) c.exec(command, pty ? { pty } : {}, cb);
      else c.shell(pty === false ? false : pty, cb);
    });
  }

  private notify(): void {
    const w = this.waiters;
    this.waiters = [];
    for (const f of w) f();
  }

  /** Wait until the text after `from` matches `re` (or the channel closes: then reject). */
  async waitFor(re: RegExp, from = 0, timeoutMs = 20_000): Promise<RegExpMatchArray> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const m = this.text.slice(from).match(re);
      if (m) return m;
      if (this.closed) throw new Error(`channel closed before ${re}; output: ${JSON.stringify(this.text.slice(-400))}`);
      if (Date.now() > deadline) throw new Error(`no ${re} within ${timeoutMs}ms; output: ${JSON.stringify(this.text.slice(-400))}`);
      await new Promise<void>((r) => {
        const t = setTimeout(r, 200);
        this.waiters.push(() => (clearTimeout(t), r()));
      });
    }
  }

  /** Wait for the channel to close. */
  async closedP(timeoutMs = 20_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!this.closed) {
      if (Date.now() > deadline) throw new Error("channel did not close");
      await new Promise<void>((r) => {
        const t = setTimeout(r, 200);
        this.waiters.push(() => (clearTimeout(t), r()));
      });
    }
  }

  write(s: string): void {
    this.ch.write(s);
  }
}
