/**
 * The coordinator's schema: one portable SQL script per version, applied by
 * the one runner (`migrate.ts`) on SQLite and PostgreSQL alike.
 * Integer columns hold epoch milliseconds. Portable and keeper records live
 * in separate tables (invariant 10): `borrows` for keeper borrows, `grants`
 * for portable ones; a machine's `access` column is fixed at registration and
 * both registration paths refuse a resource that is live under the other.
 */
import type { Migration } from "./migrate.js";
import { ALLOCATIONS_MIGRATION, ALLOCATION_DISK_MIGRATION, ALLOCATION_LAUNCHES_MIGRATION } from "./allocation-schema.js";
import { UI_SESSIONS_MIGRATION } from "./ui-sessions.js";
import { NETWORK_MIGRATION } from "./machine-network.js";
import { HOST_IDENTITY_MIGRATION } from "./host-identity.js";
import { IMAGES_MIGRATION } from "./images.js";
import { HOST_REMOVAL_MIGRATION } from "./host-removal.js";
import { HOST_GONE_MIGRATION, HOST_STANDING_MIGRATION } from "./host-standing.js";
import { AUDIT_DETAIL_MIGRATION } from "./audit.js";
import { ALLOCATION_RESOLVE_MIGRATION, ALLOCATION_VOLUME_MIGRATION } from "./allocation-launches.js";
import { FORWARDING_MIGRATION } from "./forwarding.js";
import { FILES_SCOPE_MIGRATION } from "./files-scope.js";
import { AWS_LAUNCHES_MIGRATION, AWS_LAUNCH_MARKET_MIGRATION } from "./aws-launches.js";
import { PROVISION_BREAKER_MIGRATION } from "./provision-breaker.js";
import { HISTORY_MIGRATION } from "./history.js";
import { HISTORY_SERIES_MIGRATION } from "./history-series.js";
import { PLACEMENT_BREAKERS_MIGRATION } from "./placement-breakers.js";

export const MIGRATIONS: readonly Migration[] = [
  {
    version: 1,
    name: "coordinator core",
    sql: `
CREATE TABLE api_tokens (
  id TEXT PRIMARY KEY,
  org TEXT NOT NULL,
  role TEXT NOT NULL,
  hash TEXT NOT NULL UNIQUE,
  label TEXT,
  created_at BIGINT NOT NULL,
  expires_at BIGINT,
  revoked_at BIGINT
);
CREATE TABLE pools (
  org TEXT NOT NULL,
  name TEXT NOT NULL,
  access TEXT NOT NULL,
  provider TEXT NOT NULL,
  compatibility_key TEXT NOT NULL,
  identity TEXT,
  min_ready INTEGER NOT NULL,
  max_ready INTEGER NOT NULL,
  hard_ttl_ms BIGINT NOT NULL,
  heartbeat_ms BIGINT NOT NULL,
  keeper_key TEXT,
  created_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL,
  PRIMARY KEY (org, name)
);
CREATE TABLE hosts (
  id TEXT PRIMARY KEY,
  org TEXT NOT NULL,
  name TEXT NOT NULL,
  url TEXT NOT NULL,
  runtime TEXT NOT NULL,
  vcpu INTEGER NOT NULL,
  memory_mb INTEGER NOT NULL,
  slots INTEGER NOT NULL,
  used_slots INTEGER NOT NULL DEFAULT 0,
  ssh_host TEXT NOT NULL,
  ssh_port INTEGER NOT NULL,
  host_key TEXT NOT NULL,
  fingerprint TEXT NOT NULL,
  enrolled_at BIGINT NOT NULL,
  UNIQUE (org, name)
);
CREATE TABLE machines (
  id TEXT PRIMARY KEY,
  org TEXT NOT NULL,
  pool TEXT NOT NULL,
  access TEXT NOT NULL,
  provider TEXT NOT NULL,
  resource_id TEXT NOT NULL,
  host_id TEXT,
  state TEXT NOT NULL,
  generation INTEGER NOT NULL,
  incarnation TEXT,
  ssh_host TEXT,
  ssh_port INTEGER,
  ssh_user TEXT,
  host_key TEXT,
  claim_id TEXT,
  lent_to TEXT,
  created_at BIGINT NOT NULL,
  state_since BIGINT NOT NULL,
  ready_since BIGINT,
  hard_expires_at BIGINT NOT NULL,
  reason TEXT
);
CREATE UNIQUE INDEX machines_live_resource ON machines (provider, resource_id) WHERE state <> 'destroyed';
CREATE INDEX machines_queue ON machines (org, pool, state, ready_since);
CREATE TABLE claims (
  id TEXT PRIMARY KEY,
  org TEXT NOT NULL,
  pool TEXT NOT NULL,
  token_hash TEXT NOT NULL UNIQUE,
  state TEXT NOT NULL,
  created_at BIGINT NOT NULL,
  expires_at BIGINT NOT NULL,
  machine_id TEXT
);
CREATE INDEX claims_pool ON claims (org, pool, state);
CREATE TABLE borrows (
  id TEXT PRIMARY KEY,
  org TEXT NOT NULL,
  pool TEXT NOT NULL,
  machine_id TEXT NOT NULL,
  principal TEXT NOT NULL,
  token_hash TEXT NOT NULL UNIQUE,
  state TEXT NOT NULL,
  generation INTEGER NOT NULL,
  created_at BIGINT NOT NULL,
  heartbeat_deadline BIGINT NOT NULL,
  expires_at BIGINT NOT NULL,
  ended_at BIGINT,
  reason TEXT
);
CREATE INDEX borrows_machine ON borrows (machine_id, state);
CREATE TABLE due (
  kind TEXT NOT NULL,
  ref TEXT NOT NULL,
  due_at BIGINT NOT NULL,
  PRIMARY KEY (kind, ref)
);
CREATE INDEX due_order ON due (due_at);
CREATE TABLE operations (
  id TEXT PRIMARY KEY,
  kind TEXT NOT NULL,
  machine_id TEXT NOT NULL,
  host_id TEXT,
  generation INTEGER NOT NULL,
  state TEXT NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 0,
  args TEXT NOT NULL,
  result TEXT,
  error TEXT,
  created_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL
);
CREATE INDEX operations_machine ON operations (machine_id, state);
CREATE TABLE audit (
  seq {{SERIAL_PK}},
  at BIGINT NOT NULL,
  machine_id TEXT NOT NULL,
  subject TEXT,
  event TEXT NOT NULL,
  from_state TEXT,
  to_state TEXT NOT NULL,
  generation INTEGER NOT NULL,
  actor TEXT NOT NULL
);
CREATE INDEX audit_machine ON audit (machine_id, seq);
`,
  },
  {
    version: 2,
    name: "portable grants",
    sql: `
CREATE TABLE grants (
  id TEXT PRIMARY KEY,
  org TEXT NOT NULL,
  pool TEXT NOT NULL,
  machine_id TEXT NOT NULL,
  resource_id TEXT NOT NULL,
  borrower TEXT NOT NULL,
  token_hash TEXT NOT NULL UNIQUE,
  grant_token_hash TEXT NOT NULL UNIQUE,
  generation INTEGER NOT NULL,
  fingerprint TEXT NOT NULL,
  public_key TEXT NOT NULL,
  state TEXT NOT NULL,
  reason TEXT,
  created_at BIGINT NOT NULL,
  ack_deadline BIGINT NOT NULL,
  heartbeat_deadline BIGINT NOT NULL,
  expires_at BIGINT NOT NULL,
  activated_at BIGINT,
  ended_at BIGINT
);
CREATE INDEX grants_machine ON grants (machine_id, state);
CREATE INDEX grants_borrower ON grants (borrower, state);
`,
  },
  ALLOCATIONS_MIGRATION,
  HOST_IDENTITY_MIGRATION,
  NETWORK_MIGRATION,
  UI_SESSIONS_MIGRATION,
  ALLOCATION_LAUNCHES_MIGRATION,
  IMAGES_MIGRATION,
  HOST_REMOVAL_MIGRATION,
  HOST_STANDING_MIGRATION,
  AUDIT_DETAIL_MIGRATION,
  ALLOCATION_RESOLVE_MIGRATION,
  FORWARDING_MIGRATION,
  AWS_LAUNCHES_MIGRATION,
  PROVISION_BREAKER_MIGRATION,
  FILES_SCOPE_MIGRATION,
  HISTORY_MIGRATION,
  HISTORY_SERIES_MIGRATION,
  PLACEMENT_BREAKERS_MIGRATION,
  ALLOCATION_VOLUME_MIGRATION,
  ALLOCATION_DISK_MIGRATION,
  AWS_LAUNCH_MARKET_MIGRATION,
  HOST_GONE_MIGRATION,
];
