// BullMQ peer: add N no-op jobs (addBulk, chunks of 1000), then time one Worker draining them.
// Usage: node bench.js PORT N CONCURRENCY  -> prints one JSON line.
const { Queue, Worker } = require("bullmq");

async function main() {
  const [port, total, concurrency] = process.argv.slice(2).map(Number);
  const connection = { host: "127.0.0.1", port, maxRetriesPerRequest: null };
  const name = `bench-${Date.now()}`;
  const queue = new Queue(name, { connection });
  for (let start = 0; start < total; start += 1000) {
    const jobs = [];
    for (let i = start; i < Math.min(start + 1000, total); i++) {
      jobs.push({ name: "noop", data: {}, opts: { removeOnComplete: true } });
    }
    await queue.addBulk(jobs);
  }
  let done = 0;
  const began = process.hrtime.bigint();
  const finished = new Promise((resolve) => {
    const worker = new Worker(name, async () => {}, { connection, concurrency });
    worker.on("completed", () => {
      done += 1;
      if (done === total) resolve(worker);
    });
  });
  const worker = await finished;
  const seconds = Number(process.hrtime.bigint() - began) / 1e9;
  await worker.close();
  await queue.obliterate({ force: true });
  await queue.close();
  console.log(JSON.stringify({ jobs: total, seconds }));
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
