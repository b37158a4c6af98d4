/** `berth token create|revoke|ls`: API tokens, managed directly on the coordinator's store. */
import type { Command } from "commander";
import { Option } from "commander";
import { randomBytes } from "node:crypto";
import { resolve } from "node:path";
import { createToken, listApiTokens, revokeTokenWithGrants } from "../../store/api-tokens.js";
import { ROLES, type Role } from "../../core/roles.js";
import { isId } from "../../core/ids.js";
import { BerthError } from "../../core/errors.js";
import { durationArg, iso, openStoreFromFlags, printJson, printTable, runCommand } from "../common.js";
import { writeFileDurable } from "../../io/durable-file.js";

export function register(program: Command): void {
  const token = program.command("token").description("Create, list and revoke API tokens (runs against the coordinator's store directly)");
  const storeOpts = (c: Command) =>
    c
      .option("--state-dir <dir>", "coordinator state directory", ".berth")
      .option("--db <file>", "SQLite database file (or set BERTH_PG_URL)")
      .option("--init", "create the coordinator database if there is none (else a directory without one is refused)", false);

  storeOpts(
    token
      .command("create")
      .description("Create an API token; it is shown once (stored only as a hash)")
      .requiredOption("--org <org>", "organisation the token acts in")
      .addOption(new Option("--role <role>", "what the token may do").choices(ROLES as unknown as string[]).default("member"))
      .option("--expires <duration>", "lifetime, e.g. 30d or 12h (default: no expiry)", durationArg("--expires"))
      .option("--label <text>", "a note for `token ls`")
      .option("--out <file>", "write the token to this file (0600) instead of stdout")
      .option("--json", "print JSON", false),
  ).action((o: { org: string; role: Role; expires?: number; label?: string; out?: string; json: boolean; stateDir: string; db?: string; init: boolean }) =>
    runCommand(async () => {
      if (!isId(o.org)) throw new BerthError("invalid_id", `invalid_id: --org ${JSON.stringify(o.org)} is not a valid id`);
      const store = await openStoreFromFlags(o);
      try {
        const now = Date.now();
        const t = await createToken(store, { org: o.org, role: o.role, expiresAt: o.expires ? now + o.expires : null, label: o.label ?? null }, now, (n) => randomBytes(n));
        if (o.out) writeFileDurable(resolve(o.out), t.token + "\n", 0o600);
        if (o.json) printJson({ id: t.id, org: t.org, role: t.role, expiresAt: t.expiresAt, ...(o.out ? { file: resolve(o.out) } : { token: t.token }) });
        else if (o.out) process.stdout.write(`token ${t.id} (${t.role} in ${t.org}) written to ${resolve(o.out)}\n`);
        else process.stdout.write(t.token + "\n");
        return 0;
      } finally {
        await store.close();
      }
    }),
  );

  storeOpts(token.command("revoke").description("Revoke a token at once; its live portable grants are invalidated").argument("<id>", "token id (tok_…)")).action(
    (id: string, o: { stateDir: string; db?: string; init: boolean }) =>
      runCommand(async () => {
        const store = await openStoreFromFlags(o);
        try {
          const r = await revokeTokenWithGrants(store, id, Date.now());
          if (!r.revoked) throw new BerthError("not_found", `not_found: no live token ${id}`);
          process.stdout.write(`revoked ${id}${r.grants ? `; ${r.grants} live grant(s) invalidated` : ""}\n`);
          return 0;
        } finally {
          await store.close();
        }
      }),
  );

  storeOpts(token.command("ls").description("List tokens (ids and roles; never the tokens)").option("--json", "print JSON", false)).action(
    (o: { stateDir: string; db?: string; init: boolean; json: boolean }) =>
      runCommand(async () => {
        const store = await openStoreFromFlags(o);
        try {
          const rows = await listApiTokens(store);
          if (o.json) printJson(rows);
          else printTable(["ID", "ORG", "ROLE", "CREATED", "EXPIRES", "REVOKED", "LABEL"], rows.map((r) => [r.id, r.org, r.role, iso(r.created_at), iso(r.expires_at), iso(r.revoked_at), r.label]));
          return 0;
        } finally {
          await store.close();
        }
      }),
  );
}
