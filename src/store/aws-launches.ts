/** Migration 14: the `aws_launches` table, every EC2 launch berth asked for (src/providers/aws/records.ts reads and writes it). */
import type { Migration } from "./migrate.js";

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
