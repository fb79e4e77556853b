/**
 * The wire grammar, no I/O: job ids, tokens, the next_packed reply, batch acks and argument
 * checks, as rotator/protocol.py and rotator/commands.py have them. Arguments are checked
 * here before anything is sent (the module checks them again).
 */
import { InvalidArgument, InvalidJobId, InvalidToken } from "./errors";

export const MAX_ID_BYTES = 1024;
export const MAX_STAMP_BYTES = 48;
export const MAX_BATCH = 5000; // ids or tokens per call
export const MAX_COUNT = 1000; // jobs leased per call
export const MAX_BUDGET = 1000; // elements one next visits
export const MAX_LEASE_SECONDS = 86_400;
export const MAX_SCHEDULE_SECONDS = 3650 * 86_400;
export const MAX_DELIVERIES_LIMIT = 1_000_000;
export const MAX_ERROR_BYTES = 4096;

/** One delivery of a job: its id, the token that acks it, and when its lease runs out. */
export interface Job {
  readonly id: string;
  /** "<id>*<deadline>.<deliveries>.<seq>": what ack, nack and extend name. */
  readonly token: string;
  /** Deliveries so far, this one included. */
  readonly deliveries: number;
  /** True when this delivery re-leases a job whose previous lease expired. */
  readonly reclaimed: boolean;
  /** Lease deadline, unix ms (server time). */
  readonly deadline: number;
  /** The payload, on a queue with payloads (a topic group): payloadBuffer decoded as UTF-8
   * (bytes that are not UTF-8 become U+FFFD). */
  readonly payload?: string | null;
  /** The payload's bytes, exactly as published (by any client: a Python one's are bytes). */
  readonly payloadBuffer?: Buffer | null;
}

/** A job or its token. */
export type JobRef = Job | string;

/** A next_packed reply, decoded. */
export interface NextReply {
  readonly idle: boolean;
  readonly waitMs: number;
  readonly acked: number;
  readonly jobs: Job[];
  /** "<deadline>.1.<seq>" of this call's batch of first deliveries ("" when none). */
  readonly batch: string;
  readonly batchJobs: number;
  /** The batch's packed element "*<stamp>*<id>*<id>..." as the module sent it (payload
   * replies only): a payload queue acks the batch by naming it, so that the module can drop
   * its jobs' payloads. */
  readonly element?: string;
}

export function encodeId(id: unknown): string {
  if (typeof id === "number" && Number.isSafeInteger(id)) return String(id);
  if (typeof id !== "string") {
    throw new InvalidJobId(`job id must be a string (or an integer), got ${typeof id}`);
  }
  const bytes = Buffer.byteLength(id, "utf8");
  if (bytes === 0 || bytes > MAX_ID_BYTES || id.includes("*")) {
    throw new InvalidJobId(
      `job id must be 1..${MAX_ID_BYTES} bytes without "*", got ${JSON.stringify(id.slice(0, 64))}`,
    );
  }
  return id;
}

// A token as the module checks it: an id without "*", then "<deadline>.<deliveries>.<seq>".
const TOKEN = /^([^*]+)\*([0-9]{1,15})\.([0-9]{1,9})\.[0-9]+$/;

/** [id, deadlineMs, deliveries] of a well-formed token, else null. */
export function parseToken(token: string): [string, number, number] | null {
  const match = TOKEN.exec(token);
  if (match === null) return null;
  const [, id, deadline, deliveries] = match as unknown as [string, string, string, string];
  if (token.length - id.length - 1 > MAX_STAMP_BYTES) return null;
  if (Buffer.byteLength(id, "utf8") > MAX_ID_BYTES) return null;
  return [id, Number(deadline), Number(deliveries)];
}

export function encodeToken(ref: JobRef): string {
  if (typeof ref === "object" && ref !== null && typeof ref.token === "string") return ref.token;
  if (typeof ref !== "string" || parseToken(ref) === null) {
    throw new InvalidToken(`not a delivery token: ${JSON.stringify(String(ref).slice(0, 80))}`);
  }
  return ref;
}

/** The Job of a token the module handed out; with `payload` (its bytes), a payload job. */
export function jobFromToken(token: string, reclaimed: boolean, payload?: Buffer | null): Job {
  const parsed = parseToken(token);
  if (parsed === null) throw new InvalidToken(`server returned a malformed token ${JSON.stringify(token)}`);
  const [id, deadline, deliveries] = parsed;
  const job: Job = { id, token, deliveries, reclaimed, deadline };
  return payload === undefined ? job : withPayload(job, payload);
}

/** `job` with its payload, given as the bytes the module replied with (null: none kept). */
function withPayload(job: Job, bytes: Buffer | null): Job {
  if (bytes === null) return { ...job, payload: null, payloadBuffer: null };
  return { ...job, payload: bytes.toString("utf8"), payloadBuffer: bytes };
}

/** A bulk string of a reply read as Buffers (see script.ts, Replies), as text. */
function text(value: unknown): string {
  return Buffer.isBuffer(value) ? value.toString("utf8") : String(value);
}

const PACKED_STAMP = /^([0-9]{1,15})\.1\.[0-9]+$/;

/** "<stamp>" + the job's place in its batch as 5 digits. */
export function place(k: number): string {
  return String(k).padStart(5, "0");
}

/**
 * A next_packed reply {idle, wait_ms, acked, packed, token1, reclaimed1, ...}: the call's
 * first deliveries as one packed element "*<deadline>.1.<seq>*<id>*<id>..." (job k's token is
 * "<id>*<deadline>.1.<seq>" and k in 5 digits), then the later deliveries as next sends them.
 */
export function decodeNextPacked(reply: unknown): NextReply {
  const raw = reply as [number, number, number, string, ...Array<string | number>];
  const { jobs, stamp } = packedJobs(raw[3] ?? "");
  const batchJobs = jobs.length;
  for (let i = 4; i + 1 < raw.length; i += 2) {
    jobs.push(jobFromToken(String(raw[i]), Number(raw[i + 1]) === 1));
  }
  return { idle: Number(raw[0]) === 1, waitMs: Number(raw[1]), acked: Number(raw[2]), jobs, batch: stamp, batchJobs };
}

/**
 * A nextp_packed reply {idle, wait_ms, acked, packed, payload1, ..., payloadK, token,
 * reclaimed, payload, ...}: next_packed's head, the payloads of the packed jobs in their
 * order, then each later delivery as nextp sends it. Read as Buffers, so that each payload
 * reaches the job byte for byte.
 */
export function decodeNextPackedPayloads(reply: unknown): NextReply {
  const raw = reply as Array<Buffer | number | null>;
  const element = text(raw[3] ?? "");
  const { jobs, stamp } = packedJobs(element);
  const batchJobs = jobs.length;
  if (raw.length < 4 + batchJobs) {
    throw new InvalidToken(`server returned ${raw.length - 4} payloads for a batch of ${batchJobs}`);
  }
  const withPayloads: Job[] = jobs.map((job, i) => withPayload(job, payloadBytes(raw[4 + i])));
  for (let i = 4 + batchJobs; i + 2 < raw.length; i += 3) {
    withPayloads.push(jobFromToken(text(raw[i]), Number(raw[i + 1]) === 1, payloadBytes(raw[i + 2])));
  }
  return {
    idle: Number(raw[0]) === 1,
    waitMs: Number(raw[1]),
    acked: Number(raw[2]),
    jobs: withPayloads,
    batch: stamp,
    batchJobs,
    element,
  };
}

/** A payload of a reply read as Buffers: its bytes, or null when none is kept. */
function payloadBytes(value: unknown): Buffer | null {
  if (value === null || value === undefined) return null;
  if (!Buffer.isBuffer(value)) throw new InvalidToken(`server returned a payload that is not a string: ${String(value)}`);
  return value;
}

/** The jobs of a packed element "*<deadline>.1.<seq>*<id>*<id>..." (none for ""), and its
 * stamp "<deadline>.1.<seq>". */
function packedJobs(packed: string): { jobs: Job[]; stamp: string } {
  const jobs: Job[] = [];
  let stamp = "";
  if (packed) {
    const star = packed.indexOf("*", 1);
    const batch = star < 0 ? packed : packed.slice(0, star);
    stamp = batch.slice(1);
    const match = PACKED_STAMP.exec(stamp);
    const ids = packed.slice(star + 1).split("*");
    if (star < 0 || match === null || ids.length > MAX_COUNT) {
      throw new InvalidToken(`server returned a malformed batch ${JSON.stringify(packed.slice(0, 80))}`);
    }
    const deadline = Number(match[1]);
    ids.forEach((id, i) => {
      jobs.push({ id, token: `${id}${batch}${place(i + 1)}`, deliveries: 1, reclaimed: false, deadline });
    });
  }
  return { jobs, stamp };
}

/** "<deadline>.<deliveries>.<call seq>" of a token: its stamp less the 5-digit place. */
export function batchStamp(token: string): string {
  return token.slice(token.indexOf("*") + 1, -5);
}

/**
 * The batches this client leased and how many jobs each holds, so that acking a whole batch
 * goes as one batch ack "*<stamp>/<jobs>" instead of every token; `named`, as its packed
 * element "*<stamp>*<id>*<id>...", which names the jobs (a payload queue's ackp needs their
 * ids). The module refuses a batch ack once one of its jobs was given back, extended or
 * acked on its own, or its element was broken up: then the caller sends the tokens one by
 * one. Bounded: the oldest are forgotten.
 */
export class Batches {
  private readonly sizes = new Map<string, number>();
  private readonly elements = new Map<string, string>();

  constructor(private readonly limit = 4096) {}

  note(reply: NextReply): void {
    if (!reply.batch) return;
    this.sizes.set(reply.batch, reply.batchJobs);
    if (reply.element) this.elements.set(reply.batch, reply.element);
    while (this.sizes.size > this.limit) {
      this.drop(this.sizes.keys().next().value as string);
    }
  }

  /** Forgets a batch: one of its jobs went its own way (nack, extend, bury). */
  forget(tokens: readonly string[]): void {
    for (const token of tokens) this.drop(batchStamp(token));
  }

  private drop(stamp: string): void {
    this.sizes.delete(stamp);
    this.elements.delete(stamp);
  }

  /** The tokens with every whole batch among them replaced by its batch ack (`named`: its
   * element; a batch whose element is unknown is then left as its tokens), whether any was,
   * and how many distinct deliveries they name. */
  pack(tokens: readonly string[], named = false): { args: string[]; packed: boolean; jobs: number } {
    const distinct = [...new Set(tokens)];
    if (this.sizes.size === 0) return { args: distinct, packed: false, jobs: distinct.length };
    const groups = new Map<string, number>();
    for (const token of distinct) {
      const stamp = batchStamp(token);
      if (this.sizes.has(stamp)) groups.set(stamp, (groups.get(stamp) ?? 0) + 1);
    }
    const whole = new Map<string, string>();
    for (const [stamp, members] of groups) {
      const element = this.elements.get(stamp);
      if (this.sizes.get(stamp) === members && (!named || element !== undefined)) {
        whole.set(stamp, named ? (element as string) : `*${stamp}/${members}`);
        this.drop(stamp); // a batch is acked whole once
      }
    }
    if (whole.size === 0) return { args: distinct, packed: false, jobs: distinct.length };
    const args = distinct.filter((token) => !whole.has(batchStamp(token)));
    args.push(...whole.values());
    return { args, packed: true, jobs: distinct.length };
  }
}

/** A payload as the module takes it: a string (sent as UTF-8) or a Buffer (byte for byte). */
export function encodePayload(payload: unknown): string | Buffer {
  if (typeof payload === "string" || Buffer.isBuffer(payload)) return payload;
  throw new InvalidArgument(`a payload must be a string or a Buffer, got ${typeof payload}`);
}

export function whole(value: unknown, name: string, low: number, high: number): number {
  if (typeof value !== "number" || !Number.isInteger(value) || value < low || value > high) {
    throw new InvalidArgument(`${name} must be a whole number in ${low}..${high}, got ${String(value)}`);
  }
  return value;
}

/** Seconds as whole ms (rounded up), checked against 0..limit; 0 only where allowed. */
export function secondsToMs(
  seconds: unknown,
  name: string,
  { allowZero = false, limit = MAX_LEASE_SECONDS }: { allowZero?: boolean; limit?: number } = {},
): number {
  if (typeof seconds !== "number" || !Number.isFinite(seconds) || seconds < 0 || seconds > limit) {
    throw new InvalidArgument(`${name} must be a finite number of seconds in 0..${limit}, got ${String(seconds)}`);
  }
  const ms = Math.ceil(seconds * 1000);
  if (ms === 0 && !allowZero) throw new InvalidArgument(`${name} must be positive, got ${seconds}`);
  return ms;
}

export function checkError(error: unknown): string {
  if (typeof error !== "string") throw new InvalidArgument(`error must be a string, got ${typeof error}`);
  if (Buffer.byteLength(error, "utf8") > MAX_ERROR_BYTES) {
    throw new InvalidArgument(`error must be at most ${MAX_ERROR_BYTES} bytes`);
  }
  return error;
}

export function chunks<T>(items: readonly T[], size: number): T[][] {
  const parts: T[][] = [];
  for (let start = 0; start < items.length; start += size) parts.push(items.slice(start, start + size));
  return parts;
}
