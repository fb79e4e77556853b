/** Topics against real servers: Redis 7 and Valkey 8, each started here. */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import type Redis from "ioredis";
import {
  GroupsChanged,
  InvalidArgument,
  InvalidQueueName,
  Topic,
  TopicGroup,
  messageSeq,
  retentionArgs,
  topicKeys,
} from "../dist/index";
import { KINDS, commandStat, serveTests, uniqueName } from "./servers";

/** Module calls so far, by EVALSHA and FCALL, from INFO commandstats. */
function moduleCalls(info: string): number {
  return commandStat(info, "evalsha") + commandStat(info, "fcall");
}

for (const kind of KINDS) {
  describe(`Topic on ${kind}`, () => {
    let redis: Redis;
    const groups: TopicGroup[] = [];
    serveTests(kind, (client) => (redis = client), groups);
    const consumer = (topic: Topic, group: string, options: { timeout?: number; functions?: boolean } = {}): TopicGroup => {
      const made = topic.group(group, options);
      groups.push(made);
      return made;
    };

    test("keys are built as rotator/keys.py builds them", () => {
      const t = new Topic(redis, "news");
      assert.deepEqual(t.keys.all, [
        "rotator:{news}:topic:meta",
        "rotator:{news}:topic:groups",
        "rotator:{news}:topic:log",
        "rotator:{news}:topic:bodies",
      ]);
      const g = t.groupKeys("mail");
      assert.equal(g.all.length, 13);
      assert.equal(g.all[0], "rotator:{news}:group:mail:ring");
      assert.equal(g.all[12], "rotator:{news}:group:mail:ids");
      assert.equal(g.payloads, "rotator:{news}:topic:bodies");
      assert.deepEqual(topicKeys("news", "p").all[0], "p:{news}:topic:meta");
      assert.throws(() => t.group("a:b"), InvalidQueueName);
      assert.throws(() => new Topic(redis, "a}b"), InvalidQueueName);
    });

    test("retention: a count, an age, or both; never neither", () => {
      assert.deepEqual(retentionArgs({}), [100_000, 0]);
      assert.deepEqual(retentionArgs({ age: 60 }), [100_000, 60_000]);
      assert.deepEqual(retentionArgs({ count: null, age: 1.5 }), [0, 1500]);
      assert.deepEqual(retentionArgs({ count: 5, age: null }), [5, 0]);
      assert.throws(() => new Topic(redis, "x", { retention: { count: null } }), InvalidArgument);
      assert.throws(() => retentionArgs({ count: 0 }), InvalidArgument);
      assert.throws(() => retentionArgs({ count: 1.5 }), InvalidArgument);
      assert.equal(messageSeq("1732233600000-42"), 42);
      assert.throws(() => messageSeq("42"), InvalidArgument);
    });

    test("publish reaches every registered group once; each group consumes with payloads", async () => {
      const t = new Topic(redis, uniqueName("topic"));
      assert.equal(await t.exists(), false);
      assert.equal(await t.subscribe("mail"), true);
      assert.equal(await t.subscribe("mail"), false);
      assert.equal(await t.subscribe("audit"), true);
      assert.deepEqual(await t.groups(), ["audit", "mail"]);
      const ids = await t.publish("hello", Buffer.from("wörld"));
      assert.equal(ids.length, 2);
      assert.match(ids[0] as string, /^[0-9]+-1$/);
      assert.equal(messageSeq(ids[1] as string), 2);
      for (const name of ["mail", "audit"]) {
        const g = consumer(t, name);
        const jobs = await g.next({ count: 10 });
        assert.deepEqual(jobs.map((job) => job.id), ids);
        assert.deepEqual(jobs.map((job) => job.payload), ["hello", "wörld"]);
        assert.deepEqual(await g.next({ count: 10 }), []);
        assert.equal(await g.ack(...jobs), 2);
      }
      const stats = await t.stats();
      assert.equal(stats.retained, 2);
      assert.equal(stats.bytes, 5 + Buffer.byteLength("wörld"));
      assert.equal(stats.lastSeq, 2);
      assert.deepEqual(Object.keys(stats.groups), ["audit", "mail"]);
      assert.deepEqual(stats.groups["mail"], {
        length: stats.groups["mail"]?.length,
        pending: 0,
        inFlight: 0,
        done: stats.groups["mail"]?.done,
        deferred: 0,
        dead: 0,
        oldestPendingAgeMs: -1,
        overdue: 0,
        overdueCapped: false,
      });
      // Acks keep the payloads: retention owns them.
      assert.equal(await redis.hlen(t.keys.all[3] as string), 2);
      assert.equal(await t.exists(), true);
      await t.delete();
      assert.equal(await t.exists(), false);
      assert.equal(await redis.exists(t.groupKeys("mail").all[0] as string), 0);
    });

    test("instances of one group share its messages; next acks in the same call", async () => {
      const t = new Topic(redis, uniqueName("share"));
      await t.subscribe("workers");
      const ids = await t.publish(...Array.from({ length: 10 }, (_, i) => `m${i}`));
      const a = consumer(t, "workers");
      const b = consumer(t, "workers");
      const first = await a.next({ count: 4 });
      const second = await b.next({ count: 10 });
      assert.deepEqual([...first, ...second].map((job) => job.id), ids);
      const more = await a.next({ count: 1, ack: first });
      assert.deepEqual(more, []);
      assert.equal((await t.stats()).groups["workers"]?.inFlight, 6);
      assert.equal(await b.ack(...second), 6);
      assert.equal((await t.stats()).groups["workers"]?.inFlight, 0);
    });

    test("a claim's batch comes packed with its payloads, and is acked whole by one batch ack", async () => {
      const t = new Topic(redis, uniqueName("packed"));
      await t.subscribe("g");
      const ids = await t.publish("p0", "p1", "p2");
      const g = consumer(t, "g");
      const [nacked] = await g.next({ count: 1 });
      const [first] = await g.next({ count: 1 });
      assert.equal(await g.nack(nacked!), 1); // the oldest lease: the next walk reaches it
      const jobs = await g.next({ count: 10 }); // the packed batch, then the later delivery
      assert.deepEqual(jobs.map((job) => [job.id, job.payload, job.deliveries]), [
        [ids[2], "p2", 1],
        [ids[0], "p0", 2],
      ]);
      assert.equal(jobs[0]?.token, `${ids[2]}*${jobs[0]?.token.split("*")[1]}`);
      const before = moduleCalls(await redis.info("commandstats"));
      assert.equal(await g.ack(first!, ...jobs), 3);
      const after = moduleCalls(await redis.info("commandstats"));
      assert.equal(after - before, 1); // the batch acks were all accepted: no token-by-token retry
      assert.equal((await t.stats()).groups["g"]?.inFlight, 0);
    });

    test("nack gives a message back, with its payload, to the next claim", async () => {
      const t = new Topic(redis, uniqueName("nack"));
      await t.subscribe("g");
      const [id] = await t.publish("body");
      const g = consumer(t, "g");
      const [job] = await g.next();
      assert.equal(job?.id, id);
      assert.equal(await g.nack(job!), 1);
      const [again] = await g.next();
      assert.equal(again?.id, id);
      assert.equal(again?.payload, "body");
      assert.equal(again?.deliveries, 2);
      assert.equal(await g.ack(again!), 1);
      assert.equal(await g.ack(job!), 0); // the first lease is gone
    });

    test("a blocked next wakes on publish", async () => {
      const t = new Topic(redis, uniqueName("block"));
      await t.subscribe("g");
      const g = consumer(t, "g");
      const started = Date.now();
      const waiting = g.next({ block: 5 });
      setTimeout(() => void t.publish("late"), 200);
      const jobs = await waiting;
      assert.deepEqual(jobs.map((job) => job.payload), ["late"]);
      assert.ok(Date.now() - started < 2500, `took ${Date.now() - started} ms`);
    });

    test("payloads reach a consumer byte for byte, UTF-8 or not, whichever way the claim goes", async () => {
      // Not UTF-8, with a NUL, a "*" and a newline: decoded as UTF-8 it would come back changed.
      const bytes = Buffer.from([0x00, 0xff, 0xfe, 0x80, 0x2a, 0x0a, 0xc3, 0x28]);
      const text = "wörld ✓";
      for (const functions of [true, false]) {
        const t = new Topic(redis, uniqueName("bytes"), { functions });
        await t.subscribe("g");
        const g = consumer(t, "g", { functions });
        const before = await redis.info("commandstats");
        const [id] = await t.publish(bytes, text);
        const [first, second] = await g.next({ count: 2 }); // the packed batch's payloads
        assert.equal(first?.id, id);
        assert.ok(first?.payloadBuffer?.equals(bytes), `functions ${functions}: ${first?.payloadBuffer?.toString("hex")}`);
        assert.equal(first?.payload, bytes.toString("utf8"));
        assert.ok(second?.payloadBuffer?.equals(Buffer.from(text)));
        assert.equal(second?.payload, text);
        assert.equal(await g.nack(first!), 1);
        const [again] = await g.next(); // a later delivery: its token, flag and payload
        assert.equal(again?.deliveries, 2);
        assert.ok(again?.payloadBuffer?.equals(bytes));
        const waiting = g.next({ block: 5, ack: [again!, second!] }); // the blocked claim's pipeline
        setTimeout(() => void t.publish(bytes), 100);
        const [woken] = await waiting;
        assert.ok(woken?.payloadBuffer?.equals(bytes), `functions ${functions}, woken`);
        assert.equal(await g.ack(woken!), 1);
        const after = await redis.info("commandstats");
        const [used, unused] = functions ? ["fcall", "evalsha"] : ["evalsha", "fcall"];
        assert.ok(commandStat(after, used) - commandStat(before, used) >= 6, `${used} calls`);
        assert.equal(commandStat(after, unused), commandStat(before, unused), `no ${unused} calls`);
      }
    });

    test("a payload retention dropped comes as null, in both forms", async () => {
      const t = new Topic(redis, uniqueName("gone"), { retention: { count: 1 } });
      await t.subscribe("g");
      await t.publish(Buffer.from([0xff]), "kept");
      const jobs = await consumer(t, "g").next({ count: 2 });
      assert.deepEqual(jobs.map((job) => [job.payload, job.payloadBuffer]), [[null, null], ["kept", Buffer.from("kept")]]);
    });

    test("publish retries ROTATOR_STALE by reading the groups again", async () => {
      const name = uniqueName("stale");
      const t = new Topic(redis, name);
      const other = new Topic(redis, name);
      await t.subscribe("early");
      const read = t.groups.bind(t);
      let reads = 0;
      t.groups = async () => {
        reads += 1;
        const found = await read();
        if (reads === 1) await other.subscribe("late"); // registers between the read and the call
        return found;
      };
      const [id] = await t.publish("m");
      assert.equal(reads, 2);
      for (const group of ["early", "late"]) {
        const jobs = await consumer(t, group).next({ count: 5 });
        assert.deepEqual(jobs.map((job) => job.id), [id]);
      }
      // A raw call naming a stale set is refused as GroupsChanged, and writes nothing.
      await assert.rejects(t.call(["tpublish", 0, 60_000, "x"], t.keys.all), GroupsChanged);
      assert.equal((await t.stats()).lastSeq, 1);
      // Later publishes reuse the groups read last: no read until they change.
      reads = 0;
      await t.publish("again");
      assert.equal(reads, 0);
      await other.subscribe("g0");
      // Groups that never stop changing: publish gives up with GroupsChanged (the first of its
      // 50 attempts names the groups read before, the others read them again).
      let n = 0;
      t.groups = async () => {
        const found = await read();
        n += 1;
        await other.subscribe(`g${n}`);
        return found;
      };
      await assert.rejects(t.publish("never"), GroupsChanged);
      assert.equal(n, 49);
    });

    test("subscribe from the earliest or an id replays retained messages; replay pushes again", async () => {
      const t = new Topic(redis, uniqueName("replay"));
      const ids = await t.publish("a", "b", "c");
      assert.equal(await t.subscribe("late"), true); // latest: nothing of before
      assert.deepEqual(await consumer(t, "late").next({ count: 5 }), []);
      await t.subscribe("all", { start: "earliest" });
      const all = consumer(t, "all");
      const jobs = await all.next({ count: 5 });
      assert.deepEqual(jobs.map((job) => job.payload), ["a", "b", "c"]);
      await all.ack(...jobs);
      await t.subscribe("some", { start: ids[1] as string });
      assert.deepEqual((await consumer(t, "some").next({ count: 5 })).map((job) => job.id), ids.slice(1));
      assert.equal(await t.replay("all", { fromId: ids[2] as string }), 1);
      assert.equal(await t.replay("all", { fromTime: 0 }), 3);
      assert.deepEqual((await all.next({ count: 10 })).map((job) => job.payload), ["c", "a", "b", "c"]);
      await assert.rejects(t.replay("all", {}), InvalidArgument);
    });

    test("retention drops old messages; a group's later delivery has payload null", async () => {
      const t = new Topic(redis, uniqueName("retain"), { retention: { count: 2 } });
      await t.subscribe("slow");
      const ids = await t.publish("1", "2", "3", "4");
      const stats = await t.stats();
      assert.equal(stats.retained, 2);
      assert.equal(stats.groups["slow"]?.pending, 4); // within the bound give or take 16
      const jobs = await consumer(t, "slow").next({ count: 10 });
      assert.deepEqual(jobs.map((job) => job.id), ids);
      assert.deepEqual(jobs.map((job) => job.payload), [null, null, "3", "4"]);
      assert.equal(await t.trim(), 0);
      assert.equal(await t.expired("slow"), 0);
    });

    test("a publish of more than 1000 goes in atomic chunks, in order", async () => {
      const t = new Topic(redis, uniqueName("many"));
      await t.subscribe("g");
      const ids = await t.publish(...Array.from({ length: 2500 }, (_, i) => `p${i}`));
      assert.equal(ids.length, 2500);
      assert.deepEqual(ids.map(messageSeq), Array.from({ length: 2500 }, (_, i) => i + 1));
      assert.equal((await t.stats()).groups["g"]?.pending, 2500);
      assert.deepEqual(await t.publish(), []);
    });

    test("unsubscribe forgets a group and deletes its ring", async () => {
      const t = new Topic(redis, uniqueName("unsub"));
      await t.subscribe("a");
      await t.subscribe("b");
      await t.publish("x");
      assert.equal(await t.unsubscribe("a"), true);
      assert.equal(await t.unsubscribe("a"), false);
      assert.deepEqual(await t.groups(), ["b"]);
      assert.equal(await redis.exists(t.groupKeys("a").all[0] as string), 0);
      await t.publish("y");
      assert.deepEqual(Object.keys((await t.stats()).groups), ["b"]);
      assert.equal((await t.stats()).groups["b"]?.pending, 2);
    });
  });
}
