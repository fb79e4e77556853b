/** How the module is called: FCALL of its library by default, EVALSHA where the server or the
 * ACL does not allow that, either one forced; against real servers, Redis 7, Valkey 8 and Redis
 * 6.2 (which has no functions). */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { after, before, describe, test } from "node:test";
import Redis, { ReplyError, type RedisOptions } from "ioredis";
import {
  FunctionsUnavailable,
  InvalidArgument,
  ModuleCaller,
  Rotator,
  errorFromReply,
  functionName,
  librarySource,
  queueKeys,
} from "../dist/index";
import { READ_COMMANDS, moduleSource, readsOnly } from "../dist/script";
import { HOST, KINDS, type Kind, ROOT, ServerProcess, commandStat, python, uniqueName } from "./servers";

/** The libraries the server holds, by name. */
async function libraries(redis: Redis): Promise<string[]> {
  const list = (await redis.call("FUNCTION", "LIST")) as unknown[][];
  return list.map((entry) => String(entry[entry.indexOf("library_name") + 1]));
}

/** Module calls so far by each command, from INFO commandstats. */
async function calls(redis: Redis): Promise<{ fcall: number; evalsha: number }> {
  const info = await redis.info("commandstats");
  return { fcall: commandStat(info, "fcall"), evalsha: commandStat(info, "evalsha") };
}

/** One job through `q`, in three module calls: pushed, claimed, acked. */
async function oneJob(q: Rotator): Promise<void> {
  assert.equal(await q.push("a"), 1);
  const [job] = await q.next();
  assert.equal(await q.ack(job!), 1);
}

test("the calls sent by FCALL_RO are the module's reads, durations only without counts", () => {
  const reads = /local READS = ' ([a-z_ ]+) '/.exec(moduleSource());
  assert.ok(reads, "no READS in the module");
  assert.deepEqual([...READ_COMMANDS].sort(), reads[1]!.split(" ").sort());
  assert.ok(readsOnly(["stats"]) && readsOnly([Buffer.from("peek"), 5]) && readsOnly(["durations"]));
  assert.ok(!readsOnly(["durations", 90, 6, 2]) && !readsOnly(["push", "a"]) && !readsOnly([]));
});

/** A server of `kind` for the describe block this is called in: started before its tests,
 * stopped after them with every client `client` opened; `admin` is a connection of its own. */
function serverFor(kind: Kind): {
  server: ServerProcess;
  admin: () => Redis;
  client: (options?: RedisOptions) => Redis;
} {
  const server = new ServerProcess(kind);
  const opened: Redis[] = [];
  let admin: Redis | undefined;
  before(async () => {
    await server.start();
    admin = server.client();
  });
  after(() => {
    for (const made of opened) made.disconnect();
    admin?.disconnect();
    server.stop();
  });
  const client = (options: RedisOptions = {}): Redis => {
    const made = new Redis({ host: HOST, port: server.port, maxRetriesPerRequest: 1, ...options });
    opened.push(made);
    return made;
  };
  return { server, admin: () => admin!, client };
}

for (const kind of KINDS) {
  describe(`calling the module on ${kind}`, () => {
    const { server, admin, client } = serverFor(kind);
    let redis: Redis;
    before(() => {
      redis = admin();
    });

    test("the library is the Python client's: the same name and source", () => {
      const script = "from rotator.script import function_name, library_source\nimport sys\n" +
        "sys.stdout.write(function_name() + '\\n' + library_source())";
      const printed = execFileSync(python(), ["-c", script], { cwd: ROOT, encoding: "utf8" });
      assert.equal(printed, `${functionName()}\n${librarySource()}`);
    });

    test("by default a client's calls go by FCALL, the library loaded at the first", async () => {
      await redis.call("FUNCTION", "FLUSH");
      const own = client();
      const q = new Rotator(own, uniqueName("fcall"));
      const before = await calls(redis);
      assert.equal(await q.push("a", "b"), 2);
      const jobs = await q.next({ count: 2 });
      assert.equal(await q.ack(...jobs), 2);
      const after = await calls(redis);
      assert.equal(after.evalsha - before.evalsha, 0);
      assert.ok(after.fcall - before.fcall >= 3);
      assert.deepEqual(await libraries(redis), [functionName()]);
      assert.equal(new ModuleCaller(own).mode, "fcall"); // chosen for the client
    });

    test("a FUNCTION FLUSH between calls costs nothing: the library is loaded again", async () => {
      const q = new Rotator(client(), uniqueName("flush"));
      assert.equal(await q.push("a"), 1);
      await redis.call("FUNCTION", "FLUSH");
      assert.deepEqual(await libraries(redis), []);
      const [job] = await q.next();
      assert.equal(job?.id, "a");
      assert.deepEqual(await libraries(redis), [functionName()]);
      // And from a blocked claim, whose call goes in a pipeline after its BLPOP.
      await redis.call("FUNCTION", "FLUSH");
      const waiting = q.next({ block: 5 });
      setTimeout(() => void new Rotator(redis, q.name, { functions: false }).push("b"), 100);
      assert.deepEqual((await waiting).map((j) => j.id), ["b"]);
      await q.close();
    });

    test("the module's own errors come typed by FCALL too, and nothing falls back", async () => {
      const q = new Rotator(client(), uniqueName("typed"));
      await q.push("a");
      const before = await calls(redis);
      await assert.rejects(q.call(["next", 0, 30_000, 1000, 0]), InvalidArgument);
      assert.equal((await calls(redis)).evalsha, before.evalsha);
    });

    test("a user whose ACL refuses FCALL gets EVALSHA, and keeps it", async () => {
      const user = uniqueName("acl").replace(/-/g, "_");
      await redis.call("ACL", "SETUSER", user, "on", ">secret", "~*", "+@all", "-fcall");
      const refused = client({ username: user, password: "secret" });
      const q = new Rotator(refused, uniqueName("acl"));
      const before = await calls(redis);
      await oneJob(q);
      const after = await calls(redis);
      assert.equal(after.evalsha - before.evalsha, 3);
      assert.equal(new ModuleCaller(refused).mode, "evalsha");
      // Forced, FCALL is refused as the server refuses it: nothing ran.
      const forced = new Rotator(refused, q.name, { functions: true });
      await assert.rejects(forced.push("b"), /NOPERM/);
      assert.equal((await q.stats()).pending, 0);
    });

    test("on a read-only replica a reading call goes by FCALL_RO, and a write is refused", async () => {
      const replica = new ServerProcess(kind);
      await replica.start();
      try {
        const name = uniqueName("replica");
        await new Rotator(redis, name).push("a", "b");
        const replicaClient = client({ port: replica.port });
        await replicaClient.call("REPLICAOF", HOST, String(server.port));
        const giveUp = Date.now() + 10_000;
        while (!/master_link_status:up/.test(await replicaClient.info("replication"))) {
          assert.ok(Date.now() < giveUp, "the replica did not sync in 10 s");
          await new Promise((r) => setTimeout(r, 50));
        }
        // The library came with the sync: its read-only function runs there.
        const q = new Rotator(replicaClient, name);
        assert.equal((await q.stats()).pending, 2);
        assert.equal((await q.stats()).pending, 2);
        let info = await replicaClient.info("commandstats");
        assert.equal(commandStat(info, "fcall_ro"), 2, info);
        assert.equal(commandStat(info, "evalsha"), 0, info);
        // A write: FCALL refused before it ran (it may write), then the script's first write.
        await assert.rejects(q.push("c"), /READONLY/);
        info = await replicaClient.info("commandstats");
        assert.equal(commandStat(info, "fcall", "rejected_calls"), 1, info);
        assert.equal((await q.stats()).pending, 2);
      } finally {
        replica.stop();
      }
    });

    test("out of memory under noeviction, the reads answer by FCALL_RO and a write changes nothing", async () => {
      const name = uniqueName("oom");
      const q = new Rotator(client(), name);
      await q.push("a", "b");
      await q.next();
      const ring = async (): Promise<string[]> => redis.lrange(queueKeys(name).all[0]!, 0, -1);
      const stats = await q.stats();
      const before = await ring();
      await redis.call("CONFIG", "SET", "maxmemory-policy", "noeviction");
      await redis.call("CONFIG", "SET", "maxmemory", "1");
      try {
        const during = await q.stats();
        assert.equal(during.pending, 1);
        assert.equal(during.inFlight, stats.inFlight);
        assert.deepEqual(await q.dead(), []);
        await assert.rejects(q.push("c"), /OOM/);
        assert.deepEqual(await ring(), before);
        assert.equal((await q.stats()).pending, 1);
      } finally {
        await redis.call("CONFIG", "SET", "maxmemory", "0");
      }
      assert.equal(await q.push("c"), 1);
    });

    test("functions: false calls by EVALSHA and loads no library", async () => {
      await redis.call("FUNCTION", "FLUSH");
      const q = new Rotator(client(), uniqueName("evalsha"), { functions: false });
      const before = await calls(redis);
      await oneJob(q);
      const after = await calls(redis);
      assert.equal(after.fcall - before.fcall, 0);
      assert.equal(after.evalsha - before.evalsha, 3);
      assert.deepEqual(await libraries(redis), []);
      assert.equal(queueKeys(q.name).all.length, 13);
    });
  });
}

// Redis 6.2, the oldest server rotator supports, has no functions: a default client calls the
// module by EVALSHA there, chosen at its first call; a forced FCALL fails typed, nothing run.
describe("calling the module on redis6 (no functions)", () => {
  const { server, admin, client } = serverFor("redis6");
  let redis: Redis;
  before(() => {
    redis = admin();
  });

  test("the server is Redis 6.2", () => {
    assert.match(server.version, /^6\.2\./);
  });

  test("by default a client calls by EVALSHA, chosen at its first call (a write or a read)", async () => {
    const own = client();
    const q = new Rotator(own, uniqueName("default6"));
    const before = await calls(redis);
    await oneJob(q);
    const after = await calls(redis);
    assert.equal(after.evalsha - before.evalsha >= 3, true);
    assert.equal(new ModuleCaller(own).mode, "evalsha");
    const reader = client();
    assert.equal((await new Rotator(reader, uniqueName("read6")).stats()).length, 0);
    assert.equal(new ModuleCaller(reader).mode, "evalsha");
  });

  test("out of memory, a write rejects with the server's own OOM reply, as on Redis 7, and writes nothing", async () => {
    // 6.2 runs the script and refuses its first write, wrapping the refusal in the script's
    // error: the client unwraps it (SCRIPT_WRAPPED).
    const q = new Rotator(client(), uniqueName("oom6"));
    await q.push("a");
    const [job] = await q.next();
    const keys = async (): Promise<[string, string][]> => {
      const names = (await redis.keys(`*${q.name}*`)).sort();
      return Promise.all(names.map(async (name) => [name, String(await redis.call("DUMP", name))] as [string, string]));
    };
    const before = await keys();
    await redis.config("SET", "maxmemory", "1");
    try {
      for (const write of [() => q.push("b"), () => q.ack(job!), () => q.nack(job!)]) {
        await assert.rejects(write(), (error: unknown) => {
          assert.ok(error instanceof ReplyError, String(error));
          assert.match((error as Error).message, /^OOM command not allowed when used memory > 'maxmemory'\.$/);
          return true;
        });
      }
    } finally {
      await redis.config("SET", "maxmemory", "0");
    }
    assert.deepEqual(await keys(), before);
  });

  test("the script's wrapping of a refusal is taken off; other script errors stay as they are", () => {
    const wrapped = `ERR Error running script (call to f_${"0".repeat(40)}): @user_script:6315: @user_script: 2671: `;
    const readOnly = errorFromReply(new ReplyError(`${wrapped}-READONLY You can't write against a read only replica.`));
    assert.ok(readOnly instanceof ReplyError);
    assert.equal((readOnly as Error).message, "READONLY You can't write against a read only replica.");
    const own = new ReplyError(`${wrapped}-WRONGTYPE Operation against a key`);
    assert.equal(errorFromReply(own), own);
  });

  test("functions: true fails with FunctionsUnavailable and writes nothing", async () => {
    const q = new Rotator(client(), uniqueName("forced6"), { functions: true });
    await assert.rejects(q.push("a"), (error: unknown) => error instanceof FunctionsUnavailable);
    assert.deepEqual(await redis.keys(`*${q.name}*`), []);
  });
});
