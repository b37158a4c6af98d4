/** Durations on the command line and in configuration: parse and format, case by case. */
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { formatDuration, parseDuration } from "../../src/core/durations.js";
import { BerthError } from "../../src/core/errors.js";

describe("parseDuration", () => {
  const ok: Array<[string, number]> = [
    ["1500", 1_500],
    ["250ms", 250],
    ["90s", 90_000],
    ["10m", 600_000],
    ["2h", 7_200_000],
    ["30d", 2_592_000_000],
    [" 5m ", 300_000],
    ["0", 0],
    ["999999999", 999_999_999],
  ];
  for (const [input, ms] of ok) {
    it(`${JSON.stringify(input)} is ${ms} ms`, () => {
      assert.equal(parseDuration(input), ms);
    });
  }
  const bad = ["", "m", "-5m", "1.5h", "10 m", "10M", "5w", "1000000000", "1e3", "10mm"];
  for (const input of bad) {
    it(`${JSON.stringify(input)} is refused with invalid_request naming what was parsed`, () => {
      assert.throws(
        () => parseDuration(input, "--duration"),
        (e: unknown) => e instanceof BerthError && e.code === "invalid_request" && e.status === 400 && e.message.includes("--duration") && e.message.includes(JSON.stringify(input)),
      );
    });
  }
});

describe("formatDuration", () => {
  const cases: Array<[number, string]> = [
    [2 * 86_400_000, "2d"],
    [3 * 3_600_000, "3h"],
    [25 * 3_600_000, "25h"],
    [10 * 60_000, "10m"],
    [90_000, "90s"],
    [0, "0s"],
    [1_500, "1500ms"],
    [1, "1ms"],
  ];
  for (const [ms, text] of cases) {
    it(`${ms} ms is ${text}, and parses back`, () => {
      assert.equal(formatDuration(ms), text);
      assert.equal(parseDuration(text), ms);
    });
  }
});
