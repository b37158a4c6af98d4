/**
 * The AWS provider against the emulator: the real SDK clients (endpoint
 * override, fake static credentials), a pool configuration, and small
 * helpers to run operations and reach an instance over SSH.
 */
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { sink } from "./sink.js";
import { EC2Client } from "@aws-sdk/client-ec2";
import { SSMClient } from "@aws-sdk/client-ssm";
import { AwsProvider } from "../../src/providers/aws/aws-provider.js";
import { parseAwsConfig, type AwsConfig } from "../../src/providers/aws/config.js";
import type { OperationOutcome, OperationRequest } from "../../src/providers/provider.js";
import { parseOpRowArgs } from "../../src/protocol/operations.js";
import type { MachineRow } from "../../src/store/machines.js";
import { connect, execStreaming } from "../../src/cli/ssh-client.js";
import { AwsEmulator } from "./aws-emulator/emulator.js";
import { storeLaunchRecords } from "../../src/store/aws-launches.js";
import { SqliteStore } from "../../src/store/sqlite/sqlite-store.js";
import type { Store } from "../../src/store/store.js";
import { tempDir } from "./env.js";

export const FAKE_CREDENTIALS = { accessKeyId: "AKIDEMULATOR", secretAccessKey: "emulator-secret-not-a-real-key" };

export function awsConfigFor(emu: AwsEmulator, pools: string[] = ["ci"], o: { deployment?: string; region?: string; pool?: Record<string, unknown> } = {}): AwsConfig {
  const pool = { region: o.region ?? "eu-west-1", subnetId: "subnet-0abc", securityGroupIds: ["sg-0abc"], instanceType: "t3.micro", imageId: "ami-0abc1234", instanceProfile: "berth-ssm", sshAddress: "private", sshPort: emu.sshPort, ...o.pool };
  return parseAwsConfig({ deployment: o.deployment ?? "test", endpoint: emu.url, pools: Object.fromEntries(pools.map((p) => [p, pool])) });
}

export interface AwsWorld {
  emu: AwsEmulator;
  provider: AwsProvider;
  /** The SQLite store holding the provider's launch records. */
  store: Store;
  dir: string;
  /** Another provider on the same emulator and records, under an edited configuration (a restart after a config change). */
  providerWith(o: { deployment?: string; region?: string; pools?: string[]; pool?: Record<string, unknown> }): AwsProvider;
  close(): Promise<void>;
}

export async function awsWorld(o: { stepBudgetMs?: number; pollMs?: number; pools?: string[]; store?: Store; pool?: Record<string, unknown> } = {}): Promise<AwsWorld> {
  const dir = tempDir("berth-aws-emu-");
  const emu = await new AwsEmulator(dir.path).start();
  const store = o.store ?? new SqliteStore({ path: join(dir.path, "berth.db") });
  const records = storeLaunchRecords(store);
  const build = (config: AwsConfig) => {
    // One SDK attempt per call, so the provider's own handling of lost replies and throttling is what is tested.
    const clients = (region: string) => {
      const base = { region, endpoint: config.endpoint, credentials: FAKE_CREDENTIALS, maxAttempts: 1 };
      return { ec2: new EC2Client(base), ssm: new SSMClient(base) };
    };
    return new AwsProvider({ config, records, clients, stepBudgetMs: o.stepBudgetMs ?? 8_000, pollMs: o.pollMs ?? 50 });
  };
  const provider = build(awsConfigFor(emu, o.pools, { pool: o.pool }));
  return {
    emu,
    provider,
    store,
    dir: dir.path,
    providerWith: (c) => build(awsConfigFor(emu, c.pools ?? o.pools, { pool: o.pool, ...c })),
    async close() {
      await emu.stop();
      if (!o.store) await store.close();
      dir.cleanup();
    },
  };
}

export function machine(id: string, pool = "ci"): MachineRow {
  return {
    id,
    org: "default",
    pool,
    access: "portable",
    provider: "aws",
    resource_id: id,
    host_id: null,
    state: "provisioning",
    generation: 0,
    incarnation: null,
    ssh_host: null,
    ssh_port: null,
    ssh_user: null,
    host_key: null,
    claim_id: null,
    lent_to: null,
    created_at: 0,
    state_since: 0,
    ready_since: null,
    hard_expires_at: 0,
    reason: null,
  };
}

export function opId(...parts: Array<string | number>): string {
  return "op_" + createHash("sha256").update(parts.join(":")).digest("hex").slice(0, 24);
}

export function op(kind: OperationRequest["kind"], m: MachineRow, generation: number, args: Record<string, unknown> = {}, id = opId(kind, m.id, generation, JSON.stringify(args))): OperationRequest {
  return { opId: id, ...parseOpRowArgs(kind, JSON.stringify(args)), machine: m, generation };
}

export function done(o: OperationOutcome): Record<string, unknown> {
  if (o.kind !== "done") throw new Error(`expected done, got ${o.kind}: ${o.error}`);
  return o.result;
}

/** Runs an operation again and again (same op id) while it is ambiguous, as the executor would. */
export async function untilSettled(p: AwsProvider, req: OperationRequest, max = 20): Promise<{ outcome: OperationOutcome; attempts: number }> {
  for (let i = 1; ; i++) {
    const outcome = await p.run(req);
    if (outcome.kind !== "ambiguous" || i >= max) return { outcome, attempts: i };
  }
}

export interface Target {
  host: string;
  port: number;
  user: string;
  hostKey: string;
}


export async function sshRun(t: Target, privateKey: string, command: string): Promise<{ code: number | null; out: string }> {
  const c = await connect({ ...t, privateKey }, 5_000);
  try {
    const out = sink();
    const r = await execStreaming(c, command, { stdout: out.stream, stderr: sink().stream });
    return { code: r.code, out: out.text() };
  } finally {
    c.end();
  }
}

/** The grant lines in the guest's key file for a machine user. */
export function guestKeys(emu: AwsEmulator, instanceId: string, user: string): string[] {
  try {
    return readFileSync(join(emu.instances.get(instanceId)!.root, "etc/berth/keys", user), "utf8").split("\n").filter((l) => l.includes(" berth:"));
  } catch {
    return [];
  }
}
