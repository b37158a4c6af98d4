/**
 * Contracts between the agent's parts, so each can be built and tested on its own:
 *   keys (key authority, owned by the agent daemon) <- gateway (SSH auth)
 *   runtime (sandboxes) <- gateway/sessions (exec, PTY) and ops (create/fence/scrub/destroy)
 */

/** One key installed for a machine. */
export interface InstalledKey {
  machineId: string;
  /** SHA256 fingerprint as OpenSSH prints it: "SHA256:<base64 without padding>". */
  fingerprint: string;
  /** The machine generation this key was installed for. */
  generation: number;
  /** "grant": a portable borrow's ephemeral key; "keeper": the keeper pool's long-lived key. */
  mode: "grant" | "keeper";
  /** The grant or borrow this key belongs to (sessions are tagged with it). */
  grantId: string;
  /** Epoch ms; at now >= expiresAt the key no longer authenticates and its sessions are killed. null = no expiry (keeper). */
  expiresAt: number | null;
}

/** What the SSH gateway asks before admitting a public key, and listens to for cutting sessions. */
export interface KeyAuthority {
  /** The key, if `fingerprint` is installed for `machineId` at the machine's current generation and unexpired at `now`. */
  authorize(machineId: string, fingerprint: string, now: number): InstalledKey | null;
  /**
   * Called when a key stops being valid (removed, superseded by a newer generation, or expired):
   * the gateway must close every session admitted with that key, at once.
   */
  onRevoked(listener: (machineId: string, fingerprint: string, grantId: string) => void): void;
}

/** The gateway's side: lets the agent cut sessions and count them (fence proof, tests). */
export interface SessionRegistry {
  /** Close every SSH session of a machine (all keys); resolves when their processes are released. */
  closeMachine(machineId: string, why: string): Promise<number>;
  /** Live sessions of a machine. */
  count(machineId: string): number;
  /**
   * Clean session records a release had to retain (their process group could
   * not be shown absent then) once the runtime shows them gone — after a fence
   * or destroy has removed every process of the machine.
   */
  sweep?(): Promise<unknown>;
}
