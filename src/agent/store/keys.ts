/** The agent's installed keys (table `keys`, migration 1): what the key authority (src/agent/keys.ts) loads at start and keeps in step. */
import type { Statements } from "../../store/sqlite/statements.js";
import type { InstalledKey } from "../contracts.js";

/** An installed key as stored: the contract's record plus its OpenSSH public key line. */
export interface StoredKey extends InstalledKey {
  publicKey: string;
  installedAt: number;
}

interface Row {
  machine_id: string;
  fingerprint: string;
  public_key: string;
  generation: number;
  mode: string;
  grant_id: string;
  expires_at: number | null;
  installed_at: number;
}

function fromRow(r: Row): StoredKey {
  return {
    machineId: r.machine_id,
    fingerprint: r.fingerprint,
    publicKey: r.public_key,
    generation: r.generation,
    mode: r.mode === "keeper" ? "keeper" : "grant",
    grantId: r.grant_id,
    expiresAt: r.expires_at,
    installedAt: r.installed_at,
  };
}

export class KeyTable {
  constructor(private readonly q: Statements) {}

  list(machineId?: string): StoredKey[] {
    const rows = (
      machineId === undefined
        ? this.q("SELECT * FROM keys ORDER BY machine_id, installed_at").all()
        : this.q("SELECT * FROM keys WHERE machine_id = ? ORDER BY installed_at").all(machineId)
    ) as Row[];
    return rows.map(fromRow);
  }

  put(k: StoredKey): void {
    this.q(
      `INSERT INTO keys (machine_id, fingerprint, public_key, generation, mode, grant_id, expires_at, installed_at)
       VALUES (@machineId, @fingerprint, @publicKey, @generation, @mode, @grantId, @expiresAt, @installedAt)
       ON CONFLICT(machine_id, fingerprint) DO UPDATE SET public_key = excluded.public_key,
         generation = excluded.generation, mode = excluded.mode, grant_id = excluded.grant_id,
         expires_at = excluded.expires_at, installed_at = excluded.installed_at`,
    ).run(k);
  }

  delete(machineId: string, fingerprint: string): void {
    this.q("DELETE FROM keys WHERE machine_id = ? AND fingerprint = ?").run(machineId, fingerprint);
  }
}
