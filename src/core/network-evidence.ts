/**
 * Readiness evidence (seed FR-18): what the agent's probe from inside a
 * machine proved, bound to the policy fingerprint, the machine generation and
 * the incarnation it ran in. Pure: the evidence shape and the coordinator's
 * verdict on it.
 */
export type CheckKind = "permit" | "deny" | "dns-answer" | "dns-refused" | "pinned";

export interface ProbeCheck {
  kind: CheckKind;
  /** host:port, resolver address, or pinned name. */
  target: string;
  /** Why this target is checked, e.g. "metadata", "agent API", "allow entry". */
  why: string;
  /** What was seen: open | refused | unreachable | timeout | answered | resolved:IP | error:… */
  got: string;
  ms: number;
  ok: boolean;
  /** Refusal checks: what the machine's own refuse chain counted during the check, e.g. "refuse counter +1". */
  witness?: string;
}

/**
 * The rules a probe ran against, as read back from the kernel: a digest of
 * the machine's nftables table (handles included, packet counts left out)
 * and of its namespace's addresses and routes, and their normalised lines
 * (kept on the agent, to show what changed).
 */
export interface RulesWitness {
  /** `sha256:` + hex over the table's normalised lines. */
  digest: string;
  /** `sha256:` + hex over the namespace's addresses and routes. */
  namespaceDigest: string;
  lines?: string[];
  namespaceLines?: string[];
}

export interface ReadinessEvidence {
  result: "pass" | "fail";
  policyFingerprint: string;
  generation: number;
  incarnation: string | null;
  /** Epoch ms when the probe finished. */
  at: number;
  durationMs: number;
  checks: ProbeCheck[];
  /** Names pinned at set-up and their addresses. */
  pinned: Record<string, string[]>;
  /** The rules as they were read back before the checks (and found unchanged after them). */
  rules?: RulesWitness;
  /** Set when the probe could not run at all. */
  error?: string;
}

export type ReadinessVerdict = { kind: "ready" } | { kind: "quarantine"; why: string } | { kind: "rotate"; why: string };

/**
 * May a machine become ready with this evidence? `expected` is the fingerprint
 * the machine was provisioned for, `current` the pool's fingerprint now.
 * A pool with no network policy needs no evidence.
 */
export function readinessVerdict(
  expected: string,
  current: string,
  generation: number,
  evidence: ReadinessEvidence | null | undefined,
): ReadinessVerdict {
  if (expected === "none") return expected === current ? { kind: "ready" } : { kind: "rotate", why: `pool network policy changed (none -> ${current})` };
  if (!evidence) return { kind: "quarantine", why: "no network readiness evidence from the agent" };
  if (evidence.policyFingerprint !== expected) return { kind: "quarantine", why: `readiness evidence is for policy ${evidence.policyFingerprint}, machine has ${expected}` };
  if (evidence.generation !== generation) return { kind: "quarantine", why: `readiness evidence is for generation ${evidence.generation}, machine is at ${generation}` };
  if (evidence.result !== "pass") {
    const failed = evidence.checks.filter((c) => !c.ok).map((c) => `${c.kind} ${c.target}: ${c.got}`);
    return { kind: "quarantine", why: `network probe failed: ${evidence.error ?? failed.slice(0, 3).join("; ")}` };
  }
  if (expected !== current) return { kind: "rotate", why: `pool network policy changed (${expected} -> ${current})` };
  return { kind: "ready" };
}

/** Short form kept on the coordinator's machine row and shown by `pool show`. */
export function evidenceSummary(e: ReadinessEvidence): Omit<ReadinessEvidence, "pinned"> {
  const { pinned: _pinned, rules, ...rest } = e;
  return { ...rest, ...(rules ? { rules: { digest: rules.digest, namespaceDigest: rules.namespaceDigest } } : {}) };
}

/** What changed between two lists of normalised lines: `- line` gone, `+ line` new (a multiset difference), at most `max`. */
export function linesDiff(before: readonly string[], after: readonly string[], max = 20): string[] {
  const minus = (x: readonly string[], y: readonly string[]): string[] => {
    const left = new Map<string, number>();
    for (const l of y) left.set(l, (left.get(l) ?? 0) + 1);
    const out: string[] = [];
    for (const l of x) {
      const n = left.get(l) ?? 0;
      if (n > 0) left.set(l, n - 1);
      else out.push(l);
    }
    return out;
  };
  const out = [...minus(before, after).map((l) => `- ${l}`), ...minus(after, before).map((l) => `+ ${l}`)];
  if (out.length === 0 && before.join("\n") !== after.join("\n")) out.push("~ the same lines in another order");
  return out.slice(0, max);
}
