/** The worker loop against real servers: Redis 7 and Valkey 8, each started here. */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";
import type Redis from "ioredis";
import { type Job, Rotator, UnknownFormat, retryDelay } from "../dist/index";
import { KINDS, ROOT, serveTests, uniqueName } from "./servers";

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
const quiet = { warn: () => undefined, error: () => undefined };

for (const kind of KINDS) {
  describe(`work on ${kind}`, () => {
    let redis: Redis;
    const server = serveTests(kind, (client) => (redis = client));

    test("runs every job, concurrently, and acks it", async () => {
      const q = new Rotator(redis, uniqueName("work"));
      const ids = Array.from({ length: 50 }, (_, i) => `job-${i}`);
      await q.push(...ids);
      let running = 0;
      let most = 0;
      const seen: string[] = [];
      const summary = await q.work(
        async (job: Job) => {
          running += 1;
          most = Math.max(most, running);
          await sleep(5);
          seen.push(job.id);
          running -= 1;
        },
        { concurrency: 8, stopWhenEmpty: true, handleSignals: false },
      );
      assert.deepEqual(seen.sort(), ids.sort());
      assert.equal(summary.completed, 50);
      assert.equal(summary.leasesLost, 0);
      assert.ok(most > 1 && most <= 8, `at most 8 at once, got ${most}`);
      const stats = await q.stats();
      assert.equal(stats.pending + stats.inFlight + stats.deferred, 0);
    });

    test("a queue a newer rotator converted stops the loop with UnknownFormat, nothing written", async () => {
      const name = uniqueName("format");
      const q = new Rotator(redis, name);
      await q.push("a");
      await redis.hset(`rotator:{${name}}:meta`, "format", "2"); // (as a newer module would)
      const ring = await redis.lrange(`rotator:{${name}}:ring`, 0, -1);
      await assert.rejects(q.push("b"), UnknownFormat);
      const loop = q.work(async () => undefined, { poll: 0.05, handleSignals: false, logger: quiet });
      await assert.rejects(loop, UnknownFormat); // (not retried: it would never pass)
      assert.deepEqual(await redis.lrange(`rotator:{${name}}:ring`, 0, -1), ring);
      assert.equal(await redis.hget(`rotator:{${name}}:meta`, "format"), "2");
    });

    test("an ack riding on a claim and refused is not counted completed, but a lost lease", async () => {
      const name = uniqueName("refused");
      const q = new Rotator(redis, name);
      const other = new Rotator(redis, name);
      await q.push("a");
      const deliveries: number[] = [];
      const summary = await q.work(
        async (job: Job) => {
          deliveries.push(job.deliveries);
          // Someone else gives the first delivery back while it runs: its ack, riding on the
          // worker's next claim, is refused; the job comes again and is done then.
          if (job.deliveries === 1) assert.equal(await other.nack(job), 1);
        },
        { stopWhenEmpty: true, handleSignals: false, logger: quiet },
      );
      assert.deepEqual(deliveries, [1, 2]);
      assert.deepEqual([summary.completed, summary.leasesLost], [1, 1]);
      const stats = await q.stats();
      assert.equal(stats.pending + stats.inFlight + stats.deferred, 0);
    });

    test("a throw nacks with backoff; the last allowed delivery buries the job", async () => {
      assert.deepEqual([1, 2, 3, 10].map(retryDelay), [1, 2, 4, 300]);
      const q = new Rotator(redis, uniqueName("fail"), { maxDeliveries: 2 });
      await q.push("bad");
      const first = await q.work(() => {
        throw new Error("boom");
      }, { stopWhenEmpty: true, handleSignals: false, logger: quiet });
      assert.deepEqual([first.failed, first.retried, first.dead], [1, 1, 0]);
      assert.equal((await q.stats()).deferred, 1);
      await sleep(1100); // retryDelay(1)
      const second = await q.work(() => {
        throw new Error("boom again");
      }, { stopWhenEmpty: true, handleSignals: false, logger: quiet });
      assert.deepEqual([second.failed, second.retried, second.dead], [1, 0, 1]);
      const [letter] = await q.dead();
      assert.match(letter ?? "", /^failed\*2\*\d+\*bad\*Error: boom again$/);
    });

    test("the heartbeat keeps a slow job's lease: nobody else gets it", async () => {
      const name = uniqueName("slow");
      const q = new Rotator(redis, name, { timeout: 0.4 });
      const other = new Rotator(redis, name, { timeout: 0.4 });
      await q.push("slow");
      const stolen: Job[] = [];
      const summary = await q.work(
        async () => {
          for (let i = 0; i < 6; i += 1) {
            await sleep(200);
            stolen.push(...(await other.next()));
          }
        },
        { stopWhenEmpty: true, handleSignals: false },
      );
      assert.deepEqual(stolen, []);
      assert.equal(summary.completed, 1);
      assert.equal(summary.leasesLost, 0);
    });

    test("an abort signal stops the loop; the running job finishes and is acked", async () => {
      const q = new Rotator(redis, uniqueName("abort"));
      await q.push("a");
      const stop = new AbortController();
      const summary = await q.work(
        async () => {
          stop.abort();
          await sleep(100);
        },
        { signal: stop.signal, handleSignals: false },
      );
      assert.equal(summary.completed, 1);
      assert.equal((await q.stats()).inFlight, 0);
    });

    for (const signal of ["SIGTERM", "SIGINT"] as const) {
      test(`${signal}: the worker process finishes its jobs, acks them and exits 0`, async () => {
        const name = uniqueName(signal.toLowerCase());
        const q = new Rotator(redis, name);
        await q.push("a", "b");
        const out = join(mkdtempSync(join(tmpdir(), "rotator-node-")), "out.txt");
        const script = join(ROOT, "clients", "node", "scripts", "interop.js");
        const child = spawn(process.execPath, [script, "work", server.url, name, out, "0.5"], {
          stdio: ["ignore", "pipe", "inherit"],
        });
        let stdout = "";
        child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString()));
        const exited = new Promise<number | null>((done) => child.on("exit", (code) => done(code)));
        for (let i = 0; i < 100 && !readFileSafe(out).includes("start b"); i += 1) await sleep(50);
        assert.ok(readFileSafe(out).includes("start b"), "both jobs started");
        child.kill(signal);
        assert.equal(await exited, 0);
        const done = readFileSafe(out).split("\n").filter((l) => l.startsWith("done"));
        assert.deepEqual(done.sort(), ["done a", "done b"]);
        assert.equal((JSON.parse(stdout) as { completed: number }).completed, 2);
        const stats = await q.stats();
        assert.equal(stats.inFlight + stats.pending, 0);
      });
    }
  });
}

function readFileSafe(path: string): string {
  try {
    return readFileSync(path, "utf8");
  } catch {
    return "";
  }
}
