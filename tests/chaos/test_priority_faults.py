"""Priorities (issue 16) under faults: a producer pushing its batches at three levels in turn
(0, 3 and 9), workers SIGKILLed mid-job and replaced, every client behind the fault proxy
(lost replies, requests dropped, connections killed, a blackhole), and once every worker
frozen (SIGSTOP) for a second so that a backlog builds up at every level.

The checker (``checker.py``) proves what it proves for plain jobs: nothing lost (a job left
waiting at a priority counts as left over, not as done), every duplicate explained (a
reclaim after a kill or a lost reply, a push run again by redis-py's replay or the
producer's retry), the queue quiet at the end (no job waiting at any level either) and
``stats().prioritized`` back to 0.

And what strict priorities promise, on the backlog the freeze built: the jobs waiting when
the workers are let go again (read in one MULTI just before: the ring's pending ids are
level 0, the members ``*<level>*<id>`` of the scheduled set the others) are first delivered
level by level. The claim's server time of a first delivery (deliveries 1) is its token's
deadline less the lease, the same for every worker, so the deadlines order the claims:
every waiting level-0 job's is at or before every waiting level-3 job's, and those at or
before every waiting level-9 job's. A job whose first delivery nobody saw (its claim's reply
lost: it comes back as delivery 2 once its lease runs out, when it goes as any job) is left
out of that comparison, and so is a job whose push may have run twice (a batch tried again
or replayed by redis-py): its second copy, pushed after the first was acked, goes at its own
level later, and its first delivery may be the only one seen. Of the others, a job's claim is
its earliest first delivery made after the freeze (by the server's clock), not the first one
the logs happen to list (they are read file by file).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from itertools import pairwise

import pytest

from tests.chaos.checker import SENTINEL, deadline_of, deliveries_of, read_state
from tests.chaos.eventlog import read_logs
from tests.chaos.faultproxy import FaultProxy, Mode
from tests.chaos.harness import ChaosRun, Proc

AOF_EVERYSEC = {"appendonly": "yes", "appendfsync": "everysec"}
LEASE = 1.5
JOBS = 3000
LEVELS = (0, 3, 9)
FREEZE = 1.0  # seconds every worker is stopped, the producer pushing on

MakeRun = Callable[..., ChaosRun]


def freeze_workers(run: ChaosRun, workers: list[Proc]) -> tuple[dict[str, int], int]:
    """Stops every worker for FREEZE seconds; returns the jobs waiting at the end of it,
    id -> level, read in one MULTI before the workers go on, and the server's time (ms) just
    after that read, while no worker can claim yet."""
    for worker in workers:
        run.signal(worker, signal.SIGSTOP)
    time.sleep(FREEZE)
    state = read_state(run.admin(), run.rotator())
    seconds, micros = run.admin().time()
    waiting = {e: 0 for e in state.ring if e != SENTINEL and "*" not in e}
    waiting.update(state.prioritized)
    run.notes["frozen_prioritized_stat"] = run.rotator().stats().prioritized
    for worker in workers:
        run.signal(worker, signal.SIGCONT)
    run.faults["freezes"] += 1
    return waiting, seconds * 1000 + micros // 1000


def first_claims(run: ChaosRun, since_ms: int) -> dict[str, int]:
    """Each id's earliest first delivery seen (deliveries 1) claimed at or after `since_ms`
    (server ms): its deadline. A claim's server time is its deadline less the lease."""
    firsts: dict[str, int] = {}
    for event in read_logs(run.logs).events:
        if event.kind in ("FETCH", "CLAIM") and deliveries_of(event.fields[1]) == 1:
            deadline = deadline_of(event.fields[1])
            if deadline - LEASE * 1000 >= since_ms:
                job_id = event.fields[0]
                firsts[job_id] = min(deadline, firsts.get(job_id, deadline))
    return firsts


def pushed_twice(run: ChaosRun) -> set[str]:
    """The ids of every batch the producer may have enqueued more than once: tried again
    (two PUSH_INVOKEs) or replayed by redis-py (PUSH_RETRY)."""
    batches: dict[str, list[str]] = {}
    twice: set[str] = set()
    for event in read_logs(run.logs).events:
        if event.kind == "PUSH_INVOKE":
            if event.fields[0] in batches:
                twice.add(event.fields[0])
            batches[event.fields[0]] = event.fields[1].split(",")
        elif event.kind == "PUSH_RETRY":
            twice.add(event.fields[0])
    return {job_id for batch in twice for job_id in batches.get(batch, ())}


def priority_order(waiting: dict[str, int], firsts: dict[str, int]) -> dict[str, object]:
    """Per level of the jobs waiting at the freeze: how many, how many first deliveries were
    seen, their earliest and latest deadline; and the inversions (a job of a less urgent
    level claimed before one of a more urgent level, by the server's clock)."""
    levels: dict[int, list[int]] = {level: [] for level in LEVELS}
    unseen = 0
    for job_id, level in waiting.items():
        if job_id in firsts:
            levels[level].append(firsts[job_id])
        else:
            unseen += 1
    order: dict[str, object] = {
        f"level_{level}": {
            "waiting": sum(1 for lv in waiting.values() if lv == level),
            "seen": len(deadlines),
            "first_ms": min(deadlines, default=0),
            "last_ms": max(deadlines, default=0),
        }
        for level, deadlines in levels.items()
    }
    inversions = []
    for urgent, later in pairwise(LEVELS):
        if levels[urgent] and levels[later] and max(levels[urgent]) > min(levels[later]):
            behind = sum(d < max(levels[urgent]) for d in levels[later])
            inversions.append(f"{behind} level-{later} jobs claimed before a level-{urgent} one")
    order["unseen"] = unseen
    order["inversions"] = inversions
    return order


@pytest.mark.chaos
@pytest.mark.timeout(90)
def test_priorities_lose_nothing_and_keep_their_order_through_kills_and_lost_replies(
    chaos: MakeRun,
) -> None:
    # Every client behind the fault proxy: 3 % of the requests lose their reply after running,
    # 1 % are dropped before. Every ~0.6 s one of: a worker SIGKILLed mid-job and replaced
    # (4), every client connection killed (2), every worker frozen for 1 s (1); then a 1.5 s
    # blackhole. The server is fine.
    run = chaos(AOF_EVERYSEC)
    proxy = FaultProxy(run.server.port, seed=run.rng.randrange(2**32))
    proxy.start()
    try:
        producer = run.spawn_producer(
            count=JOBS, batch=20, rate=400, url=proxy.url, socket_timeout=1.0, priorities=LEVELS
        )
        workers = [
            run.spawn_worker(
                lease=LEASE,
                job_ms=(1.0, 4.0),
                mode=mode,
                url=proxy.url,
                socket_timeout=1.0,
                functions=n == 0,
            )
            for n, mode in enumerate(("loop", "work", "loop"))
        ]
        run.wait_booted(workers)
        proxy.set_mode(Mode(drop_after=0.03, drop_before=0.01))
        faults = ["worker"] * 4 + ["clients"] * 2 + ["freeze"]
        run.rng.shuffle(faults)
        waiting: dict[str, int] = {}
        frozen_ms = 0
        for fault in faults:
            time.sleep(run.rng.uniform(0.4, 0.8))
            if fault == "worker":
                run.replace_busy(workers)
            elif fault == "clients":
                run.kill_clients()
            else:
                waiting, frozen_ms = freeze_workers(run, workers)
            run.snapshot()
        run.blackhole(proxy)
        assert run.wait_exit(producer, 40) == 0, run.stderr(producer)
        run.notes["settled"] = run.settle(timeout=20)
        report = run.check(allow_leftovers=True)
    finally:
        proxy.stop()
    report.notes["proxy"] = {k: v for k, v in sorted(proxy.stats.items()) if ":" not in k}
    twice = pushed_twice(run)
    once = {job_id: level for job_id, level in waiting.items() if job_id not in twice}
    order = priority_order(once, first_claims(run, frozen_ms))
    order["pushed_twice"] = len(waiting) - len(once)
    report.notes["priority_order"] = order
    report.notes["prioritized_at_end"] = run.rotator().stats().prioritized
    report.write(run.workdir / "report.json")

    assert proxy.stats["dropped_after"] > 0, report.summary()
    assert report.faults["worker_kills"] == 4, report.summary()
    assert report.faults["freezes"] == 1, report.summary()
    assert report.pushed == JOBS, report.summary()
    assert not report.lost, report.summary()
    assert not report.unexpected, report.summary()
    assert not report.unexplained, report.summary()
    assert not report.false_reclaims, report.summary()
    assert not report.structure, report.summary()
    assert report.quiescent, report.summary()
    assert report.notes["prioritized_at_end"] == 0, report.summary()
    assert not [k for k in report.errors if k.startswith("work_died")], report.summary()
    assert "unexpected_exits" not in report.notes, report.summary()
    # The freeze built a backlog at every level, and it went out level by level.
    assert int(report.notes["frozen_prioritized_stat"]) > 0, report.summary()
    for level in LEVELS:
        seen = order[f"level_{level}"]
        assert isinstance(seen, dict)
        assert seen["seen"] >= 10, order
    assert not order["inversions"], order
