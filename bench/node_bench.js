// The Node side of bench/node.py: one timed drain of N no-op jobs in this process, after
// pushing them (chunks of 1000, not timed). Uses the built package in clients/node (npm run
// build) and, for the bullmq-manual mode, BullMQ as bench/peers.py installs it in
// bench/bullmq (the Worker mode is bench/bullmq/bench.js).
//   node bench/node_bench.js work PORT N CONCURRENCY   one Rotator.work() at CONCURRENCY
//       handlers (each claim asks for as many jobs as there are free slots, acks ride on the
//       next claim)
//   node bench/node_bench.js batch PORT N COUNT        a loop of q.next({count: COUNT, ack:
//       the previous batch}): claims of COUNT jobs, each acking the batch before (one batch
//       ack), and a last ack
//   node bench/node_bench.js bullmq-manual PORT N -    BullMQ's manual processing, one job at
//       a time: worker.getNextJob(token, {block: false}), then job.moveToCompleted(null,
//       token, false) (its documented API; the open-source Worker has no batch claim)
// Prints one JSON line {jobs, seconds}.
"use strict";
const path = require("node:path");
const client = path.join(__dirname, "..", "clients", "node");
const Redis = require(path.join(client, "node_modules", "ioredis"));
const { Rotator } = require(path.join(client, "dist", "index"));

async function rotatorQueue(port, total) {
  const redis = new Redis({ host: "127.0.0.1", port, maxRetriesPerRequest: null });
  const q = new Rotator(redis, `bench-node-${process.pid}-${Date.now()}`);
  const ids = Array.from({ length: total }, (_, i) => `j${i}`);
  for (let start = 0; start < total; start += 1000) await q.push(...ids.slice(start, start + 1000));
  await q.stats(); // the module is loaded before the clock starts, as BullMQ's scripts are
  return { redis, q };
}

async function finish(redis, q, done, total) {
  const stats = await q.stats();
  await q.delete();
  await q.close();
  redis.disconnect();
  if (done !== total || stats.pending + stats.inFlight !== 0) {
    throw new Error(`drained ${done} of ${total}: ${JSON.stringify(stats)}`);
  }
}

async function work(port, total, concurrency) {
  const { redis, q } = await rotatorQueue(port, total);
  const began = process.hrtime.bigint();
  const summary = await q.work(async () => {}, { concurrency, stopWhenEmpty: true, handleSignals: false });
  const seconds = Number(process.hrtime.bigint() - began) / 1e9;
  await finish(redis, q, summary.completed, total);
  return seconds;
}

async function batch(port, total, count) {
  const { redis, q } = await rotatorQueue(port, total);
  let claimed = 0;
  const began = process.hrtime.bigint();
  let held = await q.next({ count });
  while (held.length > 0) {
    claimed += held.length;
    held = await q.next({ count, ack: held });
  }
  const seconds = Number(process.hrtime.bigint() - began) / 1e9;
  await finish(redis, q, claimed, total);
  return seconds;
}

async function bullmqManual(port, total) {
  const { Queue, Worker } = require(path.join(__dirname, "bullmq", "node_modules", "bullmq"));
  const connection = { host: "127.0.0.1", port, maxRetriesPerRequest: null };
  const name = `bench-manual-${Date.now()}`;
  const queue = new Queue(name, { connection });
  for (let start = 0; start < total; start += 1000) {
    const jobs = [];
    for (let i = start; i < Math.min(start + 1000, total); i++) {
      jobs.push({ name: "noop", data: {}, opts: { removeOnComplete: true } });
    }
    await queue.addBulk(jobs);
  }
  const worker = new Worker(name, null, { connection, autorun: false });
  await worker.waitUntilReady();
  const token = "bench-manual";
  let done = 0;
  const began = process.hrtime.bigint();
  for (;;) {
    const job = await worker.getNextJob(token, { block: false });
    if (!job) break;
    await job.moveToCompleted(null, token, false);
    done += 1;
  }
  const seconds = Number(process.hrtime.bigint() - began) / 1e9;
  const left = await queue.getJobCounts("wait", "active");
  await worker.close();
  await queue.obliterate({ force: true });
  await queue.close();
  if (done !== total || left.wait + left.active !== 0) {
    throw new Error(`drained ${done} of ${total}: ${JSON.stringify(left)}`);
  }
  return seconds;
}

async function main() {
  const [mode, ...rest] = process.argv.slice(2);
  const [port, total, arg] = rest.map(Number);
  const modes = { work, batch, "bullmq-manual": bullmqManual };
  if (!(mode in modes)) throw new Error(`unknown mode ${mode}: work, batch or bullmq-manual`);
  const seconds = await modes[mode](port, total, arg);
  console.log(JSON.stringify({ jobs: total, seconds }));
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
