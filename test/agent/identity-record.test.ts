/**
 * The switch record file (src/agent/identity/record.ts) on a real directory,
 * its file system calls failing where a test says, and the floor.
 */
import { after, describe, it } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, readdirSync, writeFileSync, unlinkSync } from "node:fs";
import { join } from "node:path";
import { RecordFile, RECORD_FILE, parseRecord, readRecord, type FaultPoint } from "../../src/agent/identity/record.js";
import { checkFloor, claimFloor, compareVersions, floorClaimed, FloorRefusedError } from "../../src/agent/identity/floor.js";
import { AgentStore } from "../../src/agent/store/store.js";
import { tempDir } from "../helpers/env.js";

const tmp = tempDir("berth-record-");
after(() => tmp.cleanup());
let n = 0;
const dir = () => {
  const d = join(tmp.path, String(n++));
  AgentStore.open(d).close();
  return d;
};

describe("the switch record", () => {
  it("is written whole as {schemaVersion, step, stopped} and read back", () => {
    const d = dir();
    const f = new RecordFile(d);
    assert.equal(f.record, null);
    f.write({ step: "local", stopped: [{ machineId: "m_1", generation: 2 }] });
    assert.equal(f.durable, true);
    assert.deepEqual(JSON.parse(readFileSync(join(d, RECORD_FILE), "utf8")), { schemaVersion: 1, step: "local", stopped: [{ machineId: "m_1", generation: 2 }] });
    assert.deepEqual(new RecordFile(d).record, { step: "local", stopped: [{ machineId: "m_1", generation: 2 }] });
    assert.deepEqual(readdirSync(d).filter((x) => x.endsWith(".tmp")), [], "no temp file left");
  });

  it("a truncated, garbage, wrong-version or unreadable record counts as local (damaged), never as none", () => {
    for (const text of ["", '{"schemaVersion":1,"step":"act', "garbage", '{"schemaVersion":2,"step":"active","stopped":[]}', '{"schemaVersion":1,"step":"legacy","stopped":[]}', '{"schemaVersion":1,"step":"active","stopped":[{"machineId":"../x","generation":1}]}']) {
      assert.deepEqual(parseRecord(text), { step: "local", stopped: [], damaged: true }, JSON.stringify(text));
    }
    const d = dir();
    writeFileSync(join(d, RECORD_FILE), "\0\0\0");
    assert.equal(readRecord(join(d, RECORD_FILE))?.step, "local");
  });

  it("a failed rename leaves no record and throws; a failed directory sync leaves the record in place but not durable until a sync succeeds", () => {
    const d = dir();
    const failing = new Set<FaultPoint>(["rename"]);
    const f = new RecordFile(d, { fail: (p) => failing.has(p) });
    assert.throws(() => f.write({ step: "local", stopped: [] }), /injected rename failure/);
    assert.equal(f.record, null);
    assert.equal(readRecord(join(d, RECORD_FILE)), null);
    assert.deepEqual(readdirSync(d).filter((x) => x.endsWith(".tmp")), []);

    failing.clear();
    failing.add("dirsync");
    assert.throws(() => f.write({ step: "local", stopped: [] }), /injected dirsync failure/);
    assert.equal((f.record as { step: string } | null)?.step, "local", "renamed into place: it is the record");
    assert.equal(f.durable, false);
    assert.throws(() => f.ensureDurable(), /dirsync/, "still cannot be proven");
    assert.equal(f.durable, false);
    failing.clear();
    assert.equal(f.ensureDurable(), true);
    assert.equal(f.durable, true);
  });

  it("a record found at boot is synced before it counts; one removed or replaced since is written again from memory", () => {
    const d = dir();
    new RecordFile(d).write({ step: "cloud", stopped: [{ machineId: "m_2", generation: 0 }] });
    const f = new RecordFile(d);
    assert.equal(f.durable, false, "found at boot: not known durable yet");
    assert.equal(f.ensureDurable(), true);

    const g = new RecordFile(d);
    unlinkSync(join(d, RECORD_FILE));
    assert.equal(g.ensureDurable(), true);
    assert.equal(readRecord(join(d, RECORD_FILE))?.step, "cloud", "written again from memory");

    const h = new RecordFile(d);
    writeFileSync(join(d, RECORD_FILE), "garbage");
    h.ensureDurable();
    assert.deepEqual(readRecord(join(d, RECORD_FILE)), { step: "cloud", stopped: [{ machineId: "m_2", generation: 0 }] });
  });
});

describe("the floor", () => {
  it("claimed: an older version refuses the state directory, and a store written before host identity refuses it too", () => {
    const d = dir();
    const store = AgentStore.open(d);
    try {
      assert.equal(floorClaimed(d, store), false);
      claimFloor(d, store, "1.2.3");
      claimFloor(d, store, "1.2.3"); // idempotent
      assert.equal(floorClaimed(d, store), true);
    } finally {
      store.close();
    }
    assert.throws(() => checkFloor(d, "1.2.2"), (e: Error) => e instanceof FloorRefusedError && /identity_floor: .* needs berth agent 1\.2\.3 or newer/.test(e.message));
    checkFloor(d, "1.2.3");
    checkFloor(d, "1.10.0");
    // This build reopens its store with the floor mark kept; builds before it refuse a migration they do not know.
    const again = AgentStore.open(d);
    try {
      assert.equal(floorClaimed(d, again), true);
      const names = again.db.prepare("SELECT name FROM schema_migrations").all() as Array<{ name: string }>;
      assert.deepEqual(names, [{ name: "identity_floor" }]);
    } finally {
      again.close();
    }
    assert.ok(compareVersions("0.10.0", "0.9.9") > 0);
  });
});
