"""The server stalls (``CLIENT PAUSE ... WRITE``, ``DEBUG SLEEP``) while jobs flow.

A stall shorter than the lease must be invisible: no reclaim, no duplicate, no error. A stall
longer than the lease lets leases run out under the workers holding them, so a job may run
twice, but only after a reclaim (explained), and nothing is lost.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.chaos.harness import ChaosRun

AOF_EVERYSEC = {"appendonly": "yes", "appendfsync": "everysec"}

MakeRun = Callable[..., ChaosRun]


def stall(run: ChaosRun, how: str, seconds: float) -> None:
    """Stalls the server for ``seconds``; returns once it serves again."""
    if how == "pause":
        run.admin_call("CLIENT", "PAUSE", str(int(seconds * 1000)), "WRITE")
        time.sleep(seconds)
    else:
        run.admin_call("DEBUG", "SLEEP", str(seconds))  # the reply comes after the sleep
    run.faults["stalls"] += 1
    run.faults[f"stall_{how}"] += 1


@pytest.mark.chaos
@pytest.mark.timeout(60)
def test_stalls_shorter_than_the_lease_cause_no_duplicates(chaos: MakeRun) -> None:
    run = chaos(AOF_EVERYSEC)
    producer = run.spawn_producer(count=2000, batch=40, rate=400)
    workers = [run.spawn_worker(lease=1.5, socket_timeout=2.0) for _ in range(3)]
    run.wait_booted(workers)
    stalls = [("pause", 0.4)] * 3 + [("sleep", 0.3)] * 3
    run.rng.shuffle(stalls)
    for how, seconds in stalls:
        time.sleep(run.rng.uniform(0.2, 0.5))
        stall(run, how, seconds)
        run.snapshot()
    assert run.wait_exit(producer, 30) == 0, run.stderr(producer)
    run.notes["settled"] = run.settle(timeout=15)

    report = run.check()

    assert report.faults["stalls"] == 6, report.summary()
    assert report.reclaims == 0, report.summary()  # no lease ran out
    assert report.duplicates == 0, report.summary()
    assert report.errors == {}, report.summary()  # the stall is invisible to clients
    assert report.client_retries == 0, report.summary()
    assert report.pushed == 2000, report.summary()
    assert not report.lost, report.summary()
    assert not report.unexpected, report.summary()
    assert not report.false_reclaims, report.summary()
    assert not report.structure, report.summary()
    assert report.quiescent, report.summary()


@pytest.mark.chaos
@pytest.mark.timeout(60)
def test_stalls_longer_than_the_lease_cause_only_explained_duplicates(chaos: MakeRun) -> None:
    run = chaos(AOF_EVERYSEC)
    lease, batch = 1.0, 5
    # Workers claim 5 jobs at a time, so a stall leaves claimed, unstarted jobs whose leases
    # run out: the other workers take them back (a short ring), the holder runs them anyway
    # (our loop) or drops them once its heartbeat finds the lease lost (Rotator.work).
    # Socket timeouts above the stall: what is tested is leases running out, not replays.
    producer = run.spawn_producer(count=1200, batch=10, rate=250, socket_timeout=3.0)
    workers = [
        run.spawn_worker(
            lease=lease, batch=batch, socket_timeout=3.0, job_ms=(5.0, 10.0), mode=mode
        )
        for mode in ("loop", "loop", "work")
    ]
    run.wait_booted(workers)
    stalls = [("pause", 2.0), ("sleep", 2.0)]
    run.rng.shuffle(stalls)
    for how, seconds in stalls:
        time.sleep(run.rng.uniform(0.8, 1.2))
        stall(run, how, seconds)
        run.snapshot()
    assert run.wait_exit(producer, 30) == 0, run.stderr(producer)
    run.notes["settled"] = run.settle(timeout=15)

    report = run.check(allow_leftovers=True)

    assert report.faults["stalls"] == 2, report.summary()
    # At most the jobs held at each long stall: a batch per worker.
    assert report.duplicates <= 2 * len(workers) * batch, report.summary()
    assert not report.unexplained, report.summary()
    assert report.pushed == 1200, report.summary()
    assert not report.lost, report.summary()
    assert not report.unexpected, report.summary()
    assert not report.false_reclaims, report.summary()
    assert not report.structure, report.summary()
    assert report.quiescent, report.summary()
