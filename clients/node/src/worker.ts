/**
 * The worker loop: claim, run, ack or nack, keep leases alive, stop cleanly.
 *
 * It claims as many jobs as it has free slots (concurrency), runs each handler as it comes,
 * acks a job when its handler resolves (the ack rides on the next claim when one is about to
 * go, else it is sent at once), and nacks it with exponential backoff when the handler throws
 * (1 s, 2 s, 4 s ... capped at 5 min); a failure on the last allowed delivery
 * (maxDeliveries) buries the job with its error. A heartbeat extends every held lease that
 * has used half its length. On SIGINT/SIGTERM (or options.signal) it stops claiming, lets the
 * running handlers finish and acks them, gives back any job claimed meanwhile, and resolves.
 */
import { UnknownFormat } from "./errors";
import type { Job } from "./protocol";
import type { Rotator } from "./rotator";

export type Handler = (job: Job) => unknown;

export interface WorkOptions {
  /** Handlers running at once (default 1). */
  concurrency?: number;
  /** Seconds an idle claim waits for work before looking at the stop flag again (default 1). */
  poll?: number;
  /** Stops the loop when aborted. */
  signal?: AbortSignal;
  /** Stop on SIGINT and SIGTERM (default true). */
  handleSignals?: boolean;
  /** Resolve once a claim finds nothing ready and no handler runs (claims do not wait). */
  stopWhenEmpty?: boolean;
  /** Where failures and lost leases are reported (default: console). */
  logger?: Pick<Console, "warn" | "error">;
}

export interface WorkSummary {
  /** Jobs acked. */
  completed: number;
  /** Handler failures given back for a retry. */
  retried: number;
  /** Handler failures (deliveries). */
  failed: number;
  /** Jobs buried on their last delivery. */
  dead: number;
  /** Leases found lost (an ack refused, an extend lost or cancelled). */
  leasesLost: number;
}

/** Seconds before a failed job is delivered again: 1 s doubling per delivery, at most 5 min. */
export function retryDelay(deliveries: number): number {
  return Math.min(1 * 2 ** Math.max(deliveries - 1, 0), 300);
}

const CLAIM_RETRY_FIRST = 100; // ms before claiming again after a server error, doubling
const CLAIM_RETRY_CAP = 5000;

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

export async function work(queue: Rotator, handler: Handler, options: WorkOptions = {}): Promise<WorkSummary> {
  const concurrency = options.concurrency ?? 1;
  if (!Number.isInteger(concurrency) || concurrency < 1 || concurrency > 1000) {
    throw new RangeError(`concurrency must be a whole number in 1..1000, got ${concurrency}`);
  }
  const poll = options.poll ?? 1;
  const logger = options.logger ?? console;
  const summary: WorkSummary = { completed: 0, retried: 0, failed: 0, dead: 0, leasesLost: 0 };
  const held = new Map<string, Job>(); // token -> job, while its handler runs
  const running = new Set<Promise<void>>();
  let acks: Job[] = []; // done, waiting to ride on the next claim
  let claiming = false;
  let stopping = false;
  let retryMs = CLAIM_RETRY_FIRST;

  const stop = (): void => {
    stopping = true;
  };
  const signals: NodeJS.Signals[] = options.handleSignals === false ? [] : ["SIGINT", "SIGTERM"];
  for (const name of signals) process.on(name, stop);
  options.signal?.addEventListener("abort", stop);
  if (options.signal?.aborted) stop();

  const sendAcks = async (): Promise<void> => {
    const batch = acks;
    acks = [];
    if (batch.length === 0) return;
    try {
      const accepted = await queue.ack(...batch);
      summary.completed += accepted;
      summary.leasesLost += batch.length - accepted;
    } catch (error) {
      logger.error(`rotator: ack of ${batch.length} jobs failed:`, error);
    }
  };

  const run = async (job: Job): Promise<void> => {
    try {
      await handler(job);
    } catch (error) {
      summary.failed += 1;
      held.delete(job.token);
      await fail(job, error);
      return;
    }
    held.delete(job.token);
    acks.push(job);
    if (claiming || stopping) await sendAcks(); // no claim will carry it soon
  };

  const fail = async (job: Job, error: unknown): Promise<void> => {
    const text = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
    try {
      if (queue.maxDeliveries > 0 && job.deliveries >= queue.maxDeliveries) {
        logger.warn(`rotator: job ${job.id} failed on its last delivery, to the dead letters: ${text}`);
        const buried = await queue.bury(job, text.slice(0, 4000));
        summary.dead += buried;
        summary.leasesLost += 1 - buried;
      } else {
        const given = await queue.nack(job, { delay: retryDelay(job.deliveries) });
        summary.retried += given;
        summary.leasesLost += 1 - given;
      }
    } catch (nackError) {
      logger.error(`rotator: giving back job ${job.id} failed:`, nackError);
    }
  };

  const heartbeat = async (): Promise<void> => {
    const now = Date.now();
    const due = [...held.values()].filter((job) => job.deadline - now <= queue.leaseMs / 2);
    if (due.length === 0) return;
    try {
      const [deadline, states] = await queue.extendMany(due);
      due.forEach((job, i) => {
        if (states[i] === 1) {
          if (held.has(job.token)) held.set(job.token, { ...job, deadline });
          return;
        }
        held.delete(job.token);
        summary.leasesLost += 1;
        logger.warn(`rotator: lease of job ${job.id} ${states[i] === -1 ? "cancelled" : "lost"}`);
      });
    } catch (error) {
      logger.error("rotator: extending leases failed:", error);
    }
  };
  const beat = setInterval(() => void heartbeat(), Math.min(Math.max(queue.leaseMs / 4, 50), 10_000));

  try {
    while (!stopping) {
      if (running.size >= concurrency) {
        await Promise.race(running);
        continue;
      }
      let jobs: Job[];
      const riding = acks;
      acks = [];
      claiming = true;
      try {
        // (stopWhenEmpty: no wait, so "empty" means nothing ready now)
        const block = options.stopWhenEmpty ? undefined : poll;
        const claim = await queue.claim({ count: concurrency - running.size, block, ack: riding });
        jobs = claim.jobs;
        summary.completed += claim.acked; // a lease lost meanwhile: its ack was refused
        summary.leasesLost += Math.max(riding.length - claim.acked, 0);
        retryMs = CLAIM_RETRY_FIRST;
      } catch (error) {
        acks = [...riding, ...acks];
        if (error instanceof UnknownFormat) throw error; // (a newer rotator's queue: upgrade)
        logger.error("rotator: claim failed, retrying:", error);
        await sleep(retryMs);
        retryMs = Math.min(retryMs * 2, CLAIM_RETRY_CAP);
        continue;
      } finally {
        claiming = false;
      }
      if (stopping) {
        if (jobs.length > 0) await queue.nack(jobs, { delay: 0 }).catch(() => 0); // not started
        break;
      }
      if (jobs.length === 0 && options.stopWhenEmpty) {
        if (running.size === 0) break;
        await Promise.race([...running, sleep(poll * 1000)]); // claims that do not wait: no spin
      }
      for (const job of jobs) {
        held.set(job.token, job);
        const task = run(job).finally(() => running.delete(task));
        running.add(task);
      }
    }
    await Promise.all(running);
    await sendAcks();
  } finally {
    clearInterval(beat);
    for (const name of signals) process.off(name, stop);
    options.signal?.removeEventListener("abort", stop);
    await queue.close();
  }
  return summary;
}
