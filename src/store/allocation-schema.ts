/**
 * Schema of allocations (migration 3): owner budgets, host capacity
 * accounts, allocations with their immutable placement plan, launch actor
 * records, and the allocation ledger (every reservation, refund, budget and
 * host-account change, in commit order per owner and per host, so an audit
 * can replay the history and check no instant was over a limit). Migration 7:
 * launches (the public key to install, what the agent proved at launch and at
 * release).
 */
import type { Migration } from "./migrate.js";

export const ALLOCATIONS_MIGRATION: Migration = {
  version: 3,
  name: "allocations",
  sql: `
CREATE TABLE alloc_owners (
  org TEXT NOT NULL,
  owner TEXT NOT NULL,
  budget_vcpu INTEGER NOT NULL,
  budget_memory_mib INTEGER NOT NULL,
  budget_count INTEGER NOT NULL,
  used_vcpu INTEGER NOT NULL DEFAULT 0,
  used_memory_mib INTEGER NOT NULL DEFAULT 0,
  used_count INTEGER NOT NULL DEFAULT 0,
  admitted_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL,
  PRIMARY KEY (org, owner)
);
CREATE TABLE host_accounts (
  host_id TEXT PRIMARY KEY,
  org TEXT NOT NULL,
  name TEXT NOT NULL,
  standing TEXT NOT NULL,
  vcpu INTEGER NOT NULL,
  memory_mib INTEGER NOT NULL,
  slots INTEGER NOT NULL,
  used_vcpu INTEGER NOT NULL DEFAULT 0,
  used_memory_mib INTEGER NOT NULL DEFAULT 0,
  used_slots INTEGER NOT NULL DEFAULT 0,
  standing_since BIGINT NOT NULL
);
CREATE INDEX host_accounts_org ON host_accounts (org, name);
CREATE TABLE allocations (
  id TEXT PRIMARY KEY,
  org TEXT NOT NULL,
  owner TEXT NOT NULL,
  size TEXT NOT NULL,
  vcpu INTEGER NOT NULL,
  memory_mib INTEGER NOT NULL,
  request_hash TEXT NOT NULL,
  state TEXT NOT NULL,
  host_id TEXT NOT NULL,
  plan TEXT NOT NULL,
  created_at BIGINT NOT NULL,
  expires_at BIGINT NOT NULL,
  state_since BIGINT NOT NULL,
  reason TEXT
);
CREATE INDEX allocations_owner ON allocations (org, owner, state);
CREATE INDEX allocations_host ON allocations (host_id, state);
CREATE TABLE allocation_actors (
  allocation_id TEXT PRIMARY KEY,
  generation INTEGER NOT NULL,
  actor TEXT NOT NULL,
  kind TEXT NOT NULL,
  recorded_at BIGINT NOT NULL
);
CREATE TABLE allocation_ledger (
  seq {{SERIAL_PK}},
  at BIGINT NOT NULL,
  event TEXT NOT NULL,
  org TEXT NOT NULL,
  allocation_id TEXT,
  owner TEXT,
  host_id TEXT,
  vcpu INTEGER NOT NULL,
  memory_mib INTEGER NOT NULL,
  detail TEXT,
  actor TEXT NOT NULL
);
CREATE INDEX allocation_ledger_alloc ON allocation_ledger (allocation_id, seq);
`,
};

/** Launches of allocations on their agents (added after migration 3 shipped, so a migration of its own). */
export const ALLOCATION_LAUNCHES_MIGRATION: Migration = {
  version: 7,
  name: "allocation launches",
  sql: `
CREATE TABLE allocation_launches (
  allocation_id TEXT PRIMARY KEY,
  public_key TEXT NOT NULL,
  fingerprint TEXT NOT NULL,
  keep_volume INTEGER NOT NULL DEFAULT 0,
  launch_result TEXT,
  release_result TEXT,
  ready_at BIGINT,
  attempts INTEGER NOT NULL DEFAULT 0,
  error TEXT,
  updated_at BIGINT NOT NULL
);
`,
};

/**
 * Migration 21: the disk dimension. Sizes grant a workspace disk, so budgets,
 * host accounts, allocations and the ledger count it (MiB, as memory).
 * Existing rows: an owner's disk budget becomes 40 GiB per allocation of its
 * count budget (what a `large` needs, so no owner admitted before is refused
 * for disk); allocations made before carry 0 (they were charged nothing for
 * disk, so their refund returns nothing); a host's disk is NULL until its
 * agent declares one at its next enrollment (NULL: not checked by placement).
 */
export const ALLOCATION_DISK_MIGRATION: Migration = {
  version: 21,
  name: "allocation disk dimension",
  sql: `
ALTER TABLE alloc_owners ADD COLUMN budget_disk_mib INTEGER NOT NULL DEFAULT 0;
ALTER TABLE alloc_owners ADD COLUMN used_disk_mib INTEGER NOT NULL DEFAULT 0;
UPDATE alloc_owners SET budget_disk_mib = budget_count * 40960;
ALTER TABLE host_accounts ADD COLUMN disk_mib INTEGER;
ALTER TABLE host_accounts ADD COLUMN used_disk_mib INTEGER NOT NULL DEFAULT 0;
ALTER TABLE hosts ADD COLUMN disk_mib INTEGER;
ALTER TABLE allocations ADD COLUMN disk_mib INTEGER NOT NULL DEFAULT 0;
ALTER TABLE allocation_ledger ADD COLUMN disk_mib INTEGER NOT NULL DEFAULT 0;
`,
};
