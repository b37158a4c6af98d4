/**
 * Migration 14: the `aws_launches` table, and its statements
 * (`storeLaunchRecords`): the durable record of every EC2 launch berth asks
 * for, kept with the machine in the coordinator's store.
 *
 * A row is written BEFORE RunInstances is sent (its ClientToken, region,
 * deployment and machine), and completed with the instance id and account
 * as soon as RunInstances answers, or as soon as a retry finds the
 * instance again by its ClientToken when the answer was lost. Destroy and
 * the sweep (src/providers/aws) work from these rows, so an instance is
 * found again in the region and under the deployment it was launched with,
 * whatever the configuration says today. A row is closed (`ended_at`) only
 * once its instance is observed terminated, or its ClientToken is observed
 * to have launched nothing.
 *
 * Migration 22 adds the market each launch asked for (`spot` or
 * `on-demand`; rows from before it were on-demand launches).
 */
import type { Migration } from "./migrate.js";
import type { Store } from "./store.js";

export const AWS_LAUNCHES_MIGRATION: Migration = {
  version: 14,
  name: "aws launches",
  sql: `
CREATE TABLE aws_launches (
  client_token TEXT PRIMARY KEY,
  machine_id TEXT NOT NULL,
  org TEXT NOT NULL,
  pool TEXT NOT NULL,
  region TEXT NOT NULL,
  deployment TEXT NOT NULL,
  instance_id TEXT,
  account TEXT,
  requested_at BIGINT NOT NULL,
  ended_at BIGINT,
  end_reason TEXT
);
CREATE INDEX aws_launches_machine ON aws_launches (machine_id);
CREATE INDEX aws_launches_open ON aws_launches (ended_at);
`,
};

export const AWS_LAUNCH_MARKET_MIGRATION: Migration = {
  version: 22,
  name: "aws launch market",
  sql: `
ALTER TABLE aws_launches ADD COLUMN market TEXT NOT NULL DEFAULT 'on-demand';
`,
};

/** The EC2 purchasing option a launch asked for. */
export type LaunchMarket = "spot" | "on-demand";

export interface LaunchRecord {
  clientToken: string;
  machineId: string;
  org: string;
  pool: string;
  region: string;
  deployment: string;
  market: LaunchMarket;
  instanceId: string | null;
  account: string | null;
  requestedAt: number;
  endedAt: number | null;
  endReason: string | null;
}

export interface LaunchRecords {
  /** Before RunInstances: the intent (idempotent on the client token; an existing row keeps its region, deployment and market). Market absent: on-demand. */
  intend(r: Omit<LaunchRecord, "instanceId" | "account" | "endedAt" | "endReason" | "market"> & { market?: LaunchMarket }): Promise<LaunchRecord>;
  /** RunInstances answered (or the token was found again): the instance id and account. */
  launched(clientToken: string, instanceId: string, account: string | null): Promise<void>;
  /** The instance is observed terminated, or the token launched nothing. */
  ended(clientToken: string, at: number, reason: string): Promise<void>;
  byToken(clientToken: string): Promise<LaunchRecord | undefined>;
  /** Launches of a machine not yet observed ended. */
  openFor(machineId: string): Promise<LaunchRecord[]>;
  /** Every launch not yet observed ended. */
  open(): Promise<LaunchRecord[]>;
  /** Every (region, deployment) any launch ever named, ended ones included. */
  scopes(): Promise<Array<{ region: string; deployment: string }>>;
}

type Row = {
  client_token: string;
  machine_id: string;
  org: string;
  pool: string;
  region: string;
  deployment: string;
  market: string;
  instance_id: string | null;
  account: string | null;
  requested_at: number | string;
  ended_at: number | string | null;
  end_reason: string | null;
};

const COLS = "client_token, machine_id, org, pool, region, deployment, market, instance_id, account, requested_at, ended_at, end_reason";

function fromRow(r: Row): LaunchRecord {
  return {
    clientToken: r.client_token,
    machineId: r.machine_id,
    org: r.org,
    pool: r.pool,
    region: r.region,
    deployment: r.deployment,
    market: r.market === "spot" ? "spot" : "on-demand",
    instanceId: r.instance_id,
    account: r.account,
    requestedAt: Number(r.requested_at),
    endedAt: r.ended_at === null ? null : Number(r.ended_at),
    endReason: r.end_reason,
  };
}

export function storeLaunchRecords(store: Store): LaunchRecords {
  const byToken = async (token: string) => {
    const r = await store.transaction((tx) => tx.get<Row>(`SELECT ${COLS} FROM aws_launches WHERE client_token = ?`, [token]));
    return r ? fromRow(r) : undefined;
  };
  return {
    byToken,
    async intend(r) {
      await store.transaction(async (tx) => {
        const had = await tx.get<{ n: number }>("SELECT 1 AS n FROM aws_launches WHERE client_token = ?", [r.clientToken]);
        if (!had) {
          await tx.run(`INSERT INTO aws_launches (client_token, machine_id, org, pool, region, deployment, market, requested_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`, [
            r.clientToken,
            r.machineId,
            r.org,
            r.pool,
            r.region,
            r.deployment,
            r.market ?? "on-demand",
            r.requestedAt,
          ]);
        }
      });
      return (await byToken(r.clientToken))!;
    },
    async launched(token, instanceId, account) {
      await store.transaction((tx) => tx.run("UPDATE aws_launches SET instance_id = ?, account = COALESCE(?, account) WHERE client_token = ?", [instanceId, account, token]));
    },
    async ended(token, at, reason) {
      await store.transaction((tx) => tx.run("UPDATE aws_launches SET ended_at = ?, end_reason = ? WHERE client_token = ? AND ended_at IS NULL", [at, reason, token]));
    },
    async openFor(machineId) {
      const rows = await store.transaction((tx) => tx.all<Row>(`SELECT ${COLS} FROM aws_launches WHERE machine_id = ? AND ended_at IS NULL ORDER BY requested_at`, [machineId]));
      return rows.map(fromRow);
    },
    async open() {
      const rows = await store.transaction((tx) => tx.all<Row>(`SELECT ${COLS} FROM aws_launches WHERE ended_at IS NULL ORDER BY requested_at`));
      return rows.map(fromRow);
    },
    async scopes() {
      return store.transaction((tx) => tx.all<{ region: string; deployment: string }>("SELECT DISTINCT region, deployment FROM aws_launches ORDER BY region, deployment"));
    },
  };
}
