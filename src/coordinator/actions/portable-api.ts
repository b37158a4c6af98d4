/** The portable access surface the HTTP layer calls (implemented in grants.ts). */
import type { Principal } from "../auth.js";
import type { borrowPortable, ChosenGrant, PortableBorrowBody } from "./grant-borrow.js";

export interface PortableApi {
  borrow(p: Principal, pool: string, body: PortableBorrowBody, chosen: ChosenGrant | null): ReturnType<typeof borrowPortable>;
  ack(p: Principal, grantId: string, body: { token: string; grantToken: string; publicKey: string }): Promise<unknown>;
  heartbeat(p: Principal, grantId: string, body: { token: string; grantToken?: string }): Promise<unknown>;
  return(p: Principal, grantId: string, body: { token: string; grantToken?: string; disposition: "ready" | "drain" }): Promise<unknown>;
  show(p: Principal, grantId: string): Promise<unknown>;
}
