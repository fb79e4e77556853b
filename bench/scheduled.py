"""Scheduled jobs (issue 15): what jobs pushed for later cost, and how punctually they come.

    .venv/bin/python -m bench.scheduled [--smoke | --quick] [--servers redis,valkey]
        [--out DIR] [--table]

On each server (one of our own, persistence off), through the public API (``Rotator``, FCALL
where the server allows it, as by default):

1. Claims of ready jobs beside scheduled ones. ``ready`` jobs are pushed (chunks of 5000) and
   drained by one client, ``next(batch, ack=<the previous batch>)`` until it returns [], into
   a queue with nothing scheduled and into one holding ``far`` jobs scheduled 30 days ahead
   (loaded by ``push_many(ids, 5000, delay=...)``). Interleaved rounds, the order of the two
   queues alternating, so a machine whose speed drifts shifts both alike; the ratio (wall
   time with ``far`` scheduled over without) is taken within each round and its median
   reported, with the same for server time. Target: within 1.25x.
2. The cost of a push: server µs per job (INFO commandstats: EVALSHA and FCALL, the module
   calls only) and client wall µs per job, of ``push(id, delay=...)`` one id a call and of
   ``push_many(ids, 1000, delay=...)``, into an empty queue and onto the ``far`` jobs; plain
   pushes beside them for reference.
3. The cost of a promotion: ``promote`` jobs scheduled ``at`` one moment, then, once it has
   passed, drained by ``next(100, ack=...)``; the same number of ready jobs drained the same
   way beside it. Each module call's server time is read from INFO commandstats after it
   (not SLOWLOG, which on Valkey also logs, and so slows, the commands a script issues): the
   first ``ceil(promote / 1000)`` calls each move 1000 due jobs to the ring (the module's
   most per call), so the promotion's µs per job is (median promoting call - median other
   call) / 1000; the drains' server µs per job are given too, and the worst call. With
   nothing else scheduled and with the ``far`` jobs scheduled later.
4. Tick precision, as the delay from a job's due time (its ZSET score, server TIME) to the
   moment the consumer's ``next`` returned it (the same host's clock):
   - under load: a producer process pushes ready jobs at ``load_rate`` a second (every 10
     ms) while one consumer claims everything with ``next(100, block=1, ack=...)``;
     ``tick_jobs`` jobs are scheduled at random times spread over ``tick_spread_s`` s;
   - idle: a consumer blocked in ``next(1, block=5)`` on an empty queue, then one job
     scheduled 0.3-1.2 s ahead; ``idle_rounds`` rounds, each at a random phase of the
     server's cron ticks. The consumer wakes (the push brings the earliest due time
     forward), finds nothing due and blocks on the wake list until the due time; that
     BLPOP's timeout fires at the server's next cron tick (every 1000 / hz ms), so at the
     default hz 10 it is 0-100 ms late. The same again with ``hz 100`` shows that bound.
   The same for a recurring schedule, ``q.schedule("every", every=0.373)`` (373 ms: ticks
   fall at every phase of the server's 100 or 10 ms cron ticks): a tick's lateness is when
   the consumer's ``next`` returned its job less the tick time its id ``every@<tick ms>``
   carries; under the same load and consumer (``schedule_ticks`` ticks), and idle, one
   consumer in ``next(1, block=5, ack=...)`` for ``idle_rounds`` ticks, at hz 10 and 100.
   ``skipped`` counts ticks that made no job of their own (a catch-up job stands for them).

Results: ``bench/results/scheduled.json`` and ``scheduled.md`` (``--out``); ``--table`` prints
the table of an earlier run. Full sizes take about 3.5 minutes on this 2-core VM.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from itertools import pairwise
from pathlib import Path
from typing import Any

import redis

from bench.bounds import server_ms, wait_lazyfree
from bench.harness import (
    ServerTable,
    load_now,
    machine_info,
    module_info,
    percentile,
    server_usec,
    size_mode,
    sized_parser,
    started,
    write_results,
)
from bench.leases import wait_blocked
from rotator import Job, Rotator

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
SCRIPT_COMMANDS = ("evalsha", "fcall")
LOAD_CHUNK = 5000  # ids a call when loading (the module's most)
FAR_S = 30 * 86_400  # the background scheduled jobs are due in 30 days
PROMOTE_PER_CALL = 1000  # the module's most due jobs moved to the ring by one call
DRAIN_BATCH = 100  # next(count) of the promotion drains
PUSH_CHUNK = 1000
LOAD_EVERY_S = 0.01  # the background producer pushes every 10 ms
IDLE_BLOCK_S = 5.0
SCHEDULE = "every"  # the recurring schedule's name, and its jobs' id before "@<tick ms>"
SCHEDULE_EVERY_S = 0.373  # no multiple of 10 ms: its ticks fall at every phase of cron's
TARGETS = {"claim_ratio_max": 1.25}
Log = Callable[[str], None]


@dataclass(frozen=True)
class Sizes:
    ready: int  # ready jobs drained per claim run
    batches: tuple[int, ...]  # next(count) of the claim runs
    far: int  # jobs scheduled far ahead, behind the claims
    rounds: int  # interleaved claim rounds
    push_one: int  # jobs pushed one a call
    push_chunked: int  # jobs pushed 1000 a call
    promote: int  # jobs falling due at one moment, per round
    promote_rounds: int
    tick_jobs: int  # scheduled jobs under load
    tick_spread_s: float  # over how long their due times are spread
    load_rate: int  # background ready jobs pushed per second
    idle_rounds: int  # idle consumer rounds (and idle recurring ticks), per hz
    schedule_ticks: int  # recurring ticks under load


SIZES = {
    "full": Sizes(
        20_000, (1, 100), 1_000_000, 5, 10_000, 200_000, 20_000, 3, 200, 3.0, 5000, 20, 40
    ),
    "quick": Sizes(5000, (1, 100), 100_000, 2, 2000, 50_000, 5000, 2, 100, 2.0, 2000, 6, 15),
    "smoke": Sizes(300, (1, 100), 5000, 1, 100, 2000, 1500, 1, 20, 0.5, 500, 2, 4),
}


def ids(prefix: str, n: int) -> list[str]:
    return [f"{prefix}-{i:010d}" for i in range(n)]


def now_ms() -> float:
    return time.time() * 1000


def via(client: redis.Redis) -> str:
    """Which way the module was called since the last CONFIG RESETSTAT."""
    stats = client.info("commandstats")
    return "fcall" if int(stats.get("cmdstat_fcall", {}).get("calls", 0)) else "evalsha"


@dataclass
class Drained:
    jobs: int
    calls: int
    seconds: float
    server_us: float
    via: str

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else 0.0

    @property
    def server_us_per_job(self) -> float:
        return self.server_us / self.jobs if self.jobs else 0.0


def drain(
    client: redis.Redis, q: Rotator, batch: int, *, each: Callable[[], Any] | None = None
) -> Drained:
    """One client claims until ``next`` returns [], each call acking the previous batch (the
    last, empty one included); then a sweep, not counted. ``each`` runs after every call."""
    client.config_resetstat()
    began = time.perf_counter()
    finished: list[Job] = []
    got = calls = 0
    while True:
        jobs = q.next(batch, ack=finished)
        calls += 1
        if each is not None:
            each()
        if not jobs:
            break
        got += len(jobs)
        finished = jobs
    seconds = time.perf_counter() - began
    used = Drained(got, calls, seconds, server_usec(client, SCRIPT_COMMANDS), via(client))
    q.sweep()
    return used


# -- 1. claims beside far scheduled jobs ----------------------------------------------------------


def load_far(client: redis.Redis, q: Rotator, n: int, log: Log) -> dict[str, Any]:
    """Schedules ``n`` jobs 30 days ahead, 5000 a call; what it took and what they hold."""
    every = ids("far", n)
    client.config_resetstat()
    began = time.perf_counter()
    q.push_many(every, LOAD_CHUNK, delay=FAR_S)
    seconds = time.perf_counter() - began
    used = server_usec(client, SCRIPT_COMMANDS)
    scheduled = q.stats().scheduled
    memory = int(client.memory_usage(q.keys.scheduled, samples=0) or 0)
    row = {
        "jobs": n,
        "chunk": LOAD_CHUNK,
        "seconds": round(seconds, 2),
        "jobs_per_s": round(n / seconds, 1),
        "server_us_per_job": round(used / n, 3),
        "scheduled": scheduled,
        "scheduled_ok": scheduled == n,
        "zset_bytes_per_job": round(memory / n, 1),
    }
    log(
        f"  loaded {n:,} scheduled jobs in {seconds:.1f} s ({row['server_us_per_job']} server "
        f"us a job), {row['zset_bytes_per_job']} B a job in the ZSET"
    )
    if not row["scheduled_ok"]:
        log(f"  WARNING: stats says {scheduled:,} scheduled, not {n:,}")
    return row


def claim_rows(
    client: redis.Redis, queues: dict[int, Rotator], sizes: Sizes, log: Log
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Interleaved claim rounds on each queue (by how many it holds scheduled); the rows and
    the ratios (per batch: far over none, wall and server time, within each round)."""
    runs: dict[tuple[int, int], list[Drained]] = {
        (batch, held): [] for batch in sizes.batches for held in queues
    }
    order = sorted(queues)
    for rnd in range(sizes.rounds):
        for batch in sizes.batches:
            for held in order if rnd % 2 == 0 else order[::-1]:
                q = queues[held]
                q.push_many(ids(f"r{rnd}b{batch}", sizes.ready), LOAD_CHUNK)
                run = drain(client, q, batch)
                if run.jobs != sizes.ready:
                    raise RuntimeError(f"drained {run.jobs} of {sizes.ready} ready jobs")
                runs[batch, held].append(run)
                log(
                    f"  claim round {rnd} batch {batch:>3}, {held:>9,} scheduled: "
                    f"{run.jobs_per_s:>9,.0f} jobs/s, {run.server_us_per_job:.2f} server us a job"
                )
    rows = []
    for (batch, held), done in runs.items():
        rows.append(
            {
                "batch": batch,
                "scheduled": held,
                "jobs": sizes.ready,
                "via": done[0].via,
                "jobs_per_s": [round(r.jobs_per_s, 1) for r in done],
                "server_us_per_job": [round(r.server_us_per_job, 3) for r in done],
                "median_jobs_per_s": round(statistics.median(r.jobs_per_s for r in done), 1),
                "median_server_us_per_job": round(
                    statistics.median(r.server_us_per_job for r in done), 3
                ),
            }
        )
    none, far = order[0], order[-1]
    ratios = []
    for batch in sizes.batches:
        pairs = list(zip(runs[batch, far], runs[batch, none], strict=True))
        wall = [a.seconds / b.seconds for a, b in pairs]
        server = [a.server_us / b.server_us for a, b in pairs if b.server_us > 0]
        ratios.append(
            {
                "batch": batch,
                "scheduled": far,
                "wall_ratio": round(statistics.median(wall), 3),
                "server_ratio": round(statistics.median(server), 3) if server else None,
                "wall_ratio_by_round": [round(r, 3) for r in wall],
                "server_ratio_by_round": [round(r, 3) for r in server],
                "within_target": statistics.median(wall) <= TARGETS["claim_ratio_max"],
            }
        )
    return rows, ratios


# -- 2. the cost of a push ------------------------------------------------------------------------


def push_row(
    client: redis.Redis, q: Rotator, kind: str, *, chunk: int, n: int, onto: int
) -> dict[str, Any]:
    """Pushes ``n`` fresh ids, ``chunk`` a call: scheduled 30 days ahead (``push_later``) or
    ready (``push``); server and wall µs per job."""
    every = ids(f"{kind}-c{chunk}-o{onto}", n)
    delay = FAR_S if kind == "push_later" else None
    client.config_resetstat()
    began = time.perf_counter()
    if chunk == 1:
        for job_id in every:
            q.push(job_id, delay=delay)
    else:
        q.push_many(every, chunk, delay=delay)
    seconds = time.perf_counter() - began
    return {
        "command": kind,
        "chunk": chunk,
        "onto_scheduled": onto,
        "jobs": n,
        "server_us_per_job": round(server_usec(client, SCRIPT_COMMANDS) / n, 3),
        "wall_us_per_job": round(seconds * 1e6 / n, 2),
    }


def push_rows(
    client: redis.Redis, far_q: Rotator, far: int, sizes: Sizes, log: Log
) -> list[dict[str, Any]]:
    rows = []
    for chunk, n in ((1, sizes.push_one), (PUSH_CHUNK, sizes.push_chunked)):
        for kind, onto in (("push", 0), ("push_later", 0), ("push_later", far)):
            q = far_q if onto else Rotator(client, f"sched-push-{kind}-{chunk}")
            row = push_row(client, q, kind, chunk=chunk, n=n, onto=onto)
            if not onto:
                q.delete()
            log(
                f"  {kind:<10} chunk {chunk:>4} onto {onto:>9,} scheduled: "
                f"{row['server_us_per_job']:>6.2f} server us, {row['wall_us_per_job']:>7.2f} "
                "wall us a job"
            )
            rows.append(row)
    wait_lazyfree(client)
    return rows


# -- 3. the cost of a promotion -------------------------------------------------------------------


def note_call(client: redis.Redis, calls: list[float]) -> None:
    """Appends the server time of the module call just made: commandstats' total since the
    drain's CONFIG RESETSTAT, less the calls noted before."""
    calls.append(server_usec(client, SCRIPT_COMMANDS) - sum(calls))


def promotion_row(
    client: redis.Redis, q: Rotator, *, held: int, rnd: int, n: int
) -> dict[str, Any]:
    """``n`` jobs due at one moment, drained once it has passed; then ``n`` ready ones."""
    lead_ms = 300 + n // 20  # time enough to schedule them all before it
    due = server_ms(client) + lead_ms
    q.push_many(ids(f"p{rnd}", n), LOAD_CHUNK, at=due / 1000)
    pushed_before_due = server_ms(client) < due
    time.sleep(max(0.0, due - server_ms(client)) / 1000 + 0.02)
    calls: list[float] = []  # server us of each module call
    after_due = drain(client, q, DRAIN_BATCH, each=lambda: note_call(client, calls))
    q.push_many(ids(f"q{rnd}", n), LOAD_CHUNK)
    ready_us: list[float] = []
    plain = drain(client, q, DRAIN_BATCH, each=lambda: note_call(client, ready_us))
    if after_due.jobs != n or plain.jobs != n:
        raise RuntimeError(f"drained {after_due.jobs} promoted and {plain.jobs} ready of {n}")
    moving = math.ceil(n / PROMOTE_PER_CALL)
    moved_us, rest_us = calls[:moving], calls[moving:]
    per_job = (
        (statistics.median(moved_us) - statistics.median(rest_us)) / PROMOTE_PER_CALL
        if moved_us and rest_us
        else None
    )
    return {
        "scheduled_later": held,
        "round": rnd,
        "jobs": n,
        "pushed_before_due": pushed_before_due,
        "promoting_calls": moving,
        "promoting_call_median_ms": round(statistics.median(moved_us) / 1000, 3),
        "other_call_median_ms": round(statistics.median(rest_us) / 1000, 3) if rest_us else None,
        "ready_call_median_ms": round(statistics.median(ready_us) / 1000, 3),
        "worst_call_ms": round(max(calls) / 1000, 3),
        "promotion_us_per_job": round(per_job, 3) if per_job is not None else None,
        "drain_server_us_per_job": round(after_due.server_us_per_job, 3),
        "ready_drain_server_us_per_job": round(plain.server_us_per_job, 3),
        "drain_difference_us_per_job": round(
            after_due.server_us_per_job - plain.server_us_per_job, 3
        ),
    }


def promotion_rows(
    client: redis.Redis, queues: dict[int, Rotator], sizes: Sizes, log: Log
) -> list[dict[str, Any]]:
    rows = []
    for held, q in sorted(queues.items()):
        for rnd in range(sizes.promote_rounds):
            row = promotion_row(client, q, held=held, rnd=rnd, n=sizes.promote)
            log(
                f"  promotion of {sizes.promote:,}, {held:>9,} scheduled later: "
                f"{row['promotion_us_per_job']} us a job (promoting call "
                f"{row['promoting_call_median_ms']} ms, other {row['other_call_median_ms']} ms, "
                f"worst {row['worst_call_ms']} ms)"
            )
            if not row["pushed_before_due"]:
                log("  WARNING: the push ended after the due time")
            rows.append(row)
    return rows


# -- 4. tick precision ----------------------------------------------------------------------------


def _produce(url: str, name: str, per_push: int, events: tuple[Any, Any, Any]) -> None:
    """The background producer: ``per_push`` ready jobs every 10 ms until ``stop``."""
    ready, stop, out = events
    q = Rotator.from_url(url, name)
    pushed = 0
    ready.set()
    tick = time.monotonic()
    while not stop.is_set():
        q.push_many([f"bg-{pushed + i:010d}" for i in range(per_push)])
        pushed += per_push
        tick += LOAD_EVERY_S
        time.sleep(max(0.0, tick - time.monotonic()))
    out.put(pushed)


@contextmanager
def producing(url: str, name: str, rate: int) -> Iterator[dict[str, Any]]:
    """A producer process pushing ``rate`` ready jobs a second while the block runs; the dict
    yielded gets ``pushed`` and ``seconds`` at its end."""
    context = multiprocessing.get_context("spawn")
    ready, stop, out = context.Event(), context.Event(), context.Queue()
    per_push = max(1, round(rate * LOAD_EVERY_S))
    proc = context.Process(target=_produce, args=(url, name, per_push, (ready, stop, out)))
    proc.start()
    info: dict[str, Any] = {"per_push": per_push, "every_ms": LOAD_EVERY_S * 1000}
    began = time.perf_counter()
    try:
        if not ready.wait(30):
            raise RuntimeError("the producer did not start")
        began = time.perf_counter()
        yield info
    finally:
        stop.set()
        info["pushed"] = out.get(timeout=30) if proc.is_alive() or not out.empty() else 0
        info["seconds"] = round(time.perf_counter() - began, 2)
        proc.join(30)


def under_load(sizes: Sizes, load: dict[str, Any], claimed: int) -> dict[str, Any]:
    """What a row measured under the background load says of it: the consumer, the load's
    rate, what it pushed, what of it the consumer claimed (``claimed``), and for how long."""
    return {
        "consumer": f"next({DRAIN_BATCH}, block=1, ack=...)",
        "load_rate": sizes.load_rate,
        "background_pushed": load["pushed"],
        "background_claimed": claimed,
        "seconds": load["seconds"],
    }


def delays_row(case: str, delays: list[float], **extra: Any) -> dict[str, Any]:
    def ms(value: float | None) -> float | None:
        return None if value is None else round(value, 1)

    return {
        "case": case,
        **extra,
        "received": len(delays),
        "p50_ms": ms(percentile(delays, 50)),
        "p99_ms": ms(percentile(delays, 99)),
        "max_ms": ms(max(delays)) if delays else None,
        "min_ms": ms(min(delays)) if delays else None,
        "delays_ms": [round(d, 1) for d in delays],
    }


def tick_ms(job_id: str) -> float | None:
    """The tick a job of the recurring schedule carries in its id (None: another job)."""
    name, at, tick = job_id.partition("@")
    return float(tick) if at and name == SCHEDULE else None


@dataclass
class Consumed:
    delays: list[float]  # ms from each due job's due time to when ``next`` returned it
    dues: list[float]  # their due times, in the order received
    others: int  # jobs claimed that ``due_of`` knows no due time for (the background load)


def consume(
    q: Rotator,
    due_of: Callable[[str], float | None],
    wanted: int,
    give_up_s: float,
    *,
    count: int,
    block: float,
) -> Consumed:
    """One consumer claiming everything with ``next(count, block=block, ack=<the previous
    batch>)`` until ``wanted`` jobs with a due time (``due_of`` their id) came, or
    ``give_up_s`` passed."""
    got = Consumed([], [], 0)
    give_up = time.monotonic() + give_up_s
    finished: list[Job] = []
    while len(got.delays) < wanted and time.monotonic() < give_up:
        jobs = q.next(count, block=block, ack=finished)
        received = now_ms()
        for job in jobs:
            due = due_of(job.id)
            if due is None:
                got.others += 1
            else:
                got.delays.append(received - due)
                got.dues.append(due)
        finished = jobs
    q.ack(*finished)
    return got


def skipped_ticks(ticks: list[float]) -> int:
    """Ticks between those received that made no job of their own (a catch-up job stands
    for them: it carries the first tick it missed)."""
    every_ms = round(SCHEDULE_EVERY_S * 1000)
    gaps = [b - a for a, b in pairwise(ticks)]
    return sum(max(0, round(gap / every_ms) - 1) for gap in gaps)


def tick_under_load(client: redis.Redis, url: str, sizes: Sizes, hz: int) -> dict[str, Any]:
    name = "sched-tick-load"
    q = Rotator.from_url(url, name, timeout=60)
    due: dict[str, float] = {}
    spread_ms = int(sizes.tick_spread_s * 1000)
    jitter = random.Random(15)
    with producing(url, name, sizes.load_rate) as load:
        start = server_ms(client) + 1000
        wanted = [f"s-{i:05d}" for i in range(sizes.tick_jobs)]
        for job_id in wanted:
            q.push(job_id, at=(start + jitter.randrange(spread_ms)) / 1000)
        # The due times as the module keeps them (its ZSET's scores), exact to the ms.
        scores = client.zmscore(q.keys.scheduled, wanted)
        due = {job_id: float(s) for job_id, s in zip(wanted, scores, strict=True) if s}
        got = consume(q, due.get, len(due), sizes.tick_spread_s + 15, count=DRAIN_BATCH, block=1.0)
    row = delays_row(
        "load",
        got.delays,
        hz=hz,
        scheduled=len(due),
        spread_s=sizes.tick_spread_s,
        **under_load(sizes, load, got.others),
    )
    q.delete()
    q.client.close()
    return row


def idle_round(client: redis.Redis, url: str, rnd: int, jitter: random.Random) -> float | None:
    """One consumer blocked in next(1, block=5) on an empty queue, then one job scheduled
    0.3-1.2 s ahead: how long after its due time the consumer had it (None: never)."""
    name = f"sched-tick-idle-{rnd}-{time.time_ns()}"
    consumer = Rotator(redis.Redis.from_url(url, socket_timeout=IDLE_BLOCK_S + 1), name)
    got: list[tuple[list[Job], float]] = []

    def wait() -> None:
        got.append((consumer.next(1, block=IDLE_BLOCK_S), now_ms()))

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    wait_blocked(client, 1)
    time.sleep(jitter.uniform(0, 0.1))  # a random phase of the cron ticks
    q = Rotator(client, name)
    q.push("idle", delay=jitter.uniform(0.3, 1.2))
    score = client.zscore(q.keys.scheduled, "idle")
    thread.join(IDLE_BLOCK_S + 10)
    consumer.client.close()
    q.delete()
    if not got or not got[0][0] or score is None:
        return None
    return got[0][1] - float(score)


def tick_idle(client: redis.Redis, url: str, sizes: Sizes, hz: int, case: str) -> dict[str, Any]:
    jitter = random.Random(hz)
    delays, missed = [], 0
    for rnd in range(sizes.idle_rounds):
        late = idle_round(client, url, rnd, jitter)
        if late is None:
            missed += 1
        else:
            delays.append(late)
    return delays_row(
        case,
        delays,
        hz=hz,
        rounds=sizes.idle_rounds,
        consumer=f"next(1, block={IDLE_BLOCK_S:g})",
        missed=missed,
    )


def schedule_under_load(client: redis.Redis, url: str, sizes: Sizes, hz: int) -> dict[str, Any]:
    """The recurring schedule's tick lateness under the load and consumer of the "load" row."""
    name = "sched-every-load"
    q = Rotator.from_url(url, name, timeout=60)
    with producing(url, name, sizes.load_rate) as load:
        q.schedule(SCHEDULE, every=SCHEDULE_EVERY_S)
        got = consume(
            q,
            tick_ms,
            sizes.schedule_ticks,
            sizes.schedule_ticks * SCHEDULE_EVERY_S + 15,
            count=DRAIN_BATCH,
            block=1.0,
        )
        q.unschedule(SCHEDULE)
    row = delays_row(
        "schedule_load",
        got.delays,
        hz=hz,
        every_s=SCHEDULE_EVERY_S,
        ticks=sizes.schedule_ticks,
        skipped=skipped_ticks(got.dues),
        ticks_ms=got.dues,
        **under_load(sizes, load, got.others),
    )
    q.delete()
    q.client.close()
    return row


def schedule_idle(
    client: redis.Redis, url: str, sizes: Sizes, hz: int, case: str
) -> dict[str, Any]:
    """The recurring schedule's tick lateness with one consumer blocked between ticks."""
    name = f"sched-every-idle-{hz}-{time.time_ns()}"
    q = Rotator(redis.Redis.from_url(url, socket_timeout=IDLE_BLOCK_S + 1), name)
    q.schedule(SCHEDULE, every=SCHEDULE_EVERY_S)
    wanted = sizes.idle_rounds
    got = consume(q, tick_ms, wanted, wanted * SCHEDULE_EVERY_S + 15, count=1, block=IDLE_BLOCK_S)
    q.delete()
    q.client.close()
    return delays_row(
        case,
        got.delays,
        hz=hz,
        every_s=SCHEDULE_EVERY_S,
        ticks=wanted,
        skipped=skipped_ticks(got.dues),
        ticks_ms=got.dues,
        consumer=f"next(1, block={IDLE_BLOCK_S:g}, ack=...)",
    )


def tick_rows(client: redis.Redis, url: str, sizes: Sizes, log: Log) -> list[dict[str, Any]]:
    hz = int(client.config_get("hz")["hz"] or 10)
    rows = [
        tick_under_load(client, url, sizes, hz),
        schedule_under_load(client, url, sizes, hz),
        tick_idle(client, url, sizes, hz, "idle"),
        schedule_idle(client, url, sizes, hz, "schedule_idle"),
    ]
    client.config_set("hz", 100)
    try:
        rows.append(tick_idle(client, url, sizes, 100, "idle_hz100"))
        rows.append(schedule_idle(client, url, sizes, 100, "schedule_idle_hz100"))
    finally:
        client.config_set("hz", hz)
    for row in rows:
        skipped = f", {row['skipped']} skipped" if "skipped" in row else ""
        log(
            f"  tick {row['case']:<19} hz {row['hz']:>3}: p50 {row['p50_ms']} ms, p99 "
            f"{row['p99_ms']} ms, max {row['max_ms']} ms ({row['received']} received{skipped})"
        )
    return rows


# -- one server -----------------------------------------------------------------------------------


def run_server(kind: str, sizes: Sizes, workdir: Path, log: Log) -> dict[str, Any]:
    with started(kind, workdir / f"scheduled-{kind}") as server:
        client = server.client()
        log(f"scheduled on {kind} {server.version}")
        queues = {
            0: Rotator(client, "sched-none", timeout=600),
            sizes.far: Rotator(client, "sched-far", timeout=600),
        }
        load = load_far(client, queues[sizes.far], sizes.far, log)
        claims, ratios = claim_rows(client, queues, sizes, log)
        for r in ratios:
            log(
                f"  ratio batch {r['batch']:>3}: wall {r['wall_ratio']}x, "
                f"server {r['server_ratio']}x (target {TARGETS['claim_ratio_max']}x)"
            )
        promotions = promotion_rows(client, queues, sizes, log)
        pushes = push_rows(client, queues[sizes.far], sizes.far, sizes, log)
        for q in queues.values():
            q.delete()
        wait_lazyfree(client)
        ticks = tick_rows(client, server.url, sizes, log)
        config = {**client.config_get("hz"), **client.config_get("dynamic-hz")}
        client.close()
        return {
            "version": server.version,
            "config": config,
            "load": load,
            "claims": claims,
            "ratios": ratios,
            "push": pushes,
            "promotion": promotions,
            "ticks": ticks,
        }


# -- the table ------------------------------------------------------------------------------------


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r[key] is not None]
    return statistics.median(values) if values else None


def _num(value: float | None, fmt: str = ",.2f") -> str:
    return "-" if value is None else format(value, fmt)


def markdown(data: dict[str, Any]) -> str:
    sizes = data["sizes"]
    far = sizes["far"]
    table = ServerTable(data["results"])
    add = table.add

    def claim(batch: int, held: int) -> Callable[[dict[str, Any]], str]:
        def cell(r: dict[str, Any]) -> str:
            row = next(c for c in r["claims"] if (c["batch"], c["scheduled"]) == (batch, held))
            return f"{row['median_jobs_per_s']:,.0f} / {row['median_server_us_per_job']:.2f}"

        return cell

    def ratio(batch: int) -> Callable[[dict[str, Any]], str]:
        def cell(r: dict[str, Any]) -> str:
            row = next(c for c in r["ratios"] if c["batch"] == batch)
            return f"{row['wall_ratio']:.2f}x / {_num(row['server_ratio'])}x"

        return cell

    for batch in sizes["batches"]:
        for held in (0, far):
            add(
                f"claim `next({batch})`, {held:,} scheduled (jobs/s / server µs a job)",
                claim(batch, held),
            )
        add(f"ratio {far:,} / 0 scheduled, batch {batch} (wall / server)", ratio(batch))
    add(
        f"load {far:,} scheduled, chunks of {LOAD_CHUNK} (jobs/s / B a job in the ZSET)",
        lambda r: f"{r['load']['jobs_per_s']:,.0f} / {r['load']['zset_bytes_per_job']:.0f}",
    )

    def push(kind: str, chunk: int, onto: int) -> Callable[[dict[str, Any]], str]:
        def cell(r: dict[str, Any]) -> str:
            row = next(
                p
                for p in r["push"]
                if (p["command"], p["chunk"], p["onto_scheduled"]) == (kind, chunk, onto)
            )
            return f"{row['server_us_per_job']:.2f} / {row['wall_us_per_job']:.1f}"

        return cell

    for chunk in (1, PUSH_CHUNK):
        for kind, onto, what in (
            ("push", 0, "push (ready)"),
            ("push_later", 0, "scheduled push"),
            ("push_later", far, f"scheduled push onto {far:,}"),
        ):
            add(f"{what}, {chunk} a call (server / wall µs a job)", push(kind, chunk, onto))

    def promotion(held: int) -> Callable[[dict[str, Any]], str]:
        def cell(r: dict[str, Any]) -> str:
            rows = [p for p in r["promotion"] if p["scheduled_later"] == held]
            return (
                f"{_num(_median(rows, 'promotion_us_per_job'))} / "
                f"{_num(_median(rows, 'promoting_call_median_ms'))} / "
                f"{_num(max(p['worst_call_ms'] for p in rows))}"
            )

        return cell

    for held in (0, far):
        add(
            f"promotion, {sizes['promote']:,} due at once, {held:,} scheduled later "
            "(µs a job / ms a call of 1000 / worst call ms)",
            promotion(held),
        )

    def tick(case: str) -> Callable[[dict[str, Any]], str]:
        def cell(r: dict[str, Any]) -> str:
            row = next((t for t in r["ticks"] if t["case"] == case), None)
            if row is None or row["p50_ms"] is None:
                return "-"
            return f"{row['p50_ms']:.1f} / {row['p99_ms']:.1f} / {row['max_ms']:.1f}"

        return cell

    add(
        f"delay after due, {sizes['tick_jobs']} jobs under a load of {sizes['load_rate']:,} "
        "jobs/s, `next(100, block=1)` (p50 / p99 / max ms)",
        tick("load"),
    )
    rounds = sizes["idle_rounds"]
    hz = table.results[0]["config"].get("hz", "10")
    add(f"delay after due, idle `next(1, block=5)`, hz {hz}, {rounds} rounds", tick("idle"))
    add(f"delay after due, idle, hz 100, {rounds} rounds", tick("idle_hz100"))
    every = f"`schedule(every={SCHEDULE_EVERY_S:g})`"
    add(
        f"recurring {every} tick lateness, {sizes['schedule_ticks']} ticks under a load of "
        f"{sizes['load_rate']:,} jobs/s, `next(100, block=1)` (p50 / p99 / max ms)",
        tick("schedule_load"),
    )
    add(
        f"recurring tick lateness, idle `next(1, block=5)`, hz {hz}, {rounds} ticks",
        tick("schedule_idle"),
    )
    add(f"recurring tick lateness, idle, hz 100, {rounds} ticks", tick("schedule_idle_hz100"))
    return table.text()


def report(data: dict[str, Any]) -> str:
    machine = data["machine"]
    return (
        "# Scheduled jobs benchmark\n\n"
        f"`python -m bench.scheduled` (mode {machine['mode']}) on {machine['cpus']} CPUs, "
        f"{machine['platform']}, Python {machine['python']}, {machine['date']}; module "
        f"{data['module']['sha1'][:12]} at {data['module']['commit']}. Loopback, persistence "
        f"off, single runs (claims: median of {data['sizes']['rounds']} interleaved rounds). "
        f"1-minute load average {machine['load_before']} before and {machine['load_after']} "
        "after (other work shared the machine).\n\n"
        f"{markdown(data)}\n"
    )


# -- the run --------------------------------------------------------------------------------------


def run(
    kinds: Sequence[str], mode: str, workdir: Path, out: Path, log: Log, **resize: Any
) -> dict[str, Any]:
    """Measures every scenario on each server in ``kinds`` and writes ``out/scheduled.json``
    and ``out/scheduled.md``; ``resize`` overrides sizes of the mode (``far=...``)."""
    sizes = replace(SIZES[mode], **resize)
    module = module_info()
    machine = machine_info(mode)
    results = {kind: run_server(kind, sizes, workdir, log) for kind in kinds}
    machine["load_after"] = load_now()
    data: dict[str, Any] = {
        "machine": machine,
        "module": module,
        "sizes": asdict(sizes),
        "targets": TARGETS,
        "results": results,
    }
    return write_results(out, "scheduled", data, report)


def main(argv: list[str] | None = None) -> int:
    parser = sized_parser(__doc__, RESULTS, "scheduled.json")
    parser.add_argument("--far", type=int, help="jobs scheduled far ahead (default: the mode's)")
    args = parser.parse_args(argv)
    if args.table:
        print(markdown(json.loads((args.out / "scheduled.json").read_text())))
        return 0
    mode = size_mode(args)

    def log(line: str) -> None:
        print(line, flush=True)

    began = time.perf_counter()
    resize = {} if args.far is None else {"far": args.far}
    with tempfile.TemporaryDirectory(prefix="rotator-scheduled-") as tmp:
        data = run(args.servers.split(","), mode, Path(tmp), args.out, log, **resize)
    log(markdown(data))
    log(f"done in {time.perf_counter() - began:.0f} s; results in {args.out / 'scheduled.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
