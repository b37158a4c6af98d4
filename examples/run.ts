/**
 * A runnable example of the client library: what `berth run` does, in-process.
 *
 *   berth up                              # in another terminal, from this directory
 *   npm run build && node dist/examples/run.js
 *
 * It borrows a machine from the `default` pool, runs two commands on it over
 * one SSH connection (the second one reads stdin), gives the machine back,
 * then does a whole borrow → run → return in one call, with a timeout.
 */
import { BerthClient } from "berth";

const client = BerthClient.fromConfig(); // .berth/client.json, BERTH_URL/BERTH_TOKEN_FILE, or ~/.config/berth/client.json
try {
  const b = await client.borrow({ pool: "default", waitMs: 5_000 });
  console.log(`borrowed ${b.machine.id}; hard deadline ${new Date(b.expiresAt).toISOString()}`);
  try {
    const uname = await client.exec(b, ["uname", "-sm"]);
    console.log(`uname: ${uname.stdout!.toString().trim()} (exit ${uname.status})`);
    const wc = await client.exec(b, "wc -l", { stdin: "one\ntwo\nthree\n" });
    console.log(`lines counted remotely: ${wc.stdout!.toString().trim()}`);
  } finally {
    const back = await client.return(b);
    console.log(`returned: machine ${back.state}`);
  }

  // One call; the machine goes back on every way out, also when the signal aborts the command.
  const r = await client.run({
    pool: "default",
    command: ["sh", "-c", "echo hello from $(hostname); exit 3"],
    stdout: process.stdout,
    stderr: process.stderr,
    signal: AbortSignal.timeout(30_000),
  });
  console.log(`run: exit ${r.status}, machine returned: ${r.returned ? r.returned.state : `no (${String(r.returnError)})`}`);
} finally {
  await client.close();
}
