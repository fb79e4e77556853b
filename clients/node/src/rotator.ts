/**
 * Rotator: one queue, from Node. Every method is one module call (or a few, for big
 * batches), each atomic on the server. Jobs are leased, never popped: a job whose lease runs
 * out without an ack is delivered again, so a crashed worker loses nothing.
 */
import { randomUUID } from "node:crypto";
import type { Redis } from "ioredis";
import { InvalidArgument, JobCancelled, LeaseLost, errorFromReply } from "./errors";
import { type QueueKeys, DEFAULT_PREFIX, keyOf, pushMarker, queueKeys } from "./keys";
import {
  type Job,
  type JobRef,
  type NextReply,
  Batches,
  MAX_BATCH,
  MAX_BUDGET,
  MAX_COUNT,
  MAX_DELIVERIES_LIMIT,
  MAX_SCHEDULE_SECONDS,
  checkError,
  chunks,
  decodeNextPacked,
  decodeNextPackedPayloads,
  encodeId,
  encodePayload,
  encodeToken,
  secondsToMs,
  whole,
} from "./protocol";
import { type Schedule, type ScheduleOptions, checkName, decodeSchedules, intervalSchedule } from "./schedules";
import { type Arg, type Client, ModuleCaller, type Replies, isNotLoaded } from "./script";
import { type WorkOptions, type WorkSummary, type Handler, work } from "./worker";

/** Seconds a consumer holds a job before others may take it back. */
export const DEFAULT_LEASE_TIMEOUT = 30;
/** Elements one next call may visit; bounds the time a single script runs. */
export const DEFAULT_BUDGET = 1000;
/** Ids sent per push call; each call is all-or-nothing. */
export const DEFAULT_PUSH_CHUNK = 1000;

export type JobId = string | number;

export interface RotatorOptions {
  /** Lease length in seconds (default 30). */
  timeout?: number;
  /** Deliveries after which a job goes to the dead letters (default: no limit). */
  maxDeliveries?: number;
  /** Asked about every reclaimed job before it is handed out again: true means "already
   * done", and the job is acked instead. */
  idempotency?: (id: string) => boolean | Promise<boolean>;
  /** Elements one next visits at most (1..1000, default 1000). */
  budget?: number;
  /** Key prefix before the {name} hash tag (default "rotator"). */
  prefix?: string;
  /** Keys to use instead of the queue's own (a topic group). */
  keys?: QueueKeys;
  /** Keep a payload per job id (pushPayloads): next returns it with each job in the same
   * call (nextp_packed), and an accepted ack deletes it (ackp). A topic group's payloads are
   * its messages. */
  payloads?: boolean;
  /** Acks keep the payloads (a topic group's: they belong to the topic's retention). */
  keepPayloads?: boolean;
  /** true: call the module by FCALL of its function library; false: by EVALSHA. Left out:
   * FCALL where the server and the ACL allow it (chosen at the client's first call), else
   * EVALSHA; always EVALSHA on a Cluster client. */
  functions?: boolean;
  /** A push goes under a marker of its own (a small hash under the queue's tag, kept a
   * minute): a plain one as push_chunk, one with a delay, a time, a priority or payloads as
   * its own command after `once`; so a push sent again after its reply was lost pushes
   * nothing twice and resolves to what it pushed (a unique push needs no marker). ioredis sends
   * again, after it reconnects, every command whose reply it had not read
   * (autoResendUnfulfilledCommands, on by default): without this, such a push lands twice.
   * Off by default, as rotator's Python retry_for: a plain push is then one `push`. */
  idempotentPushes?: boolean;
}

/** How long a push's marker is kept (ms): as rotator.retries.MARKER_TTL. */
export const PUSH_MARKER_TTL_MS = 60_000;

export interface PushOptions {
  /** Seconds from now (server time) before the jobs may be delivered. */
  delay?: number;
  /** When the jobs may be delivered: a Date or unix seconds. */
  at?: Date | number;
  /** The queue tracks ids and the caller counts on each id being held once (NotTracked if
   * the queue does not track them). */
  unique?: boolean;
  /** 0 (default, the most urgent) .. 9: jobs at 1..9 wait behind every pending job of a
   * lower level (push_priority). */
  priority?: number;
}

export interface NextOptions {
  /** Jobs to lease at most (1..1000, default 1). */
  count?: number;
  /** Seconds to wait for work when there is none; undefined: do not wait. */
  block?: number;
  /** Jobs to ack in the same call before claiming. */
  ack?: readonly JobRef[];
}

/** A claim's jobs, and how many of the jobs it was to ack were accepted. */
export interface Claim {
  jobs: Job[];
  /** Distinct deliveries of `ack` accepted (a lease lost meanwhile is refused). */
  acked: number;
}

export interface Stats {
  length: number;
  pending: number;
  inFlight: number;
  done: number;
  deferred: number;
  dead: number;
  /** -1 when nothing is pending. */
  oldestPendingAgeMs: number;
  overdue: number;
  overdueCapped: boolean;
  scheduled: number;
  paused: boolean;
  schedules: number;
  rateLimitJobs: number;
  rateLimitMs: number;
  pushed: number;
  delivered: number;
  completed: number;
  retried: number;
  reclaimed: number;
  deadLettered: number;
  cancelled: number;
  /** Every field of the reply, as the module names it (d0..d25 and dsum among them). */
  raw: Record<string, number>;
}

function camel(name: string): string {
  return name.replace(/_([a-z])/g, (_, c: string) => c.toUpperCase());
}

/** Flat {name, value, ...} pairs as an object. */
export function pairs(reply: unknown): Record<string, number> {
  const flat = reply as Array<string | number>;
  const out: Record<string, number> = {};
  for (let i = 0; i + 1 < flat.length; i += 2) out[String(flat[i])] = Number(flat[i + 1]);
  return out;
}

export function decodeStats(reply: unknown): Stats {
  const raw = pairs(reply);
  const stats: Record<string, unknown> = { raw };
  for (const [name, value] of Object.entries(raw)) {
    if (!/^d(\d+|sum)$/.test(name)) stats[camel(name)] = value;
  }
  stats["paused"] = raw["paused"] === 1;
  stats["overdueCapped"] = raw["overdue_capped"] === 1;
  return stats as unknown as Stats;
}

export class Rotator {
  readonly name: string;
  readonly keys: QueueKeys;
  /** Lease length in seconds. */
  readonly timeout: number;
  readonly leaseMs: number;
  /** 0: no limit. */
  readonly maxDeliveries: number;
  readonly budget: number;
  readonly payloads: boolean;
  /** An accepted ack deletes the job's payload: a queue with payloads, not a topic group. */
  readonly dropsPayloads: boolean;
  readonly idempotency: ((id: string) => boolean | Promise<boolean>) | undefined;
  readonly idempotentPushes: boolean;
  private readonly module: ModuleCaller;
  private readonly batches = new Batches();
  private blocker: Client | undefined;

  constructor(
    readonly redis: Client,
    name: string,
    options: RotatorOptions = {},
  ) {
    this.keys = options.keys ?? queueKeys(name, options.prefix ?? DEFAULT_PREFIX);
    this.name = name;
    this.timeout = options.timeout ?? DEFAULT_LEASE_TIMEOUT;
    this.leaseMs = secondsToMs(this.timeout, "timeout");
    this.maxDeliveries =
      options.maxDeliveries === undefined ? 0 : whole(options.maxDeliveries, "maxDeliveries", 1, MAX_DELIVERIES_LIMIT);
    this.budget = whole(options.budget ?? DEFAULT_BUDGET, "budget", 1, MAX_BUDGET);
    this.payloads = options.payloads ?? false;
    this.dropsPayloads = this.payloads && !(options.keepPayloads ?? false);
    this.idempotency = options.idempotency;
    this.idempotentPushes = options.idempotentPushes ?? false;
    this.module = new ModuleCaller(redis, options.functions);
  }

  /** One module call on this queue's thirteen keys (or more, given). */
  call(args: readonly Arg[], keys: readonly string[] = this.keys.all): Promise<unknown> {
    return this.module.call(keys, args);
  }

  private get payloadKeys(): string[] {
    return [...this.keys.all, this.keys.payloads];
  }

  // -- producing -------------------------------------------------------------------------

  /** Appends jobs (a batch of up to 1000 ids is all-or-nothing); resolves to how many were
   * taken. The last argument may be options: {delay} or {at} schedules the jobs for later;
   * {unique} says the queue must track ids. */
  push(...ids: JobId[]): Promise<number>;
  push(...args: [...ids: JobId[], options: PushOptions]): Promise<number>;
  async push(...args: Array<JobId | PushOptions>): Promise<number> {
    const last = args[args.length - 1];
    const options: PushOptions =
      typeof last === "object" && last !== null ? (args.pop() as PushOptions) : {};
    const ids = (args as unknown[]).map(encodeId);
    const head: Arg[] = options.unique ? ["unique"] : [];
    const due = dueArgs(options);
    let pushed = 0;
    const priority = whole(options.priority ?? 0, "priority", 0, 9);
    const marker = this.pushMarker(options.unique);
    if (marker !== null && due === null && priority === 0) {
      const marked = [...this.keys.all, marker];
      let index = 0;
      for (const part of chunks(ids, DEFAULT_PUSH_CHUNK)) {
        const reply = (await this.call(["push_chunk", index++, PUSH_MARKER_TTL_MS, ...part], marked)) as unknown[];
        // [pushed now, chunks, what the first try pushed when this is a chunk sent again]
        pushed += Number(reply[0]) || Number(reply[2]);
      }
      return pushed;
    }
    let index = 0;
    for (const part of chunks(ids, DEFAULT_PUSH_CHUNK)) {
      const command: Arg[] =
        priority > 0
          ? ["push_priority", priority, ...(due ?? ["IN", 0])]
          : due === null
            ? ["push"]
            : ["push_later", ...due];
      pushed += Number(await this.callOnce(marker, index++, [...head, ...command, ...part], this.keys.all));
    }
    return pushed;
  }

  /** A new push call's marker where pushes are idempotent (idempotentPushes), but for a
   * unique push, which the id index makes harmless twice; else null. */
  private pushMarker(unique: boolean | undefined): string | null {
    return this.idempotentPushes && !unique ? pushMarker(this.keys, randomUUID().replaceAll("-", "")) : null;
  }

  /** A push command on `keys`, as chunk `index` of the push under `marker` ("once CHUNK
   * TTL_MS", the marker after the keys) where there is one: sent again, it pushes nothing. */
  private callOnce(marker: string | null, index: number, args: Arg[], keys: readonly string[]): Promise<unknown> {
    if (marker === null) return this.call(args, keys);
    return this.call(["once", index, PUSH_MARKER_TTL_MS, ...args], [...keys, marker]);
  }

  /** Adds jobs with payloads ({ id: payload }, a Map, or [id, payload] pairs; strings or
   * Buffers, kept byte for byte) on a queue made with { payloads: true }; resolves to how
   * many were taken. Up to 2500 jobs a call are all-or-nothing; pushing an id again replaces
   * its payload. Options: { delay } or { at } schedule them (the payloads are stored now),
   * { unique } as for push. */
  async pushPayloads(
    items: Record<string, string | Buffer> | Map<JobId, string | Buffer> | ReadonlyArray<readonly [JobId, string | Buffer]>,
    options: Omit<PushOptions, "priority"> = {},
  ): Promise<number> {
    if (!this.dropsPayloads) {
      throw new InvalidArgument(
        this.payloads ? "publish to the topic instead of pushing payloads to a group" : "pushPayloads needs a queue made with { payloads: true }",
      );
    }
    if ((options as PushOptions).priority) throw new InvalidArgument("jobs with payloads take no priority");
    const entries = items instanceof Map || Array.isArray(items) ? [...items] : Object.entries(items);
    const pairs = entries.map(([id, payload]) => [encodeId(id), encodePayload(payload)] as const);
    const due = dueArgs(options);
    const head: Arg[] = options.unique ? ["unique"] : [];
    const command: Arg[] = due === null ? ["pushp"] : ["pushp_later", ...due];
    let pushed = 0;
    const marker = this.pushMarker(options.unique);
    let index = 0;
    for (const part of chunks(pairs, MAX_BATCH / 2)) {
      const flat = part.flatMap(([id, payload]) => [id, payload]);
      pushed += Number(await this.callOnce(marker, index++, [...head, ...command, ...flat], this.payloadKeys));
    }
    return pushed;
  }

  /** Removes jobs by id on a queue that tracks ids (configure({ trackIds: true })): how many
   * were found scheduled, waiting or in flight. */
  async cancel(...ids: JobId[]): Promise<number> {
    let found = 0;
    for (const part of chunks(ids.map(encodeId), MAX_BATCH)) {
      found += Number(await this.call(["cancel", ...part]));
    }
    return found;
  }

  // -- consuming -------------------------------------------------------------------------

  /**
   * Leases up to `count` jobs for `timeout` seconds; [] when there are none (after waiting
   * up to `block` seconds, without polling: pushes wake blocked consumers). `ack` jobs are
   * acked in the same call first. Uses next_packed: a call's first deliveries come back as
   * one packed element, and acking them all later goes as one batch ack.
   */
  async next(options: NextOptions = {}): Promise<Job[]> {
    return (await this.claim(options)).jobs;
  }

  /**
   * next, also saying how many of the `ack` jobs were accepted: the reply's count, in
   * deliveries (a batch ack accepted counts its jobs; when one was refused, its tokens are
   * acked one by one and that call's count is taken, as ack does).
   */
  async claim(options: NextOptions = {}): Promise<Claim> {
    const count = whole(options.count ?? 1, "count", 1, MAX_COUNT);
    const refs = (options.ack ?? []).map(encodeToken);
    let { args: acks, packed, jobs: named } = this.packed(refs);
    let acked: number | null = null; // of the caller's acks: the first call's
    const block = options.block;
    if (block !== undefined && (typeof block !== "number" || !Number.isFinite(block) || block < 0)) {
      throw new InvalidArgument(`block must be a finite number of seconds >= 0, got ${String(block)}`);
    }
    const giveUp = block === undefined ? null : Date.now() + block * 1000;
    let wakeWait: number | null = null;
    for (;;) {
      const args = this.nextArgs(count, acks);
      const raw =
        wakeWait === null ? await this.module.call(this.nextKeys, args, this.replies) : await this.afterWake(wakeWait, args);
      const reply: NextReply = this.payloads ? decodeNextPackedPayloads(raw) : decodeNextPacked(raw);
      wakeWait = null;
      if (acked === null) {
        if (!packed) acked = reply.acked;
        else if (reply.acked < acks.length) acked = await this.ackTokens(refs, false); // a batch ack was refused
        else acked = named;
      }
      packed = false;
      this.batches.note(reply);
      const { keep, finished } = await this.screen(reply.jobs);
      acks = finished;
      if (keep.length > 0) {
        if (finished.length > 0) await this.ackTokens(finished, false);
        return { jobs: keep, acked };
      }
      if (acks.length > 0 || !reply.idle) continue;
      if (giveUp === null) return { jobs: [], acked };
      const remaining = (giveUp - Date.now()) / 1000;
      if (remaining <= 0) return { jobs: [], acked };
      wakeWait = reply.waitMs < 0 ? remaining : Math.min(remaining, reply.waitMs / 1000);
    }
  }

  /** How a claim's reply is read: its payloads byte for byte (a payload need not be UTF-8). */
  private get replies(): Replies {
    return this.payloads ? "buffers" : "strings";
  }

  private get nextKeys(): readonly string[] {
    return this.payloads ? this.payloadKeys : this.keys.all;
  }

  private nextArgs(count: number, acks: readonly string[]): Arg[] {
    const head = [count, this.leaseMs, this.budget, this.maxDeliveries];
    // DROP 1: the acks delete the payloads; a topic group's keep them (DROP 0: they belong
    // to the topic's retention).
    if (!this.payloads) return ["next_packed", ...head, ...acks];
    return ["nextp_packed", ...head, this.dropsPayloads ? 1 : 0, ...acks];
  }

  /** The acks for `tokens`: whole batches as batch acks, named where the acks drop payloads
   * (the module needs the ids). */
  private packed(tokens: readonly string[]): { args: string[]; packed: boolean; jobs: number } {
    return this.batches.pack(tokens, this.dropsPayloads);
  }

  /** Blocks on the wake list, then calls the module, in one round trip on a connection of
   * its own (a blocked BLPOP would hold up every other command on a shared one). */
  private async afterWake(seconds: number, args: readonly Arg[]): Promise<unknown> {
    this.blocker ??= (this.redis as Redis).duplicate();
    const keys = this.nextKeys;
    const pipeline = this.blocker.pipeline().blpop(keyOf(this.keys, "wake"), Math.max(seconds, 0.01).toFixed(3));
    const results = await this.module.pipelined(pipeline, keys, args, this.replies).exec();
    const [woken, reply] = results ?? [];
    if (woken?.[0]) throw woken[0];
    if (reply?.[0]) {
      if (isNotLoaded(reply[0])) return this.module.call(keys, args, this.replies);
      throw errorFromReply(reply[0]);
    }
    return reply?.[1];
  }

  /** Splits reclaimed jobs the idempotency callback says are done from the rest. */
  private async screen(jobs: Job[]): Promise<{ keep: Job[]; finished: string[] }> {
    if (this.idempotency === undefined) return { keep: jobs, finished: [] };
    const keep: Job[] = [];
    const finished: string[] = [];
    for (const job of jobs) {
      if (job.reclaimed && (await this.idempotency(job.id))) finished.push(job.token);
      else keep.push(job);
    }
    return { keep, finished };
  }

  /** Completes leases: resolves to how many were accepted (a token whose lease was lost is
   * refused, not an error). Whole batches go as one batch ack each. */
  async ack(...jobs: JobRef[]): Promise<number> {
    return this.ackTokens(jobs.map(encodeToken), true);
  }

  private async ackTokens(tokens: readonly string[], pack: boolean): Promise<number> {
    if (tokens.length === 0) return 0;
    const distinct = [...new Set(tokens)];
    const { args, packed, jobs } = pack ? this.packed(distinct) : { args: distinct, packed: false, jobs: 0 };
    let accepted = 0;
    for (const part of chunks(args, MAX_BATCH)) {
      // ackp deletes the payloads of what it accepts; a topic group's acks keep them
      accepted += Number(
        this.dropsPayloads ? await this.call(["ackp", ...part], this.payloadKeys) : await this.call(["ack", ...part]),
      );
    }
    if (!packed) return accepted;
    if (accepted < args.length) return this.ackTokens(tokens, false); // a batch ack was refused
    return jobs;
  }

  /** Gives a lease back: the job is delivered again after `delay` seconds (default 0).
   * Resolves to how many were given back (0: the lease was lost). */
  async nack(jobs: JobRef | readonly JobRef[], options: { delay?: number } = {}): Promise<number> {
    const tokens = (Array.isArray(jobs) ? jobs : [jobs]).map(encodeToken);
    const delayMs = secondsToMs(options.delay ?? 0, "delay", { allowZero: true });
    this.batches.forget(tokens);
    let given = 0;
    for (const part of chunks(tokens, MAX_BATCH)) {
      const flags = (await this.call(["nack", delayMs, ...part])) as number[];
      given += flags.filter((flag) => Number(flag) === 1).length;
    }
    return given;
  }

  /** Sends held jobs to the dead letters now, with `error`: how many were buried. */
  async bury(jobs: JobRef | readonly JobRef[], error: string): Promise<number> {
    const tokens = (Array.isArray(jobs) ? jobs : [jobs]).map(encodeToken);
    const message = checkError(error);
    this.batches.forget(tokens);
    let buried = 0;
    for (const part of chunks(tokens, MAX_BATCH)) {
      const flags = (await this.call(["bury", message, ...part])) as number[];
      buried += flags.filter((flag) => Number(flag) === 1).length;
    }
    return buried;
  }

  /** Moves a lease's deadline to `seconds` from now (default: the queue's timeout);
   * resolves to the new deadline in unix ms. LeaseLost if the lease was lost, JobCancelled
   * (a LeaseLost) if its job was cancelled. */
  async extend(job: JobRef, seconds?: number): Promise<number> {
    const token = encodeToken(job);
    const [deadline, [state]] = await this.extendMany([token], seconds);
    if (state === -1) throw new JobCancelled(`the job of lease ${token} was cancelled`);
    if (state !== 1) throw new LeaseLost(`lease ${token} was lost`);
    return deadline;
  }

  /** Extends many leases in one call: [deadline ms, per job 1 (kept), 0 (lost) or -1
   * (cancelled)]. */
  async extendMany(jobs: readonly JobRef[], seconds?: number): Promise<[number, number[]]> {
    const leaseMs = seconds === undefined ? this.leaseMs : secondsToMs(seconds, "seconds");
    const tokens = jobs.map(encodeToken);
    this.batches.forget(tokens);
    let deadline = 0;
    const states: number[] = [];
    for (const part of chunks(tokens, MAX_BATCH)) {
      const [until, ...flags] = (await this.call(["extend", leaseMs, ...part])) as number[];
      deadline = Number(until);
      states.push(...flags.map(Number));
    }
    return [deadline, states];
  }

  // -- managing --------------------------------------------------------------------------

  async stats(): Promise<Stats> {
    return decodeStats(await this.call(["stats"]));
  }

  /** Queue settings ({trackIds} and the module's own names: fence_ms, fence_max, dead_max,
   * dead_age_ms); resolves to every setting. */
  async configure(settings: { trackIds?: boolean } & Record<string, number | boolean | undefined> = {}): Promise<Record<string, number>> {
    const args: Arg[] = ["configure"];
    for (const [name, value] of Object.entries(settings)) {
      if (value === undefined) continue;
      const field = name === "trackIds" ? "track_ids" : name;
      args.push(field, typeof value === "boolean" ? Number(value) : value);
    }
    return pairs(await this.call(args));
  }

  /** Pushes one job "<jobId>@<tick ms>" (jobId defaults to `name`) every `every` seconds,
   * the first a period from now: the server decides each tick in the claim that finds it due,
   * one job per tick whatever the number of consumers. Declaring a schedule again as it is
   * (from this client or Python's) changes nothing; anything else replaces it. Resolves to
   * true when it was added or changed. Cron schedules are declared by the Python client;
   * this one reads them (`schedules()`) and its claims fire their ticks too. */
  async schedule(name: string, options: ScheduleOptions): Promise<boolean> {
    return Number(await this.call(["schedule", "SET", ...intervalSchedule(name, options)])) === 1;
  }

  /** The queue's recurring schedules, by name. */
  async schedules(): Promise<Schedule[]> {
    return decodeSchedules(await this.call(["schedules"]));
  }

  /** Forgets the schedule `name` (jobs it pushed stay); false when there was none. */
  async unschedule(name: string): Promise<boolean> {
    return Number(await this.call(["unschedule", checkName(name)])) === 1;
  }

  async pause(): Promise<boolean> {
    return Number(await this.call(["pause"])) === 1;
  }

  async resume(): Promise<boolean> {
    return Number(await this.call(["resume"])) === 1;
  }

  /** At most `jobs` per `per` seconds across every consumer; null lifts the limit. */
  async setRateLimit(jobs: number | null, per = 1): Promise<void> {
    if (jobs === null) {
      await this.call(["rate_limit", 0, 1]);
      return;
    }
    await this.call(["rate_limit", whole(jobs, "jobs", 1, 1e9), secondsToMs(per, "per")]);
  }

  /** Dead letters from `start`, oldest first, as the module keeps them
   * ("<reason>*<deliveries>*<ms>*<element>"). */
  async dead(start = 0, limit = 100): Promise<string[]> {
    return (await this.call(["dead", whole(start, "start", 0, 1e15), whole(limit, "limit", 1, MAX_COUNT)])) as string[];
  }

  /** Removes every key of the queue (its seq stays, so no old token is ever accepted). */
  async delete(): Promise<boolean> {
    // (a topic group's payloads are the topic's: deleting the group leaves them)
    const keys = this.payloads && !this.dropsPayloads ? this.keys.all : [...this.keys.all, this.keys.payloads, this.keys.items];
    return Number(await this.call(["delete"], keys)) === 1;
  }

  /** Runs `handler` on every job until SIGINT/SIGTERM (or options.signal aborts): acks on
   * success, nacks with backoff on a throw, keeps the held leases alive. */
  work(handler: Handler, options: WorkOptions = {}): Promise<WorkSummary> {
    return work(this, handler, options);
  }

  /** Closes the connection this queue opened for blocking waits (never the caller's). */
  async close(): Promise<void> {
    const blocker = this.blocker;
    this.blocker = undefined;
    if (blocker !== undefined) blocker.disconnect();
  }
}

function dueArgs(options: PushOptions): Arg[] | null {
  if (options.delay !== undefined && options.at !== undefined) throw new InvalidArgument("give delay or at, not both");
  if (options.delay !== undefined) {
    return ["IN", secondsToMs(options.delay, "delay", { allowZero: true, limit: MAX_SCHEDULE_SECONDS })];
  }
  if (options.at === undefined) return null;
  const at = options.at instanceof Date ? options.at.getTime() / 1000 : options.at;
  if (typeof at !== "number" || !Number.isFinite(at) || at < 0 || at >= 1e12) {
    throw new InvalidArgument(`at must be a Date or unix seconds, got ${String(options.at)}`);
  }
  return ["AT", Math.ceil(at * 1000)];
}
