/**
 * OpenSSH public key lines: accepted types, each refusal, and fingerprints
 * that agree with `ssh-keygen -lf` (the real tool, where installed).
 */
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import ssh2 from "ssh2";
import { fingerprintOf, parsePublicKey } from "../../src/core/ssh-public-key.js";
import { BerthError } from "../../src/core/errors.js";

const ed = ssh2.utils.generateKeyPairSync("ed25519", { comment: "alice@laptop" }).public;
const ecdsa = ssh2.utils.generateKeyPairSync("ecdsa", { bits: 256 }).public;
const rsa = ssh2.utils.generateKeyPairSync("rsa", { bits: 2048 }).public;

function sshKeygenFingerprint(line: string): string | null {
  const dir = mkdtempSync(join(tmpdir(), "berth-key-"));
  try {
    writeFileSync(join(dir, "k.pub"), line + "\n");
    return execFileSync("ssh-keygen", ["-lf", join(dir, "k.pub")], { encoding: "utf8" }).split(" ")[1]!;
  } catch {
    return null;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** A line whose blob names `blobType` while the line says `lineType`. */
function blobLine(lineType: string, blobType: string, extra = Buffer.alloc(8)): string {
  const t = Buffer.from(blobType, "latin1");
  const len = Buffer.alloc(4);
  len.writeUInt32BE(t.length);
  return `${lineType} ${Buffer.concat([len, t, extra]).toString("base64")}`;
}

describe("parsePublicKey: accepted lines", () => {
  const cases: Array<[string, string, string]> = [
    ["ed25519 with a comment", ed, "ssh-ed25519"],
    ["ecdsa-sha2-nistp256", ecdsa, "ecdsa-sha2-nistp256"],
    ["rsa", rsa, "ssh-rsa"],
    ["surrounded by whitespace, comment dropped", `  ${ed}  \n`, "ssh-ed25519"],
    ["a security-key type whose blob agrees", blobLine("sk-ssh-ed25519@openssh.com", "sk-ssh-ed25519@openssh.com"), "sk-ssh-ed25519@openssh.com"],
  ];
  for (const [label, line, type] of cases) {
    it(`${label}: type, canonical line without comment, fingerprint as ssh-keygen prints it`, (t) => {
      const k = parsePublicKey(line);
      assert.equal(k.type, type);
      const [lt, b64] = line.trim().split(/\s+/);
      assert.equal(k.line, `${lt} ${b64}`);
      assert.equal(k.fingerprint, fingerprintOf(Buffer.from(b64!, "base64")));
      assert.match(k.fingerprint, /^SHA256:[A-Za-z0-9+/]{43}$/);
      if (type.startsWith("sk-")) return;
      const fromTool = sshKeygenFingerprint(line.trim());
      if (fromTool === null) return t.skip("ssh-keygen is not installed");
      assert.equal(k.fingerprint, fromTool);
    });
  }
});

describe("parsePublicKey: refusals (400 invalid_request, naming the fault)", () => {
  const cases: Array<[string, unknown, string]> = [
    ["not a string", 42, "is not a string"],
    ["too long", "ssh-ed25519 " + "A".repeat(16_400), "is too long"],
    ["an unsupported type", ed.replace("ssh-ed25519", "ssh-dss"), 'has an unsupported key type "ssh-dss"'],
    ["an empty line", "", 'has an unsupported key type ""'],
    ["no blob", "ssh-ed25519", "has no base64 key blob"],
    ["a blob that is not base64", "ssh-ed25519 not*base64", "has no base64 key blob"],
    ["a truncated blob", "ssh-ed25519 AAA=", "has a truncated key blob"],
    ["a blob of another type than the line", blobLine("ssh-ed25519", "ssh-rsa"), "has a key blob whose type does not match the line"],
    ["a blob whose length field runs past its end", `ssh-ed25519 ${Buffer.from([0, 0, 1, 0, 65]).toString("base64")}`, "has a key blob whose type does not match the line"],
    ["a private key pasted by mistake", "-----BEGIN OPENSSH PRIVATE KEY-----", "has an unsupported key type"],
  ];
  for (const [label, line, why] of cases) {
    it(`${label}`, () => {
      assert.throws(
        () => parsePublicKey(line),
        (e: unknown) => e instanceof BerthError && e.code === "invalid_request" && e.status === 400 && e.message.includes(`publicKey ${why}`),
      );
    });
  }
  it("[I8] a refusal never repeats the key material it was given", () => {
    const secretish = "ssh-ed25519 " + "Zm9vYmFy".repeat(4) + "!";
    assert.throws(() => parsePublicKey(secretish), (e: unknown) => e instanceof BerthError && !e.message.includes("Zm9vYmFy"));
  });
});
