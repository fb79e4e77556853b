/**
 * A push whose reply was lost, for real: the calls go through a TCP relay that forwards a
 * request naming a given job id to the server, waits for the server's reply and closes the
 * client's connection instead of relaying it (the call ran; the client never hears).
 * ioredis reconnects and sends the push again (autoResendUnfulfilledCommands, its default):
 * with idempotentPushes the second run pushes nothing, without it the id lands twice. A
 * topic's publish likewise, with idempotentPublishes.
 */
import assert from "node:assert/strict";
import { type Server, type Socket, connect, createServer } from "node:net";
import { after, before, describe, test } from "node:test";
import Redis from "ioredis";
import { PUSH_MARKER_TTL_MS, Rotator, Topic, messageSeq, publishMarker, pushMarker } from "../dist/index";
import { HOST, KINDS, ServerProcess, uniqueName } from "./servers";

/** Relays 127.0.0.1:<port> to the server; the reply to the first request that contains
 * `loseReplyTo` (its bytes) is read and thrown away, and the client's connection closed. */
class LossyRelay {
  loseReplyTo: string | null = null;
  lost = 0;
  private server: Server | undefined;
  private readonly sockets = new Set<Socket>();

  constructor(private readonly upstream: number) {}

  async start(): Promise<number> {
    this.server = createServer((client) => this.relay(client));
    await new Promise<void>((done) => this.server!.listen(0, HOST, done));
    const address = this.server.address();
    return typeof address === "object" && address !== null ? address.port : 0;
  }

  private relay(client: Socket): void {
    const server = connect(this.upstream, HOST);
    for (const socket of [client, server]) {
      this.sockets.add(socket);
      socket.on("close", () => this.sockets.delete(socket));
      socket.on("error", () => undefined);
    }
    let doomed = false;
    client.on("data", (data) => {
      if (this.loseReplyTo !== null && data.includes(this.loseReplyTo)) {
        this.loseReplyTo = null;
        doomed = true;
      }
      server.write(data);
    });
    server.on("data", (data) => {
      if (!doomed) {
        client.write(data);
        return;
      }
      this.lost += 1;
      client.destroy();
      server.destroy();
    });
    client.on("close", () => server.destroy());
    server.on("close", () => client.destroy());
  }

  stop(): void {
    for (const socket of this.sockets) socket.destroy();
    this.server?.close();
  }
}

for (const kind of KINDS) {
  describe(`a push whose reply was lost, on ${kind}`, () => {
    const server = new ServerProcess(kind);
    let direct: Redis;
    let relay: LossyRelay;
    let relayed: Redis;

    before(async () => {
      await server.start();
      direct = server.client();
      relay = new LossyRelay(server.port);
      relayed = new Redis({ host: HOST, port: await relay.start(), lazyConnect: true });
      await relayed.connect();
    });
    after(() => {
      relayed?.disconnect();
      direct?.disconnect();
      relay?.stop();
      server.stop();
    });

    const waiting = async (q: Rotator): Promise<string[]> =>
      (await direct.lrange(q.keys.all[0]!, 0, -1)).filter((element) => !element.includes("*")).sort();

    test("idempotentPushes: sent again by ioredis, it pushes nothing twice", async () => {
      const q = new Rotator(relayed, uniqueName("marked"), { idempotentPushes: true });
      await q.push("warm-up"); // (the module is loaded)
      relay.loseReplyTo = "lost-1";
      const lost = relay.lost;
      assert.equal(await q.push("lost-1", "b"), 2); // the count the first run pushed
      assert.equal(relay.lost, lost + 1);
      assert.deepEqual(await waiting(q), ["b", "lost-1", "warm-up"]);
      const markers = await direct.keys(pushMarker(q.keys, "*"));
      assert.equal(markers.length, 2); // one a push call
      const ttl = await direct.pttl(markers[0]!);
      assert.ok(ttl > 0 && ttl <= PUSH_MARKER_TTL_MS, String(ttl));
    });

    test("without it, the push ioredis sends again lands twice (the control)", async () => {
      const q = new Rotator(relayed, uniqueName("plain"));
      await q.push("warm-up");
      relay.loseReplyTo = "lost-2";
      assert.equal(await q.push("lost-2"), 1);
      assert.deepEqual(await waiting(q), ["lost-2", "lost-2", "warm-up"]);
      assert.deepEqual(await direct.keys(pushMarker(q.keys, "*")), []);
    });

    /** The payloads waiting in a group's ring, one entry per copy, sorted. */
    const messages = async (topic: Topic, group: string): Promise<string[]> => {
      const ids = (await direct.lrange(topic.groupKeys(group).all[0]!, 0, -1)).filter((e) => !e.includes("*"));
      return ids.length === 0 ? [] : ((await direct.hmget(topic.keys.all[3]!, ...ids)) as string[]).sort();
    };

    test("idempotentPublishes: a publish sent again by ioredis publishes nothing twice", async () => {
      const topic = new Topic(relayed, uniqueName("marked-topic"), { idempotentPublishes: true });
      for (const group of ["a", "b"]) await topic.subscribe(group);
      await topic.publish("warm-up");
      relay.loseReplyTo = "lost-3";
      const lost = relay.lost;
      const ids = await topic.publish("lost-3", "b");
      assert.deepEqual(ids.map(messageSeq), [2, 3]); // the ids the first run published
      assert.equal(relay.lost, lost + 1);
      for (const group of ["a", "b"]) assert.deepEqual(await messages(topic, group), ["b", "lost-3", "warm-up"]);
      const markers = await direct.keys(publishMarker(topic.keys, "*"));
      assert.equal(markers.length, 2); // one a publish call
      const ttl = await direct.pttl(markers[0]!);
      assert.ok(ttl > 0 && ttl <= PUSH_MARKER_TTL_MS, String(ttl));
    });

    test("without it, the publish ioredis sends again is published twice (the control)", async () => {
      const topic = new Topic(relayed, uniqueName("plain-topic"));
      await topic.subscribe("a");
      await topic.publish("warm-up");
      relay.loseReplyTo = "lost-4";
      assert.deepEqual((await topic.publish("lost-4")).map(messageSeq), [3]);
      assert.deepEqual(await messages(topic, "a"), ["lost-4", "lost-4", "warm-up"]);
      assert.deepEqual(await direct.keys(publishMarker(topic.keys, "*")), []);
    });

    test("pushes with a time, a priority or payloads go as `once` under a marker; unique ones without", async () => {
      const q = new Rotator(direct, uniqueName("options"), { idempotentPushes: true });
      assert.equal(await q.push("later", { delay: 60 }), 1);
      assert.equal(await q.push("urgent", { priority: 3 }), 1);
      assert.equal((await direct.keys(pushMarker(q.keys, "*"))).length, 2);
      assert.equal((await q.stats()).scheduled, 1);
      assert.deepEqual((await q.next({ count: 10 })).map((job) => job.id), ["urgent"]);
      const u = new Rotator(direct, uniqueName("unique"), { idempotentPushes: true });
      await u.configure({ trackIds: true });
      assert.equal(await u.push("a", { unique: true }), 1);
      assert.deepEqual(await direct.keys(pushMarker(u.keys, "*")), []);
    });

    test("idempotentPushes: a payload push or a prioritized one sent again by ioredis lands once", async () => {
      const q = new Rotator(relayed, uniqueName("marked-payloads"), { payloads: true, idempotentPushes: true });
      await q.push("warm-up");
      relay.loseReplyTo = "lost-5";
      const lost = relay.lost;
      assert.equal(await q.pushPayloads({ "lost-5": "body", b: "other" }), 2);
      relay.loseReplyTo = "lost-6";
      assert.equal(await q.push("lost-6", { priority: 4 }), 1);
      assert.equal(relay.lost, lost + 2);
      assert.equal(await direct.hlen(q.keys.payloads), 2);
      const claimed = (await new Rotator(direct, q.name, { payloads: true }).next({ count: 10 })).map((job) => job.id);
      assert.deepEqual(claimed.sort(), ["b", "lost-5", "lost-6", "warm-up"]); // each once
    });
  });
}
