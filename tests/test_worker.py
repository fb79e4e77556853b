"""Rotator.work against real servers: every job once, retries, heartbeats, clean stops.

Failed handlers are retried after the worker's backoff (1 s, then 2 s), so the tests that
fail on purpose use one or a few jobs.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import pytest
import redis

from rotator import Job, Rotator, WorkSummary
from tests.helpers import wait_until
from tests.servers import ServerProcess

REPO = Path(__file__).resolve().parent.parent


def lap(queue: Rotator) -> None:
    """One idle lap over a small queue: acked elements leave the ring."""
    assert queue.next() == []


def test_work_until_empty_handles_every_job_once_and_returns_a_summary(
    client: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(client, queue_name, timeout=30)
    ids = [f"job-{i}" for i in range(25)]
    queue.push(*ids)
    seen: list[tuple[str, int]] = []

    summary = queue.work(lambda job: seen.append((job.id, job.deliveries)), stop_when_empty=True)

    assert summary == WorkSummary(processed=25, failed=0, leases_lost=0)
    assert seen == [(job_id, 1) for job_id in ids]
    lap(queue)
    assert queue.stats().length == 0


def test_work_with_four_threads_runs_four_handlers_at_once_and_each_job_once(
    client: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(client, queue_name, timeout=30)
    ids = [f"job-{i}" for i in range(40)]
    queue.push(*ids)
    first_four = threading.Barrier(4)  # broken (and the job failed) unless 4 run together
    lock = threading.Lock()
    seen: list[str] = []

    def handler(job: Job) -> None:
        with lock:
            seen.append(job.id)
            started = len(seen)
        if started <= 4:
            first_four.wait(timeout=10)

    summary = queue.work(handler, concurrency=4, stop_when_empty=True)

    assert summary == WorkSummary(processed=40, failed=0, leases_lost=0)
    assert Counter(seen) == Counter(ids)
    lap(queue)
    assert queue.stats().length == 0


def test_a_failed_handler_is_retried_after_a_backoff_and_succeeds_on_its_second_delivery(
    client: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(client, queue_name, timeout=30)
    queue.push("ok-1", "flaky", "ok-2")
    calls: list[tuple[str, int, float]] = []

    def handler(job: Job) -> None:
        calls.append((job.id, job.deliveries, time.monotonic()))
        if job.id == "flaky" and job.deliveries == 1:
            raise RuntimeError("first delivery fails")

    summary = queue.work(handler, stop_when_empty=True)

    assert summary == WorkSummary(processed=3, failed=1, leases_lost=0, retried=1, dead=0)
    assert [(job_id, n) for job_id, n, _ in calls] == [
        ("ok-1", 1),
        ("flaky", 1),
        ("ok-2", 1),
        ("flaky", 2),
    ]
    flaky = [at for job_id, _, at in calls if job_id == "flaky"]
    assert flaky[1] - flaky[0] >= 0.9  # the nack asked for 1 s of backoff
    lap(queue)
    stats = queue.stats()
    assert (stats.length, stats.dead) == (0, 0)


def test_a_handler_outliving_its_lease_keeps_the_job_through_heartbeats(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(client, queue_name, timeout=0.4)
    queue.push("long")
    started, finished = threading.Event(), threading.Event()
    deliveries: list[int] = []

    def handler(job: Job) -> None:
        deliveries.append(job.deliveries)
        started.set()
        time.sleep(1.5)  # almost four leases long
        finished.set()

    summaries: list[WorkSummary] = []
    worker = threading.Thread(
        target=lambda: summaries.append(queue.work(handler, stop_when_empty=True))
    )
    worker.start()
    stolen: list[Job] = []
    with redis.Redis.from_url(server.url) as other_client:
        other = Rotator(other_client, queue_name, timeout=0.4)
        assert started.wait(10)
        while not finished.is_set():
            jobs = other.next(10)
            stolen.extend(jobs)
            other.ack(*jobs)
            time.sleep(0.02)
    worker.join(20)

    assert not worker.is_alive()
    assert stolen == []
    assert deliveries == [1]
    assert summaries == [WorkSummary(processed=1, failed=0, leases_lost=0)]
    lap(queue)
    assert queue.stats().length == 0


def test_sigterm_lets_the_job_in_hand_finish_and_be_acked_before_a_clean_exit(
    server: ServerProcess, client: redis.Redis, queue_name: str, tmp_path: Path
) -> None:
    queue = Rotator(client, queue_name, timeout=30)
    queue.push("in-hand", "never-started")
    log = tmp_path / "handler.log"
    log.touch()
    command = [sys.executable, "-m", "tests.procs", server.url, queue_name, str(log), "1.0"]
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: "START" in log.read_text(encoding="utf-8"), timeout=30)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    assert proc.returncode == 0, err.decode(errors="replace")
    assert log.read_text(encoding="utf-8").splitlines() == ["START in-hand 1", "DONE in-hand"]
    assert out.decode().split() == ["processed=1", "failed=0", "lost=0"]
    (left,) = queue.next()  # the job it had not started stays queued, never delivered
    assert (left.id, left.deliveries) == ("never-started", 1)
    queue.ack(left)
    lap(queue)
    assert queue.stats().length == 0  # "in-hand" was acked: it can never come back
    assert queue.next() == []


def test_a_job_that_always_fails_is_dead_lettered_after_max_deliveries(
    client: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(client, queue_name, timeout=30, max_deliveries=2)
    queue.push("doomed")
    deliveries: list[int] = []

    def handler(job: Job) -> None:
        deliveries.append(job.deliveries)
        raise ValueError("always")

    summary = queue.work(handler, stop_when_empty=True)

    # In jobs: "doomed" was retried once, then died; in deliveries, two failed.
    assert summary == WorkSummary(processed=0, failed=2, leases_lost=0, retried=1, dead=1)
    assert deliveries == [1, 2]
    (letter,) = queue.dead()
    # Buried on its last delivery, with the error (a nack would have left it to the next
    # claim, which dead-letters it as max_deliveries, without the error).
    assert (letter.id, letter.reason, letter.deliveries) == ("doomed", "failed", 2)
    assert letter.error == "ValueError: always"
    stats = queue.stats()
    assert (stats.length, stats.dead) == (0, 1)


def test_the_last_failure_says_dead_letters_not_retrying_and_dies_without_a_backoff(
    client: redis.Redis, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    queue = Rotator(client, queue_name, timeout=30, max_deliveries=3)
    queue.push("doomed", "flaky")
    failed_at: list[float] = []

    def handler(job: Job) -> None:
        if job.id == "flaky" and job.deliveries == 2:
            return
        failed_at.append(time.monotonic())
        raise ValueError(f"boom {job.id} {job.deliveries}")

    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="rotator.worker"):
        summary = queue.work(handler, stop_when_empty=True)

    failures = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert failures == [
        "job doomed failed (delivery 1 of 3): boom doomed 1; retrying in 1 s",
        "job flaky failed (delivery 1 of 3): boom flaky 1; retrying in 1 s",
        "job doomed failed (delivery 2 of 3): boom doomed 2; retrying in 2 s",
        "job doomed failed (delivery 3 of 3): boom doomed 3; "
        "no deliveries left: it goes to the dead letters",
    ]
    # Jobs: flaky completed after one retry; doomed was retried (counted once), then died.
    assert (summary.completed, summary.retried, summary.dead) == (1, 2, 1)
    assert summary.failed == 4  # deliveries
    # No backoff after the last failure: the run ends about 1 + 2 s after it began.
    assert time.monotonic() - began < 3 + 1.5
    assert [letter.id for letter in queue.dead()] == ["doomed"]


def test_without_max_deliveries_failures_say_retrying_and_nothing_dies(
    client: redis.Redis, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    queue = Rotator(client, queue_name, timeout=30)
    queue.push("once")

    def handler(job: Job) -> None:
        if job.deliveries == 1:
            raise ValueError("first")

    with caplog.at_level(logging.WARNING, logger="rotator.worker"):
        summary = queue.work(handler, stop_when_empty=True)

    assert [r.getMessage() for r in caplog.records if "failed" in r.getMessage()] == [
        "job once failed (delivery 1): first; retrying in 1 s"
    ]
    assert (summary.completed, summary.retried, summary.dead) == (1, 1, 0)


def test_every_job_of_a_claimed_batch_keeps_its_lease_until_it_is_acked(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    # A fast job first, so the worker's next claim takes a batch of two; then two slow ones:
    # the worker holds both for two handler runs. A job waiting for its turn, or finished but
    # waiting for the batch's ack, is still the worker's: its lease must be kept alive like
    # the running one's, or another consumer is handed it meanwhile.
    queue = Rotator(client, queue_name, timeout=0.4)
    queue.push("warm-up", "first", "second")
    handled: list[tuple[str, int]] = []
    finished = threading.Event()

    def handler(job: Job) -> None:
        handled.append((job.id, job.deliveries))
        if job.id == "warm-up":
            return
        time.sleep(0.6)  # longer than the lease of 0.4 s
        if len(handled) == 3:
            finished.set()

    summaries: list[WorkSummary] = []
    worker = threading.Thread(
        target=lambda: summaries.append(queue.work(handler, batch=2, stop_when_empty=True))
    )
    worker.start()
    stolen: list[Job] = []
    with redis.Redis.from_url(server.url) as other_client:
        other = Rotator(other_client, queue_name, timeout=30)
        wait_until(lambda: len(handled) == 2)
        while not finished.is_set() and worker.is_alive():
            jobs = other.next(10)
            stolen.extend(jobs)
            other.ack(*jobs)
            time.sleep(0.02)
    worker.join(20)

    outcome = ([(job.id, job.deliveries) for job in stolen], handled, summaries)
    assert outcome == (
        [],
        [("warm-up", 1), ("first", 1), ("second", 1)],
        [WorkSummary(3, 0, 0)],
    )


class ClaimCounting(Rotator):
    """A Rotator that notes the count each claim asks for."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.claims: list[int] = []

    def next(
        self,
        count: int = 1,
        block: float | None = None,
        *,
        ack: object = (),
        durations: Iterable[float] = (),
    ) -> list[Job]:
        self.claims.append(count)
        return super().next(count, block, ack=ack, durations=durations)  # type: ignore[arg-type]


def test_claims_grow_to_the_batch_for_fast_jobs_and_stay_single_for_slow_ones(
    client: redis.Redis, queue_name: str
) -> None:
    fast = ClaimCounting(client, queue_name, timeout=30)
    fast.push_many(f"fast-{i}" for i in range(250))
    summary = fast.work(lambda job: None, stop_when_empty=True)
    assert summary.processed == 250
    # The first claim takes one job (the pace is unknown), then whole batches of 100.
    assert fast.claims[:3] == [1, 100, 100], fast.claims
    assert max(fast.claims) == 100

    slow = ClaimCounting(client, queue_name + "-slow", timeout=30)
    slow.push("a", "b", "c")
    assert slow.work(lambda job: time.sleep(0.15), stop_when_empty=True).processed == 3
    assert set(slow.claims) == {1}, slow.claims  # 0.15 s a job: more than a claim's 0.1 s

    capped = ClaimCounting(client, queue_name + "-capped", timeout=30)
    capped.push_many(f"c-{i}" for i in range(30))
    assert capped.work(lambda job: None, batch=10, stop_when_empty=True).processed == 30
    assert capped.claims[:3] == [1, 10, 10], capped.claims
