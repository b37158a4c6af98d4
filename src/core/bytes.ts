/** Byte sizes as people write them (`20G`, `512MiB`, `1.5g`, `1000000`) and as berth prints them. */
import { BerthError } from "./errors.js";

const UNIT: Record<string, number> = { "": 1, b: 1, k: 1 << 10, kb: 1 << 10, kib: 1 << 10, m: 1 << 20, mb: 1 << 20, mib: 1 << 20, g: 1 << 30, gb: 1 << 30, gib: 1 << 30, t: 2 ** 40, tb: 2 ** 40, tib: 2 ** 40 };

/** Parses a size; units are powers of 1024 (K, M, G, T, with or without B / iB). */
export function parseBytes(text: string, what: string): number {
  const m = /^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$/.exec(text);
  const unit = m ? UNIT[m[2]!.toLowerCase()] : undefined;
  if (!m || unit === undefined) throw new BerthError("invalid_request", `invalid_request: ${what} ${JSON.stringify(text)} is not a size; write e.g. 20G, 512M or 1048576`);
  const n = Math.floor(Number(m[1]) * unit);
  if (!Number.isSafeInteger(n) || n <= 0) throw new BerthError("invalid_request", `invalid_request: ${what} must be a positive size`);
  return n;
}

export function formatBytes(n: number): string {
  if (n >= 2 ** 40) return `${(n / 2 ** 40).toFixed(1)} TiB`;
  if (n >= 1 << 30) return `${(n / (1 << 30)).toFixed(1)} GiB`;
  if (n >= 1 << 20) return `${(n / (1 << 20)).toFixed(1)} MiB`;
  if (n >= 1 << 10) return `${(n / (1 << 10)).toFixed(1)} KiB`;
  return `${n} B`;
}
