// A small command line over the built package, for tests that drive Node from outside
// (tests/test_interop.py, test/worker.test.ts). Not shipped.
//   node scripts/interop.js push URL QUEUE ID...          prints how many were pushed
//   node scripts/interop.js work URL QUEUE OUT [SECONDS]  runs a worker (timeout 1 s) until
//       SIGINT/SIGTERM or until the queue is empty; each job's handler appends
//       "start <id>" to OUT, sleeps SECONDS (default 0), then appends "done <id>"; a job
//       whose id starts with "fail" throws. Prints the summary as JSON.
//   node scripts/interop.js publish URL TOPIC PAYLOAD...  publishes to every registered
//       group; prints the message ids as JSON
//   node scripts/interop.js consume URL TOPIC GROUP N     consumes N messages of GROUP (4 at
//       a time, each claim acking the last); prints [{id, payload, hex}, ...] as JSON (hex: the
//       payload's bytes)
//   node scripts/interop.js pushp URL QUEUE ID HEX...     pushes jobs with payloads (HEX: the
//       payload's bytes) to a queue with payloads; prints how many were pushed
//   node scripts/interop.js drainp URL QUEUE              claims 7 at a time from a queue with
//       payloads, each claim acking the last, until it is empty; prints [{id, hex}, ...]
//   node scripts/interop.js schedule URL QUEUE NAME EVERY declares an interval schedule;
//       prints true when it was added or changed
//   node scripts/interop.js schedules URL QUEUE           prints the queue's schedules as JSON
// URL is redis://... or redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE (tests/test_sentinel.py):
// then the client is ioredis's own for a master found through Sentinel.
"use strict";
const fs = require("node:fs");
const Redis = require("ioredis");
const { Rotator, Topic } = require("../dist/index");

function connect(url) {
  const sentinel = /^redis\+sentinel:\/\/([^/]+)\/([^/]+)$/.exec(url);
  if (!sentinel) return new Redis(url);
  const sentinels = sentinel[1].split(",").map((address) => {
    const [host, port] = address.split(":");
    return { host, port: Number(port) };
  });
  return new Redis({ sentinels, name: decodeURIComponent(sentinel[2]) });
}

async function main() {
  const [command, url, name, ...rest] = process.argv.slice(2);
  const redis = connect(url);
  try {
    if (command === "push") {
      const q = new Rotator(redis, name);
      console.log(await q.push(...rest));
    } else if (command === "work") {
      const [out, seconds = "0", mode = "until-stopped"] = rest;
      const q = new Rotator(redis, name, { timeout: 1 });
      const summary = await q.work(
        async (job) => {
          fs.appendFileSync(out, `start ${job.id}\n`);
          await new Promise((r) => setTimeout(r, Number(seconds) * 1000));
          if (job.id.startsWith("fail")) throw new Error(`${job.id} failed`);
          fs.appendFileSync(out, `done ${job.id}\n`);
        },
        { concurrency: 4, poll: 0.2, stopWhenEmpty: mode === "until-empty" },
      );
      console.log(JSON.stringify(summary));
    } else if (command === "publish") {
      console.log(JSON.stringify(await new Topic(redis, name).publish(...rest)));
    } else if (command === "consume") {
      const [group, wanted] = rest;
      const g = new Topic(redis, name).group(group);
      const seen = [];
      let held = [];
      try {
        while (seen.length < Number(wanted)) {
          held = await g.next({ count: 4, block: 5, ack: held });
          if (held.length === 0) throw new Error(`nothing came within 5 s, after ${seen.length}`);
          seen.push(...held.map((job) => ({ id: job.id, payload: job.payload, hex: job.payloadBuffer.toString("hex") })));
        }
        await g.ack(...held);
      } finally {
        await g.close();
      }
      console.log(JSON.stringify(seen));
    } else if (command === "pushp") {
      const q = new Rotator(redis, name, { payloads: true });
      const pairs = [];
      for (let i = 0; i + 1 < rest.length; i += 2) pairs.push([rest[i], Buffer.from(rest[i + 1], "hex")]);
      console.log(await q.pushPayloads(pairs));
    } else if (command === "drainp") {
      const q = new Rotator(redis, name, { payloads: true });
      const seen = [];
      let held = [];
      while ((held = await q.next({ count: 7, ack: held })).length > 0) {
        seen.push(...held.map((job) => ({ id: job.id, hex: job.payloadBuffer.toString("hex") })));
      }
      console.log(JSON.stringify(seen));
    } else if (command === "schedule") {
      const [scheduleName, every] = rest;
      console.log(await new Rotator(redis, name).schedule(scheduleName, { every: Number(every) }));
    } else if (command === "schedules") {
      console.log(JSON.stringify(await new Rotator(redis, name).schedules()));
    } else {
      throw new Error(`unknown command ${command}`);
    }
  } finally {
    redis.disconnect();
  }
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
