/** What one `berth mcp` session allows: command timeouts, inline output, file and listing sizes (docs/mcp.md). */
import type { OutputLimits } from "./output.js";

export interface SessionLimits extends OutputLimits {
  /** Default and largest run_command timeout (ms). */
  defaultTimeoutMs: number;
  maxTimeoutMs: number;
  /** Largest write_file content (decoded bytes). */
  writeMaxBytes: number;
  /** read_file: bytes given without an explicit length; the most one call gives. */
  readDefaultBytes: number;
  readMaxBytes: number;
  /** read_output: bytes given without an explicit length; the most one call gives. */
  outputReadDefaultBytes: number;
  outputReadMaxBytes: number;
  /** list_files: entries given at most. */
  listMaxEntries: number;
}

export const DEFAULT_LIMITS: SessionLimits = {
  inlineBytes: 16 * 1024,
  spillLimit: 512 * 1024 * 1024,
  defaultTimeoutMs: 120_000,
  maxTimeoutMs: 30 * 60_000,
  // Base64 of it stays under the SDK's 4 MiB HTTP body and 10 MiB stdio message limits.
  writeMaxBytes: 2 * 1024 * 1024,
  readDefaultBytes: 256 * 1024,
  readMaxBytes: 1024 * 1024,
  outputReadDefaultBytes: 64 * 1024,
  outputReadMaxBytes: 1024 * 1024,
  listMaxEntries: 1000,
};
