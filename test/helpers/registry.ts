/**
 * A real registry for image tests: Debian's `docker-registry` (distribution
 * 2.8) on loopback with a temporary config, storage and port; optionally
 * behind basic authentication (an htpasswd file, bcrypt by the system's
 * crypt) or token authentication (a token service run here, issuing JWTs
 * signed with a throwaway certificate the registry trusts). Images are
 * pushed with skopeo from OCI layouts the tests write. Plus a loopback proxy
 * in front of it that can damage blob bodies (a fault injector).
 */
import { spawn, spawnSync, execFile, execFileSync, type ChildProcess } from "node:child_process";
import { createServer, request, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { createServer as netServer, type AddressInfo } from "node:net";
import { createSign, randomBytes, X509Certificate } from "node:crypto";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

export function registryAvailable(): string | null {
  if (spawnSync("docker-registry", ["--version"]).status !== 0) return "docker-registry is not installed (Debian package docker-registry)";
  if (spawnSync("skopeo", ["--version"]).status !== 0) return "skopeo is not installed";
  return null;
}

async function freePort(): Promise<number> {
  const s = netServer();
  await new Promise<void>((r) => s.listen(0, "127.0.0.1", r));
  const port = (s.address() as AddressInfo).port;
  await new Promise((r) => s.close(r));
  return port;
}

export interface TestRegistry {
  /** HOST:PORT, as image references name it. */
  host: string;
  user: string;
  password: string;
  /** Pushes an OCI layout's tag to REPO:TAG with skopeo (asynchronously: the token service runs in this process). */
  push(layoutDir: string, tag: string, repoTag: string): Promise<void>;
  /** PUTs a document (a manifest or index) under REPO:REF, with push credentials. */
  putManifest(repo: string, ref: string, body: Buffer, mediaType: string): Promise<number>;
  /** Token requests the token service answered (auth "token"). */
  tokenRequests: number;
  close(): Promise<void>;
}

function b64url(b: Buffer | string): string {
  return Buffer.from(b).toString("base64url");
}

export async function startRegistry(dir: string, auth: "none" | "basic" | "token" = "none"): Promise<TestRegistry> {
  mkdirSync(dir, { recursive: true });
  const user = "berth-test";
  const password = randomBytes(12).toString("hex");
  const port = await freePort();
  let tokenServer: Server | null = null;
  const state = { tokenRequests: 0 };
  let authYaml = "";
  if (auth === "basic") {
    const hash = execFileSync("/usr/bin/python3", ["-W", "ignore", "-c", "import crypt,sys; print(crypt.crypt(sys.argv[1], crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16)))", password], { encoding: "utf8" }).trim();
    writeFileSync(join(dir, "htpasswd"), `${user}:${hash}\n`);
    authYaml = `auth:\n  htpasswd:\n    realm: berth-test\n    path: ${join(dir, "htpasswd")}\n`;
  } else if (auth === "token") {
    execFileSync("openssl", ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", join(dir, "key.pem"), "-out", join(dir, "cert.pem"), "-days", "2", "-subj", "/CN=berth-test-token"], { stdio: "ignore" });
    const key = readFileSync(join(dir, "key.pem"), "utf8");
    const certDer = new X509Certificate(readFileSync(join(dir, "cert.pem"))).raw;
    tokenServer = createServer((req: IncomingMessage, res: ServerResponse) => {
      state.tokenRequests++;
      const url = new URL(req.url ?? "/", "http://x");
      const basic = /^Basic (.+)$/.exec(req.headers.authorization ?? "")?.[1];
      const [u, p] = basic ? Buffer.from(basic, "base64").toString().split(":") : [];
      if (u !== user || p !== password) {
        res.writeHead(401, { "content-type": "application/json" }).end(JSON.stringify({ details: "wrong or missing credentials" }));
        return;
      }
      const access = url.searchParams.getAll("scope").map((s) => {
        const [type, name, actions] = s.split(":");
        return { type, name, actions: (actions ?? "").split(",").filter(Boolean) };
      });
      const now = Math.floor(Date.now() / 1000);
      const header = { typ: "JWT", alg: "RS256", x5c: [certDer.toString("base64")] };
      const claims = { iss: "berth-test-issuer", sub: user, aud: url.searchParams.get("service"), exp: now + 300, nbf: now - 10, iat: now, jti: randomBytes(8).toString("hex"), access };
      const signing = `${b64url(JSON.stringify(header))}.${b64url(JSON.stringify(claims))}`;
      const sig = createSign("RSA-SHA256").update(signing).sign(key);
      res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ token: `${signing}.${b64url(sig)}`, expires_in: 300 }));
    });
    await new Promise<void>((r) => tokenServer!.listen(0, "127.0.0.1", r));
    const tport = (tokenServer.address() as AddressInfo).port;
    authYaml = `auth:\n  token:\n    realm: http://127.0.0.1:${tport}/token\n    service: berth-test-registry\n    issuer: berth-test-issuer\n    rootcertbundle: ${join(dir, "cert.pem")}\n`;
  }
  const config = join(dir, "config.yml");
  writeFileSync(
    config,
    `version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: ${join(dir, "data")}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:${port}\n${authYaml}`,
  );
  const child: ChildProcess = spawn("docker-registry", ["serve", config], { stdio: ["ignore", "ignore", "pipe"] });
  let exited = false;
  const gone = new Promise<void>((r) =>
    child.once("exit", () => {
      exited = true;
      r();
    }),
  );
  let err = "";
  child.stderr!.on("data", (d: Buffer) => (err += d.toString()));
  const host = `127.0.0.1:${port}`;
  const deadline = Date.now() + 20_000;
  for (;;) {
    try {
      const r = await fetch(`http://${host}/v2/`);
      if (r.status === 200 || r.status === 401) break;
    } catch {
      // not listening yet
    }
    if (child.exitCode !== null || Date.now() > deadline) throw new Error(`docker-registry did not start: ${err.slice(-500)}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  const creds = auth === "none" ? [] : ["--dest-creds", `${user}:${password}`];
  const reg: TestRegistry = {
    host,
    user,
    password,
    get tokenRequests() {
      return state.tokenRequests;
    },
    push(layoutDir, tag, repoTag) {
      return new Promise((resolve, reject) => {
        execFile("skopeo", ["copy", "--quiet", "--dest-tls-verify=false", ...creds, `oci:${layoutDir}:${tag}`, `docker://${host}/${repoTag}`], { timeout: 120_000 }, (e, _out, stderr) =>
          e ? reject(new Error(`skopeo push failed: ${String(stderr).slice(-400)}`)) : resolve(),
        );
      });
    },
    async putManifest(repo, ref, body, mediaType) {
      const headers: Record<string, string> = { "content-type": mediaType };
      if (auth === "basic") headers.authorization = `Basic ${Buffer.from(`${user}:${password}`).toString("base64")}`;
      if (auth === "token") throw new Error("putManifest with token auth is not needed by the tests");
      const r = await fetch(`http://${host}/v2/${repo}/manifests/${ref}`, { method: "PUT", headers, body: new Uint8Array(body) });
      await r.arrayBuffer();
      return r.status;
    },
    async close() {
      if (!exited) {
        child.kill("SIGTERM");
        const t = setTimeout(() => child.kill("SIGKILL"), 5_000);
        await gone;
        clearTimeout(t);
      }
      if (tokenServer) await new Promise((r) => tokenServer!.close(r));
    },
  };
  return reg;
}

/**
 * A loopback proxy in front of a registry. `damage` decides, per blob GET,
 * what happens to its body: pass it on, flip one byte, or send half and
 * close the connection. `gate`, when given, is awaited before each blob GET
 * is passed on (a pull held in the middle).
 */
export async function startBlobProxy(target: string, damage: () => "none" | "flip" | "truncate", gate?: () => Promise<void>): Promise<{ host: string; close(): Promise<void> }> {
  const server = createServer(async (req, res) => {
    const isBlob = /\/blobs\/sha256:/.test(req.url ?? "") && req.method === "GET";
    if (isBlob && gate) await gate();
    const up = request({ host: target.split(":")[0], port: Number(target.split(":")[1]), path: req.url, method: req.method, headers: { ...req.headers, host: target } }, (r) => {
      const how = isBlob && r.statusCode === 200 ? damage() : "none";
      if (how === "none") {
        res.writeHead(r.statusCode ?? 502, r.headers);
        r.pipe(res);
        return;
      }
      const chunks: Buffer[] = [];
      r.on("data", (c: Buffer) => chunks.push(c));
      r.on("end", () => {
        const body = Buffer.concat(chunks);
        if (how === "flip") {
          body[Math.floor(body.length / 2)] = body[Math.floor(body.length / 2)]! ^ 0xff;
          res.writeHead(200, r.headers);
          res.end(body);
        } else {
          res.writeHead(200, r.headers);
          res.write(body.subarray(0, Math.floor(body.length / 2)), () => res.socket?.destroy());
        }
      });
    });
    up.on("error", () => res.destroy());
    req.pipe(up);
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return { host: `127.0.0.1:${(server.address() as AddressInfo).port}`, close: () => new Promise((r) => server.close(() => r())) };
}
