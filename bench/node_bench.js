// The Node client as a benchmark peer of BullMQ (bench/bullmq/bench.js, the same shape):
// push N no-op jobs (chunks of 1000, not timed), then time one Rotator.work() draining them
// at CONCURRENCY handlers (each claim asks for as many jobs as there are free slots, acks
// ride on the next claim). Uses the built package in clients/node (npm run build).
// Usage: node bench/node_bench.js PORT N CONCURRENCY  -> prints one JSON line.
"use strict";
const path = require("node:path");
const client = path.join(__dirname, "..", "clients", "node");
const Redis = require(path.join(client, "node_modules", "ioredis"));
const { Rotator } = require(path.join(client, "dist", "index"));

async function main() {
  const [port, total, concurrency] = process.argv.slice(2).map(Number);
  const redis = new Redis({ host: "127.0.0.1", port, maxRetriesPerRequest: null });
  const q = new Rotator(redis, `bench-node-${process.pid}-${Date.now()}`);
  const ids = Array.from({ length: total }, (_, i) => `j${i}`);
  for (let start = 0; start < total; start += 1000) await q.push(...ids.slice(start, start + 1000));
  await q.stats(); // the module is loaded before the clock starts, as BullMQ's scripts are
  const began = process.hrtime.bigint();
  const summary = await q.work(async () => {}, { concurrency, stopWhenEmpty: true, handleSignals: false });
  const seconds = Number(process.hrtime.bigint() - began) / 1e9;
  const stats = await q.stats();
  await q.delete();
  await q.close();
  redis.disconnect();
  if (summary.completed !== total || stats.pending + stats.inFlight !== 0) {
    throw new Error(`drained ${summary.completed} of ${total}: ${JSON.stringify(stats)}`);
  }
  console.log(JSON.stringify({ jobs: summary.completed, seconds }));
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
