/**
 * Every table of the agent's store, as versioned migrations run by the same
 * runner and scheme as the coordinator's stores (src/store/migrate.ts). Each
 * table's statements live in their own file beside this one.
 */
import type { Migration } from "../../store/migrate.js";

/** The agent daemon's tables. Append only; never edit an applied entry. */
export const AGENT_MIGRATIONS: Migration[] = [
  {
    version: 1,
    name: "agent core",
    sql: `
      CREATE TABLE meta (
        key   TEXT PRIMARY KEY,
        value TEXT NOT NULL
      );
      CREATE TABLE machines (
        id          TEXT PRIMARY KEY,
        generation  INTEGER NOT NULL,
        state       TEXT NOT NULL,      -- creating | running | destroying | destroyed | mismatch
        incarnation TEXT,
        workspace   TEXT,
        identity    TEXT,               -- runtime identity JSON (RuntimeMachine.identity)
        mismatch    TEXT,               -- why recovery refused to adopt it
        created_at  INTEGER NOT NULL,
        updated_at  INTEGER NOT NULL
      );
      CREATE TABLE keys (
        machine_id  TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        public_key  TEXT NOT NULL,
        generation  INTEGER NOT NULL,
        mode        TEXT NOT NULL,      -- grant | keeper
        grant_id    TEXT NOT NULL,
        expires_at  INTEGER,            -- epoch ms; NULL = no expiry (keeper)
        installed_at INTEGER NOT NULL,
        PRIMARY KEY (machine_id, fingerprint)
      );
      -- Keys removed by remove_key, so that a delayed install_key of the same
      -- grant or key at the same generation never restores it.
      CREATE TABLE removed_keys (
        machine_id  TEXT NOT NULL,
        generation  INTEGER NOT NULL,
        grant_id    TEXT,
        fingerprint TEXT,
        removed_at  INTEGER NOT NULL
      );
      CREATE INDEX removed_keys_machine ON removed_keys (machine_id, generation);
      CREATE TABLE operations (
        op_id       TEXT PRIMARY KEY,
        kind        TEXT NOT NULL,
        machine_id  TEXT NOT NULL,
        generation  INTEGER NOT NULL,
        args_hash   TEXT NOT NULL,
        status      TEXT NOT NULL,      -- started | done | failed
        result      TEXT,               -- JSON, once done
        error       TEXT,               -- last failure message, when failed
        created_at  INTEGER NOT NULL,
        finished_at INTEGER
      );
      CREATE INDEX operations_machine ON operations (machine_id, status);
    `,
  },
  {
    // The agent's "create" is the protocol's "provision" (one word on both
    // sides). Its arguments are none, so the kept hash is that of {"kind":"provision"}.
    version: 2,
    name: "one word per operation",
    sql: `
      UPDATE operations SET kind = 'provision', args_hash = 'c6143d9041dff78179887d3720161c11460f1c85c3caa167dbea1807bdb9de41'
        WHERE kind = 'create';
    `,
  },
  {
    // Holds: src/agent/store/holds.ts; volumes: src/agent/store/volumes.ts.
    version: 3,
    name: "allocation holds and volumes",
    sql: `
      CREATE TABLE alloc_holds (
        allocation_id TEXT PRIMARY KEY,
        machine_id    TEXT NOT NULL,
        generation    INTEGER NOT NULL,   -- the launch actor's generation that took (or last touched) it
        state         TEXT NOT NULL,      -- held | released
        vcpu          INTEGER NOT NULL,
        memory_mib    INTEGER NOT NULL,
        taken_at      INTEGER NOT NULL,
        released_at   INTEGER
      );
      CREATE TABLE volumes (
        allocation_id TEXT PRIMARY KEY,
        state         TEXT NOT NULL,      -- intent | ready | release_intent | clean
        path          TEXT NOT NULL,
        dev           TEXT,               -- st_dev of <path>/data, exact (bigint as text)
        ino           TEXT,               -- st_ino of <path>/data, exact
        marker        TEXT NOT NULL,      -- random, written to <path>/marker; proves the directory is this volume
        created_at    INTEGER NOT NULL,
        updated_at    INTEGER NOT NULL
      );
    `,
  },
  {
    // Session records (src/agent/store/sessions.ts). Stores of earlier builds
    // created the table when the gateway started, hence IF NOT EXISTS.
    version: 4,
    name: "session records",
    sql: `
      CREATE TABLE IF NOT EXISTS agent_sessions (
        session_id  TEXT PRIMARY KEY,
        machine_id  TEXT NOT NULL,
        grant_id    TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        pty         INTEGER NOT NULL,
        incarnation TEXT,
        state       TEXT NOT NULL CHECK (state IN ('intent','running','release_intent','clean')),
        client      TEXT,
        leader      TEXT,
        note        TEXT,
        created_at  INTEGER NOT NULL,
        updated_at  INTEGER NOT NULL
      );
      CREATE INDEX IF NOT EXISTS agent_sessions_unfinished ON agent_sessions(state) WHERE state <> 'clean';
      CREATE INDEX IF NOT EXISTS agent_sessions_clean ON agent_sessions(updated_at) WHERE state = 'clean';
    `,
  },
  {
    // src/agent/store/networks.ts
    version: 5,
    name: "machine networks",
    sql: `
      CREATE TABLE machine_networks (
        machine_id   TEXT PRIMARY KEY,
        state        TEXT NOT NULL,     -- intent | up | releasing
        policy       TEXT NOT NULL,     -- canonical policy JSON
        fingerprint  TEXT NOT NULL,
        slot         INTEGER,           -- address slot (a host-wide lease), NULL until leased
        netns        TEXT NOT NULL,
        host_if      TEXT NOT NULL,
        nft_table    TEXT NOT NULL,
        netns_inode  TEXT,              -- exact identity, once up
        host_ifindex INTEGER,
        nft_handle   INTEGER,
        resolved     TEXT,              -- JSON {name: [ipv4]} pinned at set-up
        evidence     TEXT,              -- JSON of the last readiness evidence
        created_at   INTEGER NOT NULL,
        updated_at   INTEGER NOT NULL
      );
    `,
  },
  {
    // src/agent/store/networks.ts: the rules as loaded and read back (digests and lines), compared before every lend
    version: 6,
    name: "machine network rules witness",
    sql: `
      ALTER TABLE machine_networks ADD COLUMN rules TEXT;
    `,
  },
  {
    // src/agent/volume-disk.ts: a volume's disk size (MiB, null: none named) and whether an image enforces it, or why not
    version: 7,
    name: "volume disk limit",
    sql: `
      ALTER TABLE volumes ADD COLUMN disk_mib INTEGER;
      ALTER TABLE volumes ADD COLUMN disk_enforced INTEGER;
      ALTER TABLE volumes ADD COLUMN disk_why TEXT;
    `,
  },
];

/** Named migrations of the scheme before `schema_version` (adopted once, by version). */
export const LEGACY_NAMES: Record<string, number> = { "001_agent_core": 1 };
