/**
 * The SSH leg's connect settles whatever the peer does: a gateway that sends
 * its version line and then closes mid-handshake (an agent SIGKILLed at that
 * moment) makes ssh2 clear its ready timer without reporting an error; the
 * connect must still reject, at once, with `provider_unavailable`. A peer
 * that never says anything is bounded by the ready timeout.
 */
import { test, describe } from "node:test";
import assert from "node:assert/strict";
import { createServer, type Server, type Socket } from "node:net";
import { connect } from "../../src/client/ssh.js";
import { BerthError } from "../../src/core/errors.js";
import { generateSshKeyPair } from "../../src/core/ssh-keys.js";

const HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl";

function privateKey(): string {
  return generateSshKeyPair().privateKey;
}

async function listen(onSocket: (s: Socket) => void): Promise<{ server: Server; port: number; sockets: Socket[] }> {
  const sockets: Socket[] = [];
  const server = createServer((s) => {
    sockets.push(s);
    onSocket(s);
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return { server, port: (server.address() as { port: number }).port, sockets };
}

async function close(l: { server: Server; sockets: Socket[] }): Promise<void> {
  for (const s of l.sockets) s.destroy();
  await new Promise((r) => l.server.close(r));
}

describe("SSH connect against a peer that goes away", { timeout: 30_000 }, () => {
  test("version line, then the connection closes during key exchange: rejected with provider_unavailable", async () => {
    let sawClientData = false;
    const l = await listen((s) => {
      s.write("SSH-2.0-OpenSSH_9.2\r\n");
      s.once("data", () => {
        sawClientData = true;
        // The client's version line and key-exchange offer arrived; the "agent" dies now.
        s.end();
      });
    });
    try {
      const err = await connect({ host: "127.0.0.1", port: l.port, user: "u", hostKey: HOST_KEY, privateKey: privateKey() }, { timeoutMs: 20_000 }).then(
        () => assert.fail("connect resolved against a peer that closed"),
        (e: unknown) => e,
      );
      assert.ok(sawClientData, "the client reached the peer");
      assert.ok(err instanceof BerthError);
      assert.equal(err.code, "provider_unavailable");
      assert.match(err.message, /closed before authentication finished|Connection lost/);
    } finally {
      await close(l);
    }
  });

  test("a peer that accepts and never speaks: rejected when the ready timeout passes", async () => {
    const l = await listen(() => undefined);
    try {
      await assert.rejects(
        connect({ host: "127.0.0.1", port: l.port, user: "u", hostKey: HOST_KEY, privateKey: privateKey() }, { timeoutMs: 300 }),
        (e: unknown) => e instanceof BerthError && e.code === "provider_unavailable",
      );
    } finally {
      await close(l);
    }
  });
});
