/**
 * How an allocation is reached: the name of its sandbox on the agent (the SSH
 * user), derived from the allocation id alone so every coordinator, the agent
 * and the client compute the same one. Pool machines are named `m_…` by the
 * coordinator; allocation sandboxes are `a-<id>` (or `a-h<hash>` for an id
 * too long to prefix), so the two never collide.
 */
import { createHash } from "node:crypto";
import { parseId, type Id } from "./ids.js";

export function allocationMachineId(allocationId: string): Id {
  const id = parseId(allocationId, "allocation id");
  return parseId(id.length <= 120 ? `a-${id}` : `a-h${createHash("sha256").update(id).digest("hex").slice(0, 40)}`, "allocation machine id");
}
