/**
 * Where a client (the CLI, or the library via BerthClient.fromConfig) finds its
 * coordinator and credentials, in order:
 *   1. flags: --url, --token-file, --config
 *   2. environment: BERTH_URL, BERTH_TOKEN (the token itself), BERTH_TOKEN_FILE, BERTH_CONFIG,
 *      BERTH_POOL (the pool `berth run` borrows from without --pool)
 *   3. ./.berth/client.json (written by `berth up`), then ~/.config/berth/client.json
 * The API token is never taken from argv: only from a file or the environment.
 */
import { existsSync, readFileSync } from "node:fs";
import { homedir } from "node:os";
import { dirname, isAbsolute, join, resolve } from "node:path";
import { BerthError } from "../core/errors.js";

/**
 * The client's own configuration is wrong or missing (no URL or token, an invalid URL, an
 * unreadable file, no keeper key): nothing was sent. The CLI reports it as a usage error (exit 2).
 */
export class ConfigError extends BerthError {
  constructor(message: string) {
    super("invalid_request", `invalid_request: ${message}`);
    this.name = "ConfigError";
  }
}

/** `url` as a coordinator URL (http or https), or a ConfigError naming where it came from. */
export function checkUrl(url: string, from: string): string {
  let u: URL | null = null;
  try {
    u = new URL(url);
  } catch {
    u = null;
  }
  if (!u || (u.protocol !== "http:" && u.protocol !== "https:") || !u.host) {
    throw new ConfigError(`${from} is not a coordinator URL; expected http://HOST:PORT or https://HOST:PORT, e.g. http://127.0.0.1:7420`);
  }
  return url.replace(/\/+$/, "");
}

export interface ClientConfig {
  url: string;
  token: string;
  /** Private key of the keeper principal (keeper pools whose machines carry its public key). */
  keeperKeyFile: string | null;
  /** The pool `berth run` uses without --pool (BERTH_POOL, else the file's `pool`), if any. */
  pool: string | null;
  /** Directory for receipts and ephemeral keys of `berth run`. */
  stateDir: string;
  source: string;
}

export interface ConfigFlags {
  url?: string;
  tokenFile?: string;
  config?: string;
}

interface FileConfig {
  url?: string;
  tokenFile?: string;
  keeperKeyFile?: string;
  pool?: string;
}

export function configCandidates(flags: ConfigFlags): string[] {
  if (flags.config) return [resolve(flags.config)];
  if (process.env.BERTH_CONFIG) return [resolve(process.env.BERTH_CONFIG)];
  return [resolve(".berth/client.json"), join(homedir(), ".config/berth/client.json")];
}

/** `requireToken: false`: no token is an empty `token` instead of a refusal (a server whose clients bring their own). */
export function loadConfig(flags: ConfigFlags, o: { requireToken?: boolean } = {}): ClientConfig {
  let file: FileConfig = {};
  let source = "flags/environment";
  let base = process.cwd();
  for (const path of configCandidates(flags)) {
    if (!existsSync(path)) {
      if (flags.config || process.env.BERTH_CONFIG) throw new ConfigError(`config file ${path} does not exist`);
      continue;
    }
    try {
      file = JSON.parse(readFileSync(path, "utf8")) as FileConfig;
    } catch (e) {
      throw new ConfigError(`config file ${path} is not valid JSON (${(e as Error).message})`);
    }
    source = path;
    base = dirname(path);
    break;
  }
  const abs = (p: string) => (isAbsolute(p) ? p : resolve(base, p));
  const url = flags.url ?? process.env.BERTH_URL ?? file.url;
  if (!url) {
    throw new ConfigError("no coordinator URL; pass --url, set BERTH_URL, or run `berth up` (it writes .berth/client.json)");
  }
  const urlFrom = flags.url !== undefined ? `--url ${flags.url}` : process.env.BERTH_URL !== undefined ? `BERTH_URL=${process.env.BERTH_URL}` : `"url" in ${source} (${String(file.url)})`;
  if (typeof url !== "string") throw new ConfigError(`${urlFrom} is not a coordinator URL`);
  let token = process.env.BERTH_TOKEN ?? null;
  const tokenFile = flags.tokenFile ?? process.env.BERTH_TOKEN_FILE ?? (file.tokenFile ? abs(file.tokenFile) : undefined);
  if (!token && tokenFile) {
    try {
      token = readFileSync(tokenFile, "utf8").trim();
    } catch (e) {
      throw new ConfigError(`cannot read token file ${tokenFile}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
    }
  }
  if (!token && o.requireToken !== false) {
    throw new ConfigError("no API token; pass --token-file FILE or set BERTH_TOKEN_FILE (create one with `berth token create`)");
  }
  return {
    url: checkUrl(url, urlFrom),
    token: token ?? "",
    keeperKeyFile: file.keeperKeyFile ? abs(file.keeperKeyFile) : null,
    pool: process.env.BERTH_POOL || (typeof file.pool === "string" && file.pool ? file.pool : null),
    stateDir: source.endsWith("client.json") ? dirname(source) : resolve(".berth"),
    source,
  };
}
