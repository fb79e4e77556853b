/**
 * A queue with payloads ({ payloads: true }) against real servers: pushPayloads, claims that
 * bring each job's payload byte for byte, and acks that delete them (ackp; a claim's whole
 * batch acked by naming its packed element), as the Python client's queue does. Python and
 * Node on one such queue: tests/test_interop.py.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import type Redis from "ioredis";
import { InvalidArgument, type Job, NotTracked, Rotator, Topic } from "../dist/index";
import { KINDS, commandStat, serveTests, uniqueName } from "./servers";

const BINARY = Buffer.from([0x80, 0x00, 0xff, 0x2a]); // not UTF-8, with a NUL and a "*"

for (const kind of KINDS) {
  describe(`a queue with payloads on ${kind}`, () => {
    let redis: Redis;
    const queues: Rotator[] = [];
    serveTests(kind, (client) => (redis = client), queues);
    const queue = (label: string, options: ConstructorParameters<typeof Rotator>[2] = {}): Rotator => {
      const made = new Rotator(redis, uniqueName(label), { payloads: true, ...options });
      queues.push(made);
      return made;
    };

    test("each job comes with its payload, byte for byte; an ack deletes it", async () => {
      const q = queue("basic");
      assert.equal(await q.pushPayloads({ a: "{\"n\":1}", b: BINARY, c: "" }), 3);
      assert.equal(await q.pushPayloads(new Map([[4, "four"]])), 1);
      assert.equal(await q.pushPayloads([["e", "é"]]), 1);
      const jobs = await q.next({ count: 10 });
      assert.deepEqual(jobs.map((job) => job.id), ["a", "b", "c", "4", "e"]);
      assert.equal(jobs[0]?.payload, "{\"n\":1}");
      assert.ok(jobs[1]?.payloadBuffer?.equals(BINARY));
      assert.equal(jobs[2]?.payload, "");
      assert.equal(jobs[4]?.payload, "é");
      assert.equal(await redis.hlen(q.keys.payloads), 5);
      const calls = async (): Promise<number> => commandStat(await redis.info("commandstats"), "fcall");
      const before = await calls();
      assert.equal(await q.ack(...jobs), 5);
      assert.equal((await calls()) - before, 1); // one ackp naming the batch
      assert.equal(await redis.hlen(q.keys.payloads), 0);
      const stats = await q.stats();
      assert.equal(stats.done + stats.completed, 5); // (its element goes at the next walk)
    });

    test("a loop whose claims ack the batch before leaves no payload behind", async () => {
      const q = queue("loop");
      const items = Array.from({ length: 250 }, (_, n) => [`j${n}`, `body ${n}`] as const);
      assert.equal(await q.pushPayloads(items), 250);
      const seen: Job[] = [];
      let held: Job[] = [];
      while ((held = await q.next({ count: 40, ack: held })).length > 0) seen.push(...held);
      assert.equal(await q.ack(...held), 0); // (the last claim found nothing)
      assert.deepEqual(
        seen.map((job) => [job.id, job.payload]),
        items.map(([id, body]) => [id, body]),
      );
      assert.equal(await redis.hlen(q.keys.payloads), 0);
      const stats = await q.stats();
      assert.equal(stats.completed, 250);
    });

    test("a job given back comes again with its payload; one acked by its token drops it", async () => {
      const q = queue("nack");
      await q.pushPayloads({ x: "ex", y: "why" });
      const [x, y] = await q.next({ count: 2 });
      assert.equal(await q.nack(x!), 1);
      const [again] = await q.next({ count: 1 });
      assert.deepEqual([again?.id, again?.payload, again?.deliveries], ["x", "ex", 2]);
      assert.equal(await q.ack(y!), 1); // its batch was broken up: acked by token
      assert.deepEqual(await redis.hkeys(q.keys.payloads), ["x"]);
      assert.equal(await q.ack(again!), 1);
      assert.equal(await redis.hlen(q.keys.payloads), 0);
    });

    test("scheduled and unique pushes of payloads, as push takes them", async () => {
      const q = queue("later");
      assert.equal(await q.pushPayloads({ soon: "s" }, { delay: 60 }), 1);
      assert.equal(await redis.hget(q.keys.payloads, "soon"), "s"); // stored now
      assert.equal((await q.stats()).scheduled, 1);
      const tracked = queue("unique");
      await assert.rejects(tracked.pushPayloads({ a: "1" }, { unique: true }), NotTracked);
      await tracked.configure({ trackIds: true });
      assert.equal(await tracked.pushPayloads({ a: "1", b: "2" }, { unique: true }), 2);
      assert.equal(await tracked.pushPayloads({ a: "again", c: "3" }, { unique: true }), 1);
      assert.equal(await redis.hget(tracked.keys.payloads, "a"), "1"); // a held job keeps its own
    });

    test("work() hands each job its payload and leaves none behind", async () => {
      const q = queue("work");
      await q.pushPayloads(Object.fromEntries(Array.from({ length: 30 }, (_, n) => [`w${n}`, `p${n}`])));
      const got = new Map<string, string | null | undefined>();
      const summary = await q.work(async (job) => void got.set(job.id, job.payload), {
        concurrency: 4,
        poll: 0.1,
        stopWhenEmpty: true,
      });
      assert.equal(summary.completed, 30);
      assert.equal(got.get("w7"), "p7");
      assert.equal(got.size, 30);
      assert.equal(await redis.hlen(q.keys.payloads), 0);
    });

    test("delete removes the payloads; bad input is refused before anything is sent", async () => {
      const q = queue("delete");
      await q.pushPayloads({ a: "1" });
      assert.equal(await q.delete(), true);
      assert.equal(await redis.exists(q.keys.payloads), 0);
      const plain = new Rotator(redis, uniqueName("plain"));
      await assert.rejects(plain.pushPayloads({ a: "1" }), InvalidArgument);
      const bad = queue("bad");
      await assert.rejects(bad.pushPayloads({ a: 1 as unknown as string }), InvalidArgument);
      await assert.rejects(bad.pushPayloads({ "a*b": "1" }), (e: unknown) => e instanceof Error && e.name === "InvalidJobId");
      await assert.rejects(bad.pushPayloads({ a: "1" }, { priority: 2 } as never), InvalidArgument);
      const group = new Topic(redis, uniqueName("topic")).group("g");
      await assert.rejects(group.pushPayloads({ a: "1" }), InvalidArgument);
      assert.equal(await redis.exists(...bad.keys.all, bad.keys.payloads), 0);
    });
  });
}
