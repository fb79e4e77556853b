"""Scheduled pushes and a recurring schedule under faults (issue 15): workers SIGKILLed and
replaced, then the server SIGKILLed and restarted from its AOF as well.

A producer pushes 1,500 ids in batches; 60 % of the batches are pushed for later (``delay``
or ``at``, a third of them due at once, the rest spread over the next 4 s), the rest at once.
A schedule ticks every 0.2 s throughout. The checker (``checker.py``) then proves:

* every scheduled job was delivered and completed (none lost), and none was claimed before
  its due time by the server's clock: the claim's server time is the token's deadline less
  the worker's lease, compared with the earliest time the producer asked for (``at``, or its
  clock before the call plus ``delay``; the server's clock is this machine's, so no skew
  allowance is needed, only the ms rounding both sides do downwards);
* every duplicate is explained, as for plain jobs (a reclaim after a crash, a replayed push);
* no tick id was enqueued twice: each ``tick@<ms>`` has at most one first delivery
  (deliveries 1), counted over the FETCH and CLAIM lines of every worker and the tokens in
  the queue at every snapshot and at the end. A redelivery after a worker's crash
  (deliveries 2, reclaimed) is the same enqueue; a second first delivery would be a second;
* consecutive ticks are a whole multiple of 0.2 s apart (missed ticks collapse into one
  catch-up), no tick was claimed before its time, and every tick seen was completed.

On the server kill: a tick is decided inside one script, which pushes ``tick@<T>`` and moves
the schedule's member to its next tick together, and the AOF holds a script's writes whole
or not at all. The run uses ``appendfsync always``, as the other kill -9 runs do, so a reply
leaves the server only once the writes it answers are fsynced: a firing whose writes the kill
lost was never seen by any worker, and the restarted server fires the same tick again with the
same id ``tick@<T>``. That is one enqueue of that tick (the only one anyone saw), and the
checker counts it as one. With ``appendfsync everysec`` a kill may also lose a firing a
worker had already claimed; the restarted server then fires ``tick@<T>`` again and a second
first delivery of that id appears. That is still not a second, distinct tick, but the same
tick fired again after the server forgot it: the checker counts such a pair as a refire (when
a lossy server kill lies between the two claims), and a duplicate it explains, never as a
doubled tick (``test_checker.py`` shows both cases). This run must show no refire.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.chaos.checker import Report
from tests.chaos.eventlog import read_logs
from tests.chaos.harness import ChaosRun, Proc

AOF_ALWAYS = {"appendonly": "yes", "appendfsync": "always"}
AOF_EVERYSEC = {"appendonly": "yes", "appendfsync": "everysec"}
LEASE = 1.5
EVERY = 0.2  # the schedule's interval, seconds
JOBS = 1500
SPREAD = 4.0  # scheduled pushes fall due over this many seconds after they are made

MakeRun = Callable[..., ChaosRun]


def begin(run: ChaosRun) -> tuple[Proc, list[Proc]]:
    """The schedule, the producer (3 s of pushes, 60 % for later) and three workers: two on
    our loop, one on the library's Rotator.work."""
    run.schedule("beat", every=EVERY, job_id="tick")
    run.notes["scheduled_at"] = time.time()
    producer = run.spawn_producer(
        count=JOBS, batch=25, rate=500, later=0.6, soon=1 / 3, spread=SPREAD
    )
    workers = [
        run.spawn_worker(lease=LEASE, job_ms=(1.0, 4.0), mode=mode)
        for mode in ("loop", "work", "loop")
    ]
    run.wait_booted(workers)
    return producer, workers


def finish(run: ChaosRun, producer: Proc, *, allow_leftovers: bool) -> Report:
    assert run.wait_exit(producer, 30) == 0, run.stderr(producer)
    # Every scheduled job has fallen due and been taken, and what was taken is done.
    run.notes["settled"] = run.settle(timeout=SPREAD + 15)
    run.notes["ticking_for"] = round(time.time() - float(run.notes["scheduled_at"]), 2)
    # How far ahead the scheduled batches were due, as asked (the producer has exited).
    ahead = [
        int(e.fields[2]) - e.at * 1000
        for e in read_logs(run.logs).events
        if e.kind == "PUSH_INVOKE" and len(e.fields) > 2
    ]
    run.notes["due_in_ms"] = {
        "at_once": sum(ms <= 0 for ms in ahead),
        "later": sum(ms > 0 for ms in ahead),
        "latest": round(max(ahead, default=0)),
    }
    return run.check(allow_leftovers=allow_leftovers)


def assert_scheduled_and_ticks_ok(report: Report, *, on_time: float) -> None:
    assert report.pushed == JOBS, report.summary()
    assert report.scheduled > JOBS // 3, report.summary()  # ~60 % of the batches, for later
    due = report.notes["due_in_ms"]
    assert due["at_once"] > 0, report.summary()
    assert due["later"] > 0, report.summary()
    assert due["latest"] > 1000 * SPREAD / 2, report.summary()  # spread over the run
    assert not report.lost, report.summary()
    assert not report.unexpected, report.summary()
    assert not report.unexplained, report.summary()
    assert not report.early, report.summary()
    assert not report.doubled, report.summary()
    assert not report.tick_spacing, report.summary()
    assert report.tick_refires == 0, report.summary()
    # No tick had two first deliveries (`doubled`), and each had one that was seen, but for
    # at most one per fault: a worker killed between a claim's reply and its log line, or a
    # reply the server's kill cut off (the job then comes back as delivery 2).
    faults = report.faults.get("worker_kills", 0) + report.faults.get("server_restarts", 0)
    assert report.ticks - faults <= report.tick_enqueues <= report.ticks, report.summary()
    # The schedule kept ticking over the whole run, and at least `on_time` of its ticks were
    # claimed on their own; the rest collapsed into catch-ups while no claim came (a server
    # down, a busy machine).
    grid = report.ticks + report.tick_gaps
    assert grid >= 0.5 * float(report.notes["ticking_for"]) / EVERY, report.summary()
    assert report.ticks >= on_time * grid, report.summary()
    assert not report.false_reclaims, report.summary()
    assert not report.structure, report.summary()
    assert report.quiescent, report.summary()
    assert not [k for k in report.errors if k.startswith("work_died")], report.summary()
    assert "unexpected_exits" not in report.notes, report.summary()


@pytest.mark.chaos
@pytest.mark.timeout(60)
def test_scheduled_jobs_and_ticks_survive_worker_kills(chaos: MakeRun) -> None:
    # 6 SIGKILLs of workers caught mid-job, each replaced at once; the server is fine.
    run = chaos(AOF_EVERYSEC)
    producer, workers = begin(run)
    for _ in range(6):
        time.sleep(run.rng.uniform(0.3, 0.7))
        run.replace_busy(workers)
        run.snapshot()

    report = finish(run, producer, allow_leftovers=False)

    assert report.faults["worker_kills"] == 6, report.summary()
    assert_scheduled_and_ticks_ok(report, on_time=0.5)
    assert report.duplicates <= 6, report.summary()  # at most one per kill (one job held)


@pytest.mark.chaos
@pytest.mark.timeout(60)
def test_scheduled_jobs_and_ticks_survive_server_kill9_with_appendfsync_always(
    chaos: MakeRun,
) -> None:
    # 3 server SIGKILLs (restart gaps shorter than the lease) and 3 worker SIGKILLs, in a
    # seeded order. See the module docstring for what a kill means for a tick.
    run = chaos(AOF_ALWAYS)
    producer, workers = begin(run)
    schedule = ["server"] * 3 + ["worker"] * 3
    run.rng.shuffle(schedule)
    gaps = []
    for fault in schedule:
        time.sleep(run.rng.uniform(0.5, 0.9))
        if fault == "server":
            gaps.append(round(run.rng.uniform(0.1, 1.0), 3))
            run.kill9_server(gaps[-1])
        else:
            run.replace_busy(workers)
        run.snapshot()
    run.notes["restart_gaps"] = gaps

    report = finish(run, producer, allow_leftovers=True)

    assert run.aof_loads() == 3, run.server.log_tail()  # each restart reloaded the AOF
    assert not run.lossy
    # Three restarts of up to 1 s, plus the workers' reconnect backoff, leave ticks to collapse.
    assert_scheduled_and_ticks_ok(report, on_time=0.25)
    assert not report.stuck, report.summary()
    push_copies = sum(d["copies"] - 1 for d in report.duplicate_detail.values())
    bound = report.faults["worker_kills"] + 3 * len(workers) + push_copies
    assert report.duplicates <= bound, report.summary()
