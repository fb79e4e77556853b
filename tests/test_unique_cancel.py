"""Unique jobs and cancel on a queue that tracks its ids (``configure(track_ids=True)``),
through the Python API (sync and async), the worker loop and the CLI, on real servers."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest
import redis
import redis.asyncio as aredis

from rotator import JobCancelled, LeaseLost, NotTracked, Rotator
from rotator.aio import AsyncRotator
from rotator.errors import InvalidArgument, InvalidJobId
from rotator.models import Job
from tests.servers import ServerProcess
from tests.test_cli import assert_one_line_error, cli, ok, ok_json


def tracked(client: redis.Redis, name: str, **options: float) -> Rotator:
    q = Rotator(client, name, **options)  # type: ignore[arg-type]
    assert q.configure(track_ids=True).track_ids
    return q


def drain(q: Rotator) -> list[str]:
    """Every job handed out until the queue is empty, each acked."""
    seen: list[str] = []
    while jobs := q.next(100):
        seen += [job.id for job in jobs]
        assert q.ack(*jobs) == len(jobs)
    return seen


def test_a_tracked_queue_holds_each_id_once_and_frees_it_when_acked(
    client: redis.Redis, queue_name: str
) -> None:
    q = tracked(client, queue_name)
    assert q.push("a", "b", "a", unique=True) == 2
    assert q.push("b", "c") == 1  # every push on a tracked queue skips what it holds
    [a] = q.next(1)
    assert q.push("a", unique=True) == 0  # in flight
    assert q.ack(a) == 1
    assert q.push("a", unique=True) == 1  # acked: free again at once
    assert q.push("d", delay=60, unique=True) == 1
    assert q.push("d", unique=True) == 0  # scheduled
    assert sorted(drain(q)) == ["a", "b", "c"]
    q.sweep()
    assert client.hgetall(q.keys.ids) == {b"d": b"s"}


def test_a_push_retried_after_a_lost_reply_adds_nothing_twice(
    client: redis.Redis, queue_name: str
) -> None:
    q = tracked(client, queue_name)
    ids = [f"order-{i}" for i in range(500)]
    assert q.push_many(ids, unique=True) == 500
    assert q.push_many(ids, unique=True) == 0  # the retry of a push whose reply was lost
    assert sorted(drain(q)) == sorted(ids)


def test_unique_and_cancel_need_a_tracked_queue_and_tracking_needs_an_empty_one(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name)
    with pytest.raises(NotTracked, match="track_ids"):
        q.push("x", unique=True)
    with pytest.raises(NotTracked):
        q.push("x", delay=5, unique=True)
    with pytest.raises(NotTracked):
        q.cancel("x")
    assert not q.exists()  # nothing written
    q.push("x")
    with pytest.raises(InvalidArgument, match="holds no job"):
        q.configure(track_ids=True)
    assert q.configure().track_ids is False
    with pytest.raises(InvalidArgument):
        q.configure(track_ids=1)  # type: ignore[arg-type]


def test_a_malformed_id_is_refused_before_anything_is_written(
    client: redis.Redis, queue_name: str
) -> None:
    q = tracked(client, queue_name)
    q.push("kept")
    before = {key: client.dump(key) for key in q.keys.all if client.exists(key)}
    for bad in ("a*b", "", "x" * 1025):
        with pytest.raises(InvalidJobId):
            q.push("fine", bad, unique=True)
        with pytest.raises(InvalidJobId):
            q.cancel("kept", bad)
    with pytest.raises(InvalidArgument):
        q.push("fine", unique=True, priority=10)
    assert {key: client.dump(key) for key in q.keys.all if client.exists(key)} == before


def test_cancel_finds_scheduled_waiting_and_in_flight_jobs(
    client: redis.Redis, queue_name: str
) -> None:
    q = tracked(client, queue_name, timeout=0.3)
    q.push("later", delay=60)
    q.push("held", "waiting", "kept")
    [held] = q.next(1)
    assert q.cancel("later", "held", "waiting", "nowhere") == 3
    assert q.cancel("later", "held", "waiting") == 0  # cancelled already
    with pytest.raises(JobCancelled):
        q.extend(held)
    with pytest.raises(LeaseLost):  # JobCancelled is a LeaseLost
        q.extend(held)
    assert q.extend_many([held]) == [False]
    assert q.ack(held) == 0
    [kept] = q.next(10)
    assert kept.id == "kept"
    assert q.ack(kept) == 1
    time.sleep(0.5)  # held's lease has run out: it is dropped, not reclaimed
    assert q.next(10) == []
    stats = q.stats()
    assert (stats.cancelled, stats.scheduled) == (3, 0)
    assert q.push("held", unique=True) == 1  # a cancelled id may come back
    assert [job.id for job in q.next(10)] == ["held"]


def test_a_batch_with_a_cancelled_job_acks_the_others_one_by_one(
    client: redis.Redis, queue_name: str
) -> None:
    q = tracked(client, queue_name)
    q.push("a", "b", "c")
    jobs = q.next(3)
    assert q.cancel("b") == 1
    assert q.ack(*jobs) == 2  # the batch ack is refused; the client acks each token
    q.sweep()
    assert q.stats().length == 0
    assert client.hlen(q.keys.ids) == 0


def test_payloads_of_a_unique_push_stay_with_the_job_held(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name, payloads=True)
    q.configure(track_ids=True)
    assert q.push_payloads({"a": "first", "b": "b"}, unique=True) == 2
    assert q.push_payloads({"a": "second"}, unique=True) == 0
    jobs = q.next(10)
    assert {job.id: job.payload for job in jobs} == {"a": b"first", "b": b"b"}


# What a worker loop logs (rotator/worker.py, Ledger.lost_because) when its heartbeat's
# extend finds that the job it runs was cancelled.
CANCELLED_LOG = "job long was cancelled: stopped keeping it, not acked, not retried"


def cancel_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == "rotator.worker" and record.getMessage() == CANCELLED_LOG
    ]


def test_a_worker_stops_a_job_cancelled_while_it_runs(
    client: redis.Redis, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="rotator.worker")
    q = tracked(client, queue_name, timeout=0.4)
    q.push("long", "short")
    started = threading.Event()
    seen: list[str] = []

    def handler(job: Job) -> None:
        seen.append(job.id)
        if job.id == "long":
            started.set()
            time.sleep(1.2)  # the heartbeat extends it meanwhile, and learns of the cancel

    def cancel_it() -> None:
        assert started.wait(10)
        assert q.cancel("long") == 1

    canceller = threading.Thread(target=cancel_it)
    canceller.start()
    summary = q.work(handler, stop_when_empty=True, poll=0.05, install_signal_handlers=False)
    canceller.join()
    assert sorted(seen) == ["long", "short"]  # "long" ran once, and was not retried
    assert (summary.leases_lost, summary.cancelled) == (1, 1)
    assert summary.processed == 1  # "short": the cancelled job is neither counted nor acked
    assert cancel_logged(caplog) == [CANCELLED_LOG]  # once: the heartbeat stopped keeping it
    time.sleep(0.5)
    assert q.next(10) == []
    q.sweep()
    stats = q.stats()
    assert (stats.length, stats.cancelled, stats.completed) == (0, 1, 1)


def test_an_async_worker_stops_a_job_cancelled_while_it_runs(
    server: ServerProcess, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """AsyncRotator.work: the heartbeat's extend (extend_due_async) gets JobCancelled for the
    running job; the worker stops keeping its lease, logs it, counts it as cancelled, and
    neither acks nor retries it (its late ack is refused: it is not completed)."""
    caplog.set_level(logging.WARNING, logger="rotator.worker")

    async def scenario() -> None:
        client = aredis.Redis.from_url(server.url)
        try:
            q = AsyncRotator(client, queue_name, timeout=0.4)
            assert (await q.configure(track_ids=True)).track_ids
            await q.push("long", "short")
            started = asyncio.Event()
            seen: list[str] = []

            async def handler(job: Job) -> None:
                seen.append(job.id)
                if job.id == "long":
                    started.set()
                    await asyncio.sleep(1.2)  # the heartbeat extends it, and learns of the cancel

            async def cancel_it() -> int:
                await asyncio.wait_for(started.wait(), 10)
                return await q.cancel("long")

            canceller = asyncio.ensure_future(cancel_it())
            summary = await q.work(
                handler, stop_when_empty=True, poll=0.05, install_signal_handlers=False
            )
            assert await canceller == 1
            assert sorted(seen) == ["long", "short"]  # "long" ran once, and was not retried
            assert (summary.failed, summary.retried, summary.dead) == (0, 0, 0)
            assert (summary.leases_lost, summary.cancelled) == (1, 1)
            assert summary.processed == 1  # "short": the cancelled job is neither counted nor acked
            await asyncio.sleep(0.5)  # past the lease "long" had: nothing comes back
            assert await q.next(10) == []
            await q.sweep()
            stats = await q.stats()
            assert (stats.length, stats.cancelled, stats.completed) == (0, 1, 1)
            assert (stats.retried, stats.reclaimed, stats.dead_lettered) == (0, 0, 0)
        finally:
            await client.aclose()

    asyncio.run(scenario())
    assert cancel_logged(caplog) == [CANCELLED_LOG]


def test_the_async_client_pushes_unique_jobs_and_cancels(
    server: ServerProcess, queue_name: str
) -> None:
    async def scenario() -> None:
        client = aredis.Redis.from_url(server.url)
        try:
            q = AsyncRotator(client, queue_name)
            with pytest.raises(NotTracked):
                await q.push("x", unique=True)
            assert (await q.configure(track_ids=True)).track_ids
            assert await q.push("x", "x", "y", unique=True) == 2
            assert await q.cancel("y") == 1
            assert [job.id for job in await q.next(10)] == ["x"]
            assert (await q.stats()).cancelled == 1
        finally:
            await client.aclose()

    asyncio.run(scenario())


def test_the_cli_tracks_ids_pushes_unique_jobs_and_cancels(
    server: ServerProcess, queue_name: str
) -> None:
    result = cli(server, "push", queue_name, "x", "--unique")
    assert_one_line_error(result.exit_code, result.stdout, result.stderr, "track_ids")
    assert ok(cli(server, "track-ids", queue_name, "on")) == "on\n"
    assert ok(cli(server, "push", queue_name, "a", "a", "b", "--unique")) == "2\n"
    assert ok(cli(server, "push", queue_name, "-", input="a\nc\n")) == "1\n"
    assert ok_json(cli(server, "cancel", queue_name, "a", "b", "z", "--json")) == {"cancelled": 2}
    assert ok_json(cli(server, "stats", queue_name, "--json"))["cancelled"] == 2
    result = cli(server, "track-ids", queue_name, "on")
    assert ok(result) == "on\n"  # on already: nothing to check
    assert ok(cli(server, "track-ids", queue_name, "off")) == "off\n"
