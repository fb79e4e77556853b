/** The Rotator API against real servers: Redis 7 and Valkey 8, each started here. */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import type Redis from "ioredis";
import {
  InvalidArgument,
  InvalidJobId,
  InvalidToken,
  JobCancelled,
  LeaseLost,
  NotTracked,
  Rotator,
  RotatorError,
  moduleSha,
  queueKeys,
} from "../dist/index";
import { KINDS, serveTests, uniqueName } from "./servers";

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

for (const kind of KINDS) {
  describe(`Rotator on ${kind}`, () => {
    let redis: Redis;
    const queues: Rotator[] = [];
    serveTests(kind, (client) => (redis = client), queues);
    const queue = (label: string, options: ConstructorParameters<typeof Rotator>[2] = {}): Rotator => {
      const made = new Rotator(redis, uniqueName(label), options);
      queues.push(made);
      return made;
    };

    test("keys are built as rotator/keys.py builds them", () => {
      const keys = queueKeys("orders");
      assert.equal(keys.all.length, 13);
      assert.equal(keys.all[0], "rotator:{orders}:ring");
      assert.equal(keys.all[12], "rotator:{orders}:ids");
      assert.equal(keys.payloads, "rotator:{orders}:payloads");
      assert.equal(keys.items, "rotator:{orders}:items");
      assert.throws(() => queueKeys("a{b}"), RotatorError);
    });

    test("push, next and ack: each job once, then nothing", async () => {
      const q = queue("basic");
      assert.equal(await q.push("a", "b", 3), 3);
      const jobs = await q.next({ count: 10 });
      assert.deepEqual(jobs.map((job) => job.id), ["a", "b", "3"]);
      assert.ok(jobs.every((job) => job.deliveries === 1 && !job.reclaimed && job.deadline > Date.now()));
      assert.deepEqual(await q.next({ count: 10 }), []);
      assert.equal(await q.ack(...jobs), 3);
      const stats = await q.stats();
      assert.equal(stats.inFlight, 0);
      assert.equal(stats.pushed, 3);
      assert.equal(stats.pending, 0);
    });

    test("a whole batch is acked with one batch ack, and a second ack changes nothing", async () => {
      const q = queue("batch");
      await q.push("a", "b", "c");
      const jobs = await q.next({ count: 3 });
      const monitor = redis.duplicate();
      const sent: string[][] = [];
      const m = await monitor.monitor();
      m.on("monitor", (_time: string, args: string[]) => sent.push(args));
      await sleep(50);
      assert.equal(await q.ack(...jobs), 3);
      await sleep(100);
      m.disconnect();
      monitor.disconnect();
      const moduleCalls = new Set(["evalsha", "fcall"]);
      const acks = sent.filter((args) => moduleCalls.has(args[0]?.toLowerCase() ?? "") && args.includes("ack"));
      assert.equal(acks.length, 1);
      assert.equal(acks[0]?.length, 3 + 13 + 2); // FCALL name (EVALSHA sha) 13 KEYS... ack *<stamp>/3
      assert.match(acks[0]?.[acks[0].length - 1] ?? "", /^\*\d+\.1\.\d+\/3$/);
      assert.equal((await q.stats()).inFlight, 0);
    });

    test("next acks the jobs it is given first", async () => {
      const q = queue("next-ack");
      await q.push("a", "b");
      const first = await q.next({ count: 1 });
      const second = await q.next({ count: 1, ack: first });
      assert.deepEqual(second.map((job) => job.id), ["b"]);
      await q.next({ count: 1, ack: second });
      const stats = await q.stats();
      assert.equal(stats.inFlight + stats.pending, 0);
    });

    test("claim says how many of its acks were accepted: a batch ack, tokens, refused ones", async () => {
      const q = queue("claim-acked");
      const byToken = new Rotator(redis, q.name); // knows none of q's batches: acks by token
      queues.push(byToken);
      await q.push("a", "b", "c", "d", "e");
      const first = await q.claim({ count: 2 });
      assert.deepEqual([first.jobs.map((job) => job.id), first.acked], [["a", "b"], 0]);
      const second = await q.claim({ count: 1, ack: first.jobs }); // one batch ack for both
      assert.deepEqual([second.jobs.map((job) => job.id), second.acked], [["c"], 2]);
      assert.equal(await byToken.nack(second.jobs), 1); // given back: its batch ack is refused
      const third = await q.claim({ count: 2, ack: second.jobs });
      assert.deepEqual([third.jobs.length, third.acked], [2, 0]);
      assert.equal(await byToken.nack(third.jobs[0]!), 1);
      const fourth = await byToken.claim({ count: 5, ack: third.jobs }); // tokens: one refused
      assert.equal(fourth.acked, 1);
      assert.equal((await byToken.claim({ count: 5, ack: fourth.jobs })).acked, fourth.jobs.length);
      const stats = await q.stats();
      assert.equal(stats.pending + stats.inFlight + stats.deferred, 0);
    });

    test("an expired lease is reclaimed and its old token refused", async () => {
      const q = queue("expiry", { timeout: 0.2 });
      await q.push("a");
      const [first] = await q.next();
      await sleep(300);
      const [again] = await q.next();
      assert.equal(again?.id, "a");
      assert.equal(again?.deliveries, 2);
      assert.equal(again?.reclaimed, true);
      assert.equal(await q.ack(first!), 0);
      assert.equal(await q.ack(again!), 1);
    });

    test("idempotency: a reclaimed job already done is acked, not returned", async () => {
      const asked: string[] = [];
      const q = queue("idem", { timeout: 0.2, idempotency: (id) => (asked.push(id), id === "done") });
      await q.push("done", "todo");
      await q.next({ count: 2 });
      await sleep(300);
      const jobs = await q.next({ count: 2 });
      assert.deepEqual(jobs.map((job) => job.id), ["todo"]);
      assert.deepEqual(asked.sort(), ["done", "todo"]);
      assert.equal((await q.stats()).completed + (await q.stats()).done, 1);
    });

    test("nack with a delay delivers again later, as a new delivery", async () => {
      const q = queue("nack");
      await q.push("a");
      const [job] = await q.next();
      assert.equal(await q.nack(job!, { delay: 0.3 }), 1);
      assert.deepEqual(await q.next(), []);
      const [again] = await q.next({ block: 2 });
      assert.equal(again?.id, "a");
      assert.equal(again?.deliveries, 2);
      assert.equal(await q.nack(job!), 0); // the old token was revoked
    });

    test("extend moves the deadline; a lost lease raises LeaseLost", async () => {
      const q = queue("extend", { timeout: 0.3 });
      await q.push("a");
      const [job] = await q.next();
      const deadline = await q.extend(job!, 5);
      assert.ok(deadline > Date.now() + 4000);
      await sleep(400);
      assert.deepEqual(await q.next(), []); // still held
      await q.nack(job!);
      await assert.rejects(q.extend(job!, 5), LeaseLost);
    });

    test("cancel on a tracked queue: extend raises JobCancelled; unique pushes skip held ids", async () => {
      const q = queue("cancel");
      await assert.rejects(q.push("a", { unique: true }), NotTracked);
      await assert.rejects(q.cancel("a"), NotTracked);
      assert.equal((await q.configure({ trackIds: true }))["track_ids"], 1);
      assert.equal(await q.push("a", "a", "b", { unique: true }), 2);
      const [job] = await q.next();
      assert.equal(await q.cancel("a", "b", "zzz"), 2);
      const error = await q.extend(job!).catch((e: unknown) => e);
      assert.ok(error instanceof JobCancelled);
      assert.ok(error instanceof LeaseLost);
      assert.equal(await q.ack(job!), 0);
      assert.deepEqual(await q.next({ count: 10 }), []);
      assert.equal((await q.stats()).cancelled, 2);
    });

    test("push with delay and at schedules jobs by the server's clock", async () => {
      const q = queue("later");
      assert.equal(await q.push("soon", { delay: 0.3 }), 1);
      assert.equal(await q.push("much-later", { at: new Date(Date.now() + 3_600_000) }), 1);
      assert.equal((await q.stats()).scheduled, 2);
      assert.deepEqual(await q.next(), []);
      const [job] = await q.next({ block: 2 });
      assert.equal(job?.id, "soon");
    });

    test("priority: jobs at a level wait behind every pending job of a lower one", async () => {
      const q = queue("priority");
      assert.equal(await q.push("low", { priority: 5 }), 1);
      assert.equal(await q.push("mid", { priority: 1 }), 1);
      assert.equal(await q.push("now"), 1);
      assert.deepEqual((await q.next({ count: 3 })).map((job) => job.id), ["now", "mid", "low"]);
      await assert.rejects(q.push("x", { priority: 10 }), InvalidArgument);
    });

    test("a blocked next wakes on a push", async () => {
      const q = queue("block");
      const started = Date.now();
      const waiting = q.next({ block: 5 });
      await sleep(200);
      await q.push("x");
      const [job] = await waiting;
      assert.equal(job?.id, "x");
      assert.ok(Date.now() - started < 2000);
    });

    test("pause, resume and the rate limit", async () => {
      const q = queue("pause");
      await q.push("a", "b", "c");
      assert.equal(await q.pause(), true);
      assert.deepEqual(await q.next({ count: 3 }), []);
      assert.equal((await q.stats()).paused, true);
      assert.equal(await q.resume(), true);
      await q.setRateLimit(2, 60);
      assert.equal((await q.next({ count: 3 })).length, 2);
      await q.setRateLimit(null);
      assert.equal((await q.next({ count: 3 })).length, 1);
    });

    test("dead letters after maxDeliveries, and bury", async () => {
      const q = queue("dead", { timeout: 0.1, maxDeliveries: 1 });
      await q.push("a", "b");
      const [a, b] = await q.next({ count: 2 });
      assert.equal(await q.bury(b!, "card declined"), 1);
      await sleep(200);
      assert.deepEqual(await q.next(), []);
      const letters = await q.dead();
      assert.equal(letters.length, 2);
      assert.ok(letters.some((letter) => letter.startsWith("failed*1*") && letter.endsWith("*b*card declined")));
      assert.equal(await q.ack(a!), 0);
    });

    test("bad input is refused before anything is sent, with typed errors", async () => {
      const q = queue("bad");
      await assert.rejects(q.push("a*b"), InvalidJobId);
      await assert.rejects(q.push(""), InvalidJobId);
      await assert.rejects(q.push("x".repeat(1025)), InvalidJobId);
      await assert.rejects(q.ack("not-a-token"), InvalidToken);
      await assert.rejects(q.next({ count: 0 }), InvalidArgument);
      await assert.rejects(q.next({ count: 1001 }), InvalidArgument);
      assert.throws(() => new Rotator(redis, "q", { timeout: 0 }), InvalidArgument);
      assert.equal(await redis.exists(...q.keys.all), 0);
    });

    test("the module's own error codes map to the same classes", async () => {
      const q = queue("codes");
      await assert.rejects(q.call(["push", "a*b"]), InvalidJobId);
      await assert.rejects(q.call(["next", "0", "1000", "10", "0"]), InvalidArgument);
      await assert.rejects(q.call(["ack", "nonsense"]), InvalidToken);
      await assert.rejects(q.call(["cancel", "a"]), NotTracked);
      await assert.rejects(q.call(["no-such-command"]), RotatorError);
      await redis.set(q.keys.all[0]!, "x");
      await assert.rejects(q.push("a"), (e: unknown) => e instanceof RotatorError && e.name === "WrongKeyType");
    });

    test("NOSCRIPT after SCRIPT FLUSH: the module is loaded again and the call goes through", async () => {
      const q = queue("noscript", { functions: false }); // (FCALL's own: script.test.ts)
      await q.push("a");
      await redis.script("FLUSH");
      assert.deepEqual(await redis.script("EXISTS", moduleSha()), [0]);
      assert.equal(await q.push("b"), 1);
      assert.deepEqual(await redis.script("EXISTS", moduleSha()), [1]);
      await redis.script("FLUSH");
      const [job] = await q.next({ block: 1 }); // through the blocking pipeline too
      assert.equal(job?.id, "a");
    });
  });
}
