"""Workers that die or freeze: SIGKILL mid-job, deterministic crash points, a zombie.

The server is fine throughout (AOF everysec); what is tested is that a worker that disappears
at any point loses nothing, that its jobs come back only once their lease ran out, and that a
worker that comes back from the dead cannot complete a delivery it no longer holds.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import pytest

from tests.chaos.checker import read_state
from tests.chaos.eventlog import Event, read_logs
from tests.chaos.harness import ChaosRun

AOF_EVERYSEC = {"appendonly": "yes", "appendfsync": "everysec"}
LEASE = 1.5

MakeRun = Callable[..., ChaosRun]


def events_of(run: ChaosRun, kind: str, job_id: str) -> list[Event]:
    return [
        e
        for e in read_logs(run.logs).events
        if e.kind == kind and e.fields and e.fields[0] == job_id
    ]


def deadline_of(token: str) -> float:
    """The lease deadline (unix seconds, server clock) carried by a delivery token."""
    return int(token.split("*", 1)[1].split(".", maxsplit=1)[0]) / 1000


@pytest.mark.chaos
@pytest.mark.timeout(60)
def test_workers_killed_mid_job_lose_nothing_and_every_duplicate_is_explained(
    chaos: MakeRun,
) -> None:
    # 5,000 jobs, 4 workers (two on our loop, two on the library's Rotator.work), 8 SIGKILLs
    # of workers caught mid-job, each replaced at once.
    run = chaos(AOF_EVERYSEC)
    producer = run.spawn_producer(count=5000, batch=100, rate=1500)
    workers = [
        run.spawn_worker(lease=LEASE, job_ms=(1.0, 4.0), mode=("loop", "work")[i % 2])
        for i in range(4)
    ]
    run.wait_booted(workers)
    for _ in range(8):
        time.sleep(run.rng.uniform(0.2, 0.5))
        run.replace_busy(workers)
        run.snapshot()
    assert run.wait_exit(producer, 30) == 0
    run.notes["settled"] = run.settle(timeout=20)

    report = run.check()

    assert report.pushed == 5000, report.summary()
    assert report.faults["worker_kills"] == 8, report.summary()
    assert not report.lost, report.summary()
    assert not report.unexpected, report.summary()
    assert not report.unexplained, report.summary()
    assert report.duplicates <= 8, report.summary()  # at most one per kill (one job held)
    assert not report.false_reclaims, report.summary()
    assert not report.structure, report.summary()
    assert report.quiescent, report.summary()
    assert "unexpected_exits" not in report.notes, report.summary()
    # Workers and their replacements called the module both ways (FCALL first, rotator's
    # default; see ChaosRun.calls_in_turn).
    assert report.notes["calls"]["fcall"] >= 2, report.notes
    assert report.notes["calls"]["evalsha"] >= 2, report.notes


CRASH_CASES = [
    ("after_claim", "log"),
    ("mid_job", "log"),
    ("after_done_before_ack", "log"),
    ("after_done_before_ack", "none"),
    ("after_ack", "log"),
]


@pytest.mark.chaos
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("crash_at", "idempotency"), CRASH_CASES, ids=[f"{c}-idem_{i}" for c, i in CRASH_CASES]
)
def test_a_worker_crashing_at_a_fixed_point_loses_nothing(
    chaos: MakeRun, crash_at: str, idempotency: str
) -> None:
    run = chaos(AOF_EVERYSEC)
    lease = 1.0
    ids = [f"c{n:03d}" for n in range(20)]
    assert run.inline_producer().push(ids)
    crasher = run.spawn_worker(
        lease=lease,
        job_ms=(1.0, 2.0),
        idempotency=idempotency,
        env={"RQ_CRASH_AT": crash_at, "RQ_CRASH_ON_NTH": "3"},
    )
    assert run.wait_exit(crasher, 15) == -signal.SIGKILL, run.stderr(crasher)
    crasher.expected_exits.add(-signal.SIGKILL)  # (its own, at the crash point)
    run.faults["worker_kills"] += 1
    fetches = [e for e in read_logs(run.logs).events if e.kind == "FETCH"]
    crashed_id, crashed_token = fetches[2].fields[0], fetches[2].fields[1]
    replacement = run.spawn_worker(lease=lease, job_ms=(1.0, 2.0), idempotency=idempotency)
    run.wait_booted([replacement])
    run.notes["settled"] = run.settle(timeout=15)

    report = run.check()

    assert report.crashes == {crash_at: 1}, report.summary()
    assert report.pushed == 20, report.summary()
    assert not report.lost, report.summary()
    assert not report.unexpected, report.summary()
    assert not report.unexplained, report.summary()
    assert not report.structure, report.summary()
    assert report.quiescent, report.summary()
    redelivered = [e for e in events_of(run, "FETCH", crashed_id) if e.fields[2] == "1"]
    asked = events_of(run, "IDEM", crashed_id)
    done = events_of(run, "DONE", crashed_id)
    if crash_at == "after_ack":
        # Acked before the crash: never handed out again, nothing to ask the callback.
        assert (redelivered, asked, len(done)) == ([], [], 1), report.summary()
        assert report.duplicates == 0, report.summary()
        return
    # The lease had to run out first, whichever path the job took back.
    first_back = (asked or redelivered)[0]
    assert first_back.at >= deadline_of(crashed_token) - 0.05, (first_back, crashed_token)
    if idempotency == "none":
        # Done, not acked, no callback: it runs again, a duplicate explained by the reclaim.
        assert len(redelivered) == 1, report.summary()
        assert len(done) == 2, report.summary()
        assert report.duplicate_detail == {
            crashed_id: {"processed": 2, "reclaims": 1, "copies": 1}
        }, report.summary()
    elif crash_at == "after_done_before_ack":
        # The callback finds the DONE line: acked without running it again.
        assert [e.fields[1] for e in asked] == ["1"], report.summary()
        assert (redelivered, len(done)) == ([], 1), report.summary()
        assert report.duplicates == 0, report.summary()
    else:
        # Never finished: the callback says so, and it runs once more, exactly once.
        assert [e.fields[1] for e in asked] == ["0"], report.summary()
        assert len(redelivered) == 1, report.summary()
        assert len(done) == 1, report.summary()
        assert report.duplicates == 0, report.summary()


@pytest.mark.chaos
@pytest.mark.timeout(60)
def test_a_zombie_worker_acks_late_and_is_fenced(chaos: MakeRun) -> None:
    run = chaos(AOF_EVERYSEC)
    lease = 1.0
    producer = run.inline_producer()
    assert producer.push(["zombie"])
    zombie = run.spawn_worker(lease=lease, job_ms=(400.0, 400.0))
    assert run.wait_log(zombie, " START zombie ", 10)
    run.signal(zombie, signal.SIGSTOP)  # frozen mid-job, holding the lease
    frozen_at = time.monotonic()
    run.faults["stalls"] += 1
    run.faults["zombies"] += 1
    helper = run.spawn_worker(lease=lease, job_ms=(1.0, 3.0))
    assert producer.push([f"bg{n:03d}" for n in range(200)])

    # The helper gets the job back once the lease ran out, runs it and acks it; the lap
    # that follows removes the element.
    assert run.wait_log(helper, " ACK_OK zombie ", 15), run.stderr(helper)
    fetches = events_of(run, "FETCH", "zombie")
    (reclaim,) = [e for e in fetches if e.source == helper.name]
    assert reclaim.fields[2] == "1"  # reclaimed
    (first,) = [e for e in fetches if e.source == zombie.name]
    zombie_token = first.fields[1]
    run.rotator().sweep()
    time.sleep(max(0.0, frozen_at + 2 * lease - time.monotonic()))
    ring = read_state(run.admin(), run.rotator()).ring
    assert not [e for e in ring if e.startswith("zombie")], ring

    run.signal(zombie, signal.SIGCONT)  # it finishes the job and acks, far too late
    assert run.wait_log(zombie, " ACK_OK zombie ", 10), run.stderr(zombie)
    (late_ack,) = [e for e in events_of(run, "ACK_OK", "zombie") if e.source == zombie.name]
    assert late_ack.fields[1:] == (zombie_token, "0")  # refused: fenced by its token
    state = read_state(run.admin(), run.rotator())
    assert zombie_token not in state.done | state.done_old  # no phantom completion

    # The same id pushed again is a new job and is delivered again.
    assert producer.push(["zombie"])
    give_up = time.monotonic() + 10
    while len(events_of(run, "DONE", "zombie")) < 3 and time.monotonic() < give_up:
        time.sleep(0.05)
    report = run.check()

    assert report.fenced_acks == 1, report.summary()
    assert report.duplicate_detail["zombie"] == {
        "processed": 3,  # the zombie, the helper, the new push
        "reclaims": 1,
        "copies": 2,
    }, report.summary()
    assert not report.lost, report.summary()
    assert not report.unexpected, report.summary()
    assert not report.unexplained, report.summary()
    assert not report.structure, report.summary()
    assert report.quiescent, report.summary()
