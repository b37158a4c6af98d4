/**
 * Real OpenSSH clients (ssh, sftp, scp, rsync) against a test's in-process
 * gateway: the options that pin its host key and use the rig's key, and an
 * asynchronous run (the gateway lives in the test's own process: a
 * synchronous spawn would starve it).
 */
import { spawn } from "node:child_process";
import { existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { GatewayRig } from "./agent.js";

/** `-i KEY -o …` for a client of `rig`'s gateway; the key and known_hosts are written into `dir` once. */
export function gatewaySshOpts(rig: GatewayRig, dir: string): string[] {
  const key = join(dir, "id");
  if (!existsSync(key)) {
    writeFileSync(key, rig.pair.privateKey, { mode: 0o600 });
    writeFileSync(join(dir, "known_hosts"), `[127.0.0.1]:${rig.gw.port} ${rig.gw.hostKey}\n`);
  }
  return ["-i", key, "-o", `UserKnownHostsFile=${join(dir, "known_hosts")}`, "-o", "StrictHostKeyChecking=yes", "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR"];
}

/** Run a client with `input` on its stdin; killed after `timeoutMs` (status null then). */
export function runClient(cmd: string, args: string[], input = "", timeoutMs = 300_000): Promise<{ status: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const child = spawn(cmd, args, { stdio: ["pipe", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
    child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
    const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
    child.once("close", (status) => {
      clearTimeout(timer);
      resolve({ status, stdout, stderr });
    });
    child.stdin.on("error", () => {});
    child.stdin.end(input);
  });
}
