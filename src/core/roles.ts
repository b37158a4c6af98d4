/** API token roles, from least to most trusted (agent tokens only enroll hosts). */
export type Role = "admin" | "operator" | "member" | "agent";
export const ROLES: readonly Role[] = ["admin", "operator", "member", "agent"];
