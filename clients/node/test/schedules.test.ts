/**
 * Recurring interval schedules from Node against real servers: declared, fired by claims
 * (one job a tick), read, replaced and forgotten, as the Python client's; a Python client's
 * cron schedule read here: tests/test_interop.py.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import type Redis from "ioredis";
import { InvalidArgument, InvalidJobId, Rotator, decodeSchedules, formatG } from "../dist/index";
import { KINDS, serveTests, uniqueName } from "./servers";

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

test("a spec's seconds are written as Python's %g writes them", () => {
  const cases: Array<[number, string]> = [
    [60, "60"], [0.5, "0.5"], [86400, "86400"], [1e6, "1e+06"], [1234567, "1.23457e+06"],
    [0.001, "0.001"], [999999.5, "1e+06"], [123.456789, "123.457"], [315360000, "3.1536e+08"],
  ];
  for (const [value, written] of cases) assert.equal(formatG(value), written, String(value));
});

test("a cron schedule's spec is split into its expression and zone", () => {
  const [cron, plain] = decodeSchedules([
    "nightly", "report", "0", "0 3 * * *;Europe/Paris", "1800000000000", "0", "256", "1900000000000",
    "tick", "tick", "60000", "every 60s", "1800000060000", "1800000000000", "0", "-1",
  ]);
  assert.deepEqual(cron, {
    name: "nightly", spec: "0 3 * * *", nextDue: 1800000000, lastRun: null, jobId: "report",
    every: null, cron: "0 3 * * *", tz: "Europe/Paris", duesLeft: 256, duesUntil: 1900000000,
  });
  assert.deepEqual(plain, {
    name: "tick", spec: "every 60s", nextDue: 1800000060, lastRun: 1800000000, jobId: "tick",
    every: 60, cron: null, tz: null, duesLeft: null, duesUntil: null,
  });
});

for (const kind of KINDS) {
  describe(`schedules on ${kind}`, () => {
    let redis: Redis;
    serveTests(kind, (client) => (redis = client));

    test("a claim fires each tick once; declaring it again changes nothing", async () => {
      const q = new Rotator(redis, uniqueName("every"));
      assert.equal(await q.schedule("heartbeat", { every: 0.2, jobId: "beat" }), true);
      assert.equal(await q.schedule("heartbeat", { every: 0.2, jobId: "beat" }), false);
      const [found] = await q.schedules();
      assert.equal(found?.spec, "every 0.2s");
      assert.equal(found?.every, 0.2);
      assert.equal(found?.lastRun, null);
      assert.deepEqual(await q.next({ count: 5 }), []); // not due yet
      await sleep(300);
      const jobs = await q.next({ count: 5 });
      assert.equal(jobs.length, 1);
      assert.match(jobs[0]!.id, /^beat@\d+$/);
      assert.ok((await q.schedules())[0]!.lastRun !== null);
      assert.equal(await q.schedule("heartbeat", { every: 60, jobId: "beat" }), true); // replaced
      assert.equal((await q.schedules())[0]?.every, 60);
      assert.equal(await q.unschedule("heartbeat"), true);
      assert.equal(await q.unschedule("heartbeat"), false);
      assert.deepEqual(await q.schedules(), []);
    });

    test("bad input is refused before anything is sent", async () => {
      const q = new Rotator(redis, uniqueName("bad"));
      await assert.rejects(q.schedule("a b", { every: 1 }), InvalidArgument);
      await assert.rejects(q.schedule("ok", { every: 0 }), InvalidArgument);
      await assert.rejects(q.schedule("ok", { every: Number.NaN }), InvalidArgument);
      await assert.rejects(q.schedule("ok", { every: "5" as unknown as number }), InvalidArgument);
      await assert.rejects(q.schedule("ok", { every: 1, jobId: "a*b" }), InvalidJobId);
      await assert.rejects(q.schedule("ok", { every: 1, jobId: "x".repeat(1009) }), InvalidJobId);
      await assert.rejects(q.unschedule(""), InvalidArgument);
      assert.equal(await redis.exists(...q.keys.all), 0);
    });
  });
}
