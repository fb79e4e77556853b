/**
 * Topics: each message published once reaches every registered consumer group, as
 * rotator/topic.py (and TopicFlows in rotator/flows.py) have them.
 *
 * A topic keeps each payload once (its bodies), in an ordered log of message ids
 * ("<ms>-<seq>"), and a registry of groups. Each group is an ordinary rotator ring inside
 * the topic's hash tag, so a group is consumed like any queue (TopicGroup is a Rotator): one
 * message goes to one consumer of each group at a time, leased, acked, given back.
 *
 * A publish is one module call that stores the payloads and pushes their ids onto every
 * registered group's ring. It names every group's keys; the module refuses it (ROTATOR_STALE,
 * GroupsChanged here, nothing written) when the groups it names are not the registered ones,
 * and publish reads the groups again and retries. Retention (a count and/or an age), not
 * acks, decides when a payload goes; a message that left retention before a group consumed
 * it reaches that group with payload null.
 */
import { GroupsChanged, InvalidArgument } from "./errors";
import { randomUUID } from "node:crypto";
import {
  type QueueKeys, type TopicKeys, DEFAULT_PREFIX, groupKeys, keyOf, publishMarker, topicKeys, validateGroupName,
} from "./keys";
import { MAX_BATCH, chunks, encodePayload, secondsToMs, whole } from "./protocol";
import { PUSH_MARKER_TTL_MS, Rotator, type RotatorOptions } from "./rotator";
import { type Arg, type Client, ModuleCaller } from "./script";

/** Messages a topic keeps by default (rotator.defaults.DEFAULT_TOPIC_RETENTION). */
export const DEFAULT_TOPIC_RETENTION = 100_000;
/** Messages per atomic publish call. */
export const MAX_PUBLISH = 1000;
/** Retained messages one trim call drops at most (about 3 ms of server time). */
export const MAX_TRIM_BUDGET = 2000;
/** Times a call naming every group is retried while the groups keep changing. */
export const TOPIC_STALE_RETRIES = 50;
export const MAX_RETENTION_COUNT = 1e12;
export const MAX_RETENTION_SECONDS = 10 * 365 * 86_400;

/** How much a topic keeps: at most `count` messages (default 100000, as Python's Retention)
 * and/or none older than `age` seconds; null: no limit by that measure. At least one limit
 * must remain, so the topic's memory is bounded. */
export interface Retention {
  count?: number | null;
  age?: number | null;
}

export interface TopicOptions {
  retention?: Retention;
  /** Key prefix before the {name} hash tag (default "rotator"). */
  prefix?: string;
  /** How the module is called, as RotatorOptions.functions says. */
  functions?: boolean;
  /** A publish goes as tpublish_chunk under a marker of its own (a small hash under the
   * topic's tag, kept a minute), so that a publish ioredis sends again after its reply was
   * lost publishes nothing twice and resolves to the ids its first run published: as
   * RotatorOptions.idempotentPushes for pushes, and Python's Topic(retry_for=...). Off by
   * default: a publish is then one `tpublish`. */
  idempotentPublishes?: boolean;
}

/** Where a new group starts: "latest" (messages published from now on), "earliest" (every
 * retained message too) or a message id (the retained messages from it on). */
export type Start = "latest" | "earliest" | string;

/** One group's counts in a topic's stats (pending is its backlog). */
export interface GroupStats {
  length: number;
  pending: number;
  inFlight: number;
  done: number;
  deferred: number;
  dead: number;
  /** -1 when nothing is pending. */
  oldestPendingAgeMs: number;
  /** Leases past their deadline, not yet taken back (counted up to a cap). */
  overdue: number;
  overdueCapped: boolean;
}

/** A topic's counts, read in one atomic call. */
export interface TopicStats {
  /** Messages in the log (and payloads kept). */
  retained: number;
  /** Payload bytes retained. */
  bytes: number;
  /** Seq of the last message published (0 before the first). */
  lastSeq: number;
  /** Per registered group, by name. */
  groups: Record<string, GroupStats>;
}

/** The fields of a group's stats, in the order tstats sends them (rotator.commands.STATS_FIELDS). */
const GROUP_FIELDS = [
  "length", "pending", "inFlight", "done", "deferred", "dead", "oldestPendingAgeMs", "overdue", "overdueCapped",
] as const;

/** A tstats reply {"retained", n, "bytes", n, "last_seq", n, "groups", g, then per group:
 * its name and the nine values of GROUP_FIELDS}. */
export function decodeTopicStats(reply: unknown): TopicStats {
  const raw = reply as Array<string | number>;
  const head: Record<string, number> = {};
  for (let i = 0; i + 1 < 8; i += 2) head[String(raw[i])] = Number(raw[i + 1]);
  const groups: Record<string, GroupStats> = {};
  const step = GROUP_FIELDS.length + 1;
  for (let i = 8; i + step <= raw.length; i += step) {
    const stats: Record<string, number> = {};
    GROUP_FIELDS.forEach((field, k) => (stats[field] = Number(raw[i + 1 + k])));
    groups[String(raw[i])] = { ...stats, overdueCapped: stats["overdueCapped"] === 1 } as unknown as GroupStats;
  }
  return { retained: head["retained"] ?? 0, bytes: head["bytes"] ?? 0, lastSeq: head["last_seq"] ?? 0, groups };
}

const MESSAGE_ID = /^([0-9]{1,15})-([0-9]{1,15})$/;

/** The seq of a message id "<ms>-<seq>". */
export function messageSeq(messageId: string): number {
  const found = typeof messageId === "string" ? MESSAGE_ID.exec(messageId) : null;
  if (found === null) throw new InvalidArgument(`not a message id (<ms>-<seq>): ${JSON.stringify(messageId)}`);
  return Number(found[2]);
}

/** [MAXLEN, MAXAGE_MS] of a retention, 0 meaning no limit; refuses no limit at all. */
export function retentionArgs(retention: Retention): [number, number] {
  const wanted = retention.count === undefined ? DEFAULT_TOPIC_RETENTION : retention.count;
  const count = wanted === null ? 0 : whole(wanted, "count", 1, MAX_RETENTION_COUNT);
  const age = retention.age == null ? 0 : secondsToMs(retention.age, "age", { limit: MAX_RETENTION_SECONDS });
  if (count === 0 && age === 0) throw new InvalidArgument("retention needs a count, an age or both");
  return [count, age];
}


/** One consumer group's view of a topic: the Rotator API over the group's ring, with each
 * job's payload (the message) read in the same call as the lease; Job.id is the message id.
 * Acks leave payloads alone (the topic's retention owns them); delete empties the group's
 * ring (it stays registered). */
export class TopicGroup extends Rotator {
  constructor(
    redis: Client,
    readonly topic: TopicKeys,
    readonly group: string,
    options: Omit<RotatorOptions, "keys" | "payloads" | "keepPayloads" | "prefix"> = {},
  ) {
    super(redis, topic.name, { ...options, keys: groupKeys(topic, group), payloads: true, keepPayloads: true });
  }
}

/** A topic on one Redis or Valkey server (or Redis Cluster: all its keys and its groups'
 * keys share the hash tag {name}). */
export class Topic {
  readonly name: string;
  readonly keys: TopicKeys;
  readonly retention: Retention;
  readonly idempotentPublishes: boolean;
  private readonly maxLen: number;
  private readonly maxAgeMs: number;
  private readonly module: ModuleCaller;
  /** The KEYS of a call naming every group, as last read: reused until the module says the
   * groups changed (ROTATOR_STALE, nothing written), which it checks on every call. */
  private everyGroup: string[] | null = null;

  constructor(
    readonly redis: Client,
    name: string,
    options: TopicOptions = {},
  ) {
    this.keys = topicKeys(name, options.prefix ?? DEFAULT_PREFIX);
    this.name = name;
    this.retention = options.retention ?? {};
    [this.maxLen, this.maxAgeMs] = retentionArgs(this.retention);
    this.idempotentPublishes = options.idempotentPublishes ?? false;
    this.module = new ModuleCaller(redis, options.functions);
  }

  /** One raw module call on the topic's keys (and more, given). */
  call(args: readonly Arg[], keys: readonly string[] = this.keys.all): Promise<unknown> {
    return this.module.call(keys, args);
  }

  /** Group `group`'s thirteen queue keys. */
  groupKeys(group: string): QueueKeys {
    return groupKeys(this.keys, group);
  }

  private withGroup(group: string): string[] {
    return [...this.keys.all, ...this.groupKeys(group).all];
  }

  /** A call naming every registered group (the topic's keys, then each group's thirteen,
   * sorted by name, then `after`) as last read, reading the groups again while the module says
   * they changed. */
  private async withEveryGroup(args: readonly Arg[], after: readonly string[] = []): Promise<unknown> {
    for (let attempt = 0; attempt < TOPIC_STALE_RETRIES; attempt += 1) {
      let keys = this.everyGroup;
      if (keys === null) {
        keys = [...this.keys.all];
        for (const group of await this.groups()) keys.push(...this.groupKeys(group).all);
      }
      try {
        const reply = await this.call(args, [...keys, ...after]);
        this.everyGroup = keys;
        return reply;
      } catch (error) {
        if (!(error instanceof GroupsChanged)) throw error;
        this.everyGroup = null;
      }
    }
    throw new GroupsChanged(`topic ${JSON.stringify(this.name)}: groups kept changing during the call`);
  }

  // -- groups ----------------------------------------------------------------------------

  /** True once a group was registered or a message published, until delete. */
  async exists(): Promise<boolean> {
    return Number(await this.redis.exists(this.keys.all[0] as string, this.keys.all[1] as string)) > 0;
  }

  /** The registered group names, sorted. */
  async groups(): Promise<string[]> {
    const names = await this.redis.hkeys(this.keys.all[1] as string);
    return names.map(String).sort();
  }

  /** Registers `group`; resolves to false if it already was (then nothing changes). Every
   * publish after it reaches the group; with start "earliest" or a message id, the retained
   * messages from there are pushed onto its ring too (calls of up to 5000). */
  async subscribe(group: string, options: { start?: Start } = {}): Promise<boolean> {
    validateGroupName(group);
    const start = options.start ?? "latest";
    const first = start === "latest" ? null : start === "earliest" ? 0 : messageSeq(start);
    const [added, lastSeq] = (await this.call(["tsubscribe", group], this.withGroup(group))) as [number, number];
    this.everyGroup = null;
    // Messages after lastSeq reach the group by publishing (0: there were none before).
    if (Number(added) === 1 && first !== null && Number(lastSeq) > 0) {
      await this.replaySeqs(group, first, Number(lastSeq));
    }
    return Number(added) === 1;
  }

  /** Forgets `group` and deletes its ring (its pending and leased messages). */
  async unsubscribe(group: string): Promise<boolean> {
    validateGroupName(group);
    const reply = Number(await this.call(["tunsubscribe", group], this.withGroup(group))) === 1;
    this.everyGroup = null;
    const ring = keyOf(this.groupKeys(group), "ring");
    await this.redis.unlink(`${ring.slice(0, ring.lastIndexOf(":"))}:workers`); // as Python's
    return reply;
  }

  /** The consumer of `group` (options as for Rotator: timeout, maxDeliveries, ...). It does
   * not register the group: subscribe once first. */
  group(group: string, options: Omit<RotatorOptions, "keys" | "payloads" | "keepPayloads" | "prefix"> = {}): TopicGroup {
    validateGroupName(group);
    return new TopicGroup(this.redis, this.keys, group, options);
  }

  // -- publishing ------------------------------------------------------------------------

  /** Publishes messages in order to every registered group; resolves to their ids
   * ("<ms>-<seq>"). Each call of up to 1000 messages is atomic: payloads stored, ids logged
   * and pushed onto every group's ring together, then retention applied. */
  async publish(...payloads: Array<string | Buffer>): Promise<string[]> {
    const raw = payloads.map(encodePayload);
    const ids: string[] = [];
    const marker = this.idempotentPublishes ? [publishMarker(this.keys, randomUUID().replaceAll("-", ""))] : [];
    let index = 0;
    for (const part of chunks(raw, MAX_PUBLISH)) {
      const retention = [this.maxLen, this.maxAgeMs, ...part];
      const args = marker.length > 0 ? ["tpublish_chunk", index++, PUSH_MARKER_TTL_MS, ...retention] : ["tpublish", ...retention];
      const reply = (await this.withEveryGroup(args, marker)) as string[];
      ids.push(...reply.map(String));
    }
    return ids;
  }

  // -- replay and retention --------------------------------------------------------------

  /** Pushes the retained messages from `fromId` (inclusive) or from `fromTime` (a Date or
   * unix seconds, inclusive) up to the latest onto `group`'s ring again; resolves to how
   * many. Messages published meanwhile reach the group by publishing, not twice. */
  async replay(group: string, from: { fromId?: string; fromTime?: Date | number }): Promise<number> {
    validateGroupName(group);
    if ((from.fromId === undefined) === (from.fromTime === undefined)) {
      throw new InvalidArgument("give exactly one of fromId and fromTime");
    }
    let first: number;
    if (from.fromId !== undefined) {
      first = messageSeq(from.fromId);
    } else {
      const at = from.fromTime instanceof Date ? from.fromTime.getTime() / 1000 : from.fromTime;
      if (typeof at !== "number" || !Number.isFinite(at)) {
        throw new InvalidArgument(`fromTime must be a Date or unix seconds, got ${String(from.fromTime)}`);
      }
      const ms = whole(Math.trunc(Math.max(at, 0) * 1000), "fromTime", 0, 1e15);
      first = Number(await this.call(["tseek", ms]));
    }
    return this.replaySeqs(group, first, 0);
  }

  private async replaySeqs(group: string, first: number, last: number): Promise<number> {
    const keys = this.withGroup(group);
    let pushed = 0;
    for (;;) {
      const [done, next, to] = ((await this.call(["treplay", group, first, last, MAX_BATCH], keys)) as number[]).map(Number) as [
        number,
        number,
        number,
      ];
      pushed += done;
      first = next;
      last = to;
      if (first > last || done === 0) return pushed;
    }
  }

  /** Applies retention now (publishing also does); resolves to how many messages left.
   * Runs in calls of up to 2000 messages each. */
  async trim(): Promise<number> {
    let dropped = 0;
    for (;;) {
      const gone = Number(await this.call(["ttrim", this.maxLen, this.maxAgeMs, MAX_TRIM_BUDGET]));
      dropped += gone;
      if (gone < MAX_TRIM_BUDGET) return dropped;
    }
  }

  /** How many message ids left `group`'s backlog unconsumed (dropped by its backlog bound,
   * the retained count, never delivered to that group). */
  async expired(group: string): Promise<number> {
    return Number((await this.redis.hget(keyOf(this.groupKeys(group), "meta"), "expired")) ?? 0);
  }

  // -- inspecting ------------------------------------------------------------------------

  /** Retained count and bytes, and each group's counts, in one atomic call. */
  async stats(): Promise<TopicStats> {
    return decodeTopicStats(await this.withEveryGroup(["tstats"]));
  }

  /** Unsubscribes every group and removes the topic's keys. */
  async delete(): Promise<void> {
    for (const group of await this.groups()) await this.unsubscribe(group);
    await this.redis.del(...this.keys.all);
  }
}
