/**
 * Recurring schedules, the client's half, as rotator/schedules.py has it: checking an interval
 * schedule's arguments and reading the module's `schedules` reply.
 *
 * The module decides every tick atomically, in the claim that finds it due (one job
 * "<jobId>@<tick ms>" per tick, whatever the number of consumers), so any client's claims
 * fire the ticks of any schedule. A cron schedule is given its due times by the client that
 * declares it (the Python client, which reads cron with cronsim, and whose worker loops keep
 * its window of due times full); this client reads it, and declares interval schedules only.
 */
import { InvalidArgument, InvalidJobId } from "./errors";
import { MAX_SCHEDULE_SECONDS, encodeId } from "./protocol";

const NAME = /^[A-Za-z0-9._:@/-]{1,128}$/;
/** A tick's job id is "<job id>@<tick ms>": room for the ms within the 1024 bytes of an id. */
const MAX_JOB_ID_BYTES = 1024 - 16;
/** How a cron schedule's time zone is kept in its spec: "<expression>;<zone>". */
const ZONE_MARK = ";";

export interface ScheduleOptions {
  /** Seconds between ticks (0.001 .. ten years); the first tick is a period from now. */
  every: number;
  /** The id of the jobs the ticks push ("<jobId>@<tick ms>"); default: the schedule's name. */
  jobId?: string | number;
}

/** A recurring schedule, as `schedules()` reads it. */
export interface Schedule {
  readonly name: string;
  /** The cron expression, or "every <seconds>s". */
  readonly spec: string;
  /** Unix seconds of the next tick; null: a cron schedule ran out of due times. */
  readonly nextDue: number | null;
  /** Unix seconds of the last tick, null before one. */
  readonly lastRun: number | null;
  readonly jobId: string;
  /** Seconds between ticks, for an interval schedule. */
  readonly every: number | null;
  readonly cron: string | null;
  /** A cron expression's time zone; null: UTC. */
  readonly tz: string | null;
  /** Due times a cron schedule holds (the Python worker loops add more). */
  readonly duesLeft: number | null;
  /** Unix seconds of the last of them. */
  readonly duesUntil: number | null;
}

export function checkName(name: unknown): string {
  if (typeof name !== "string" || !NAME.test(name)) {
    throw new InvalidArgument(`schedule name must be 1..128 of A-Z a-z 0-9 . _ : @ / -, got ${JSON.stringify(name)}`);
  }
  return name;
}

/** `schedule SET`'s arguments after its mode: NAME JOB_ID EVERY_MS SPEC, every one checked;
 * the spec is the Python client's ("every <seconds as %g>s"), so that either client declaring
 * the same schedule again changes nothing. */
export function intervalSchedule(name: unknown, options: ScheduleOptions): [string, string, number, string] {
  const checked = checkName(name);
  const jobId = encodeId(options.jobId ?? checked);
  if (Buffer.byteLength(jobId, "utf8") > MAX_JOB_ID_BYTES) {
    throw new InvalidJobId(`a schedule's job id must be at most ${MAX_JOB_ID_BYTES} bytes`);
  }
  const every: unknown = options.every;
  if (typeof every !== "number" || !Number.isFinite(every) || every < 0.001 || every > MAX_SCHEDULE_SECONDS) {
    throw new InvalidArgument(`every must be a number of seconds in 0.001..${MAX_SCHEDULE_SECONDS}, got ${String(every)}`);
  }
  return [checked, jobId, roundHalfEven(every * 1000), `every ${formatG(every)}s`];
}

/** The module's `schedules` reply: eight fields per schedule. */
export function decodeSchedules(reply: unknown): Schedule[] {
  const raw = (reply as unknown[]).map(String);
  const found: Schedule[] = [];
  for (let i = 0; i + 7 < raw.length; i += 8) {
    const [name, jobId, everyMs, spec, nextMs, lastMs, left, untilMs] = raw.slice(i, i + 8) as [
      string, string, string, string, string, string, string, string,
    ];
    const every = Number(everyMs);
    let cron: string | null = null;
    let tz: string | null = null;
    if (every === 0) {
      const mark = spec.indexOf(ZONE_MARK);
      cron = mark < 0 ? spec : spec.slice(0, mark);
      tz = mark < 0 || mark === spec.length - 1 ? null : spec.slice(mark + 1);
    }
    found.push({
      name,
      spec: cron ?? spec,
      nextDue: Number(nextMs) >= 0 ? Number(nextMs) / 1000 : null,
      lastRun: Number(lastMs) > 0 ? Number(lastMs) / 1000 : null,
      jobId,
      every: every ? every / 1000 : null,
      cron,
      tz,
      duesLeft: every === 0 ? Number(left) : null,
      duesUntil: Number(untilMs) >= 0 ? Number(untilMs) / 1000 : null,
    });
  }
  return found;
}

/** Python's round(): half to even. */
function roundHalfEven(value: number): number {
  const floor = Math.floor(value);
  const rest = value - floor;
  if (rest > 0.5) return floor + 1;
  if (rest < 0.5) return floor;
  return floor % 2 === 0 ? floor : floor + 1;
}

/** Python's format(value, "g"): 6 significant digits, trailing zeros dropped, an exponent of
 * at least two digits below 1e-4 and from 1e6. */
export function formatG(value: number): string {
  if (value === 0) return "0";
  const [mantissa, exponent] = value.toExponential(5).split("e") as [string, string];
  const power = Number(exponent);
  if (power < -4 || power >= 6) {
    const digits = mantissa.includes(".") ? mantissa.replace(/0+$/, "").replace(/\.$/, "") : mantissa;
    const sign = power < 0 ? "-" : "+";
    return `${digits}e${sign}${String(Math.abs(power)).padStart(2, "0")}`;
  }
  const fixed = value.toFixed(Math.max(0, 5 - power));
  return fixed.includes(".") ? fixed.replace(/0+$/, "").replace(/\.$/, "") : fixed;
}
