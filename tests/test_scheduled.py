"""Scheduled jobs (``push(..., delay=/at=)``) and pause/resume, through the Python API (sync
and async), the worker loop and the CLI, on real servers."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
import redis
import redis.asyncio as aredis

from rotator import Rotator
from rotator.aio import AsyncRotator
from rotator.errors import InvalidArgument, InvalidJobId
from rotator.models import Job
from tests.servers import ServerProcess
from tests.test_bury_and_overdue import state
from tests.test_cli import assert_one_line_error, cli, ok, ok_json


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_a_delayed_job_is_not_delivered_before_its_time_and_is_delivered_after(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name)
    start = server_ms(client)
    assert q.push("later", delay=0.4) == 1
    assert q.push("now") == 1
    stats = q.stats()
    assert (stats.scheduled, stats.pending, stats.length) == (1, 1, 1)
    assert [job.id for job in q.next(10)] == ["now"]
    assert q.next(10) == []
    [job] = q.next(1, block=3)  # a blocked consumer wakes when it falls due
    assert job.id == "later"
    assert server_ms(client) - start >= 400
    assert q.stats().scheduled == 0


def test_at_takes_unix_seconds_or_an_aware_datetime_and_a_time_passed_is_due_at_once(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name)
    now = server_ms(client) / 1000
    assert q.push("past", at=now - 60) == 1
    assert q.push("soon", at=datetime.fromtimestamp(now + 0.3, UTC)) == 1
    assert q.push("far", at=now + 3600) == 1
    assert [job.id for job in q.next(10)] == ["past"]
    assert [job.id for job in q.next(10, block=3)] == ["soon"]
    assert q.stats().scheduled == 1
    assert client.zscore(q.keys.scheduled, "far") == pytest.approx((now + 3600) * 1000, abs=1)


def test_scheduling_an_id_again_moves_it(client: redis.Redis, queue_name: str) -> None:
    q = Rotator(client, queue_name)
    q.push_many(["a", "b"], delay=3600)
    q.push("a", delay=0)
    assert q.stats().scheduled == 2  # one scheduled job per id: a moved, b stays
    assert [job.id for job in q.next(10)] == ["a"]
    assert q.stats().scheduled == 1


def test_a_million_scheduled_jobs_stay_out_of_the_ring(
    client: redis.Redis, queue_name: str
) -> None:
    """Scheduled jobs are not in the ring's laps: a claim of ready jobs visits none of them."""
    q = Rotator(client, queue_name)
    q.push_many((f"s{i}" for i in range(20_000)), chunk=5000, delay=3600)
    q.push("ready")
    assert client.llen(q.keys.ring) == 2  # the sentinel and "ready"
    assert [job.id for job in q.next(10)] == ["ready"]
    assert q.stats().scheduled == 20_000


def test_bad_schedules_are_refused_before_anything_is_sent(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name)
    q.push("kept", delay=60)
    before = state(client, q)
    for delay, at in [
        (-1, None),
        (float("nan"), None),
        (float("inf"), None),
        (10 * 366 * 86400.0, None),
        (True, None),
        ("soon", None),
        (1, 2),
        (None, -5),
        (None, datetime(2030, 1, 1)),  # naive: which zone?
        (None, "tomorrow"),
    ]:
        with pytest.raises(InvalidArgument):
            q.push("x", delay=delay, at=at)  # type: ignore[arg-type]
    with pytest.raises(InvalidJobId):
        q.push("ok", "bad*id", delay=5)
    # The server's own bound: at most ten years after its clock.
    with pytest.raises(InvalidArgument, match="ms after the server"):
        q.push("x", at=time.time() + 11 * 365 * 86400)
    assert state(client, q) == before


def test_payloads_and_item_stats_are_kept_for_a_scheduled_job(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name, payloads=True, item_stats=True)
    before = server_ms(client)
    assert q.push_payloads({"a": b"body-a", "b": "body-b"}, delay=0.2) == 2
    [a_stats, _] = q.item_stats("a", "b")
    assert a_stats is not None
    assert a_stats.enqueued_ms is not None
    assert a_stats.enqueued_ms >= before
    assert a_stats.deliveries == 0
    jobs = q.next(10, block=3)
    assert {(job.id, job.payload) for job in jobs} == {("a", b"body-a"), ("b", b"body-b")}
    assert q.ack(*jobs) == 2
    assert client.exists(q.keys.payloads) == 0  # acked: the payloads go
    assert q.push("c", delay=3600) == 1  # an item-stats queue schedules plain ids too
    [c_stats] = q.item_stats("c")
    assert c_stats is not None
    assert c_stats.deliveries == 0


def test_a_paused_queue_hands_out_nothing_and_takes_acks(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name)
    q.push("a", "b", "c")
    a, b = q.next(2)
    assert q.pause() is True
    assert q.pause() is False
    assert q.stats().paused is True
    q.push("d")
    assert q.next(10) == []
    assert q.next(10, ack=[a]) == []  # the ack is taken
    assert q.extend(b, 5) > time.time()  # leases out go on
    stats = q.stats()
    assert (stats.done, stats.in_flight, stats.pending) == (1, 1, 2)
    assert q.resume() is True
    assert q.resume() is False
    assert q.stats().paused is False
    assert sorted(job.id for job in q.next(10)) == ["c", "d"]


def test_resume_wakes_a_blocked_consumer(client: redis.Redis, queue_name: str) -> None:
    q = Rotator(client, queue_name)
    q.pause()
    q.push("a")
    got: list[Job] = []
    started = threading.Event()

    def consume() -> None:
        other = Rotator(client, queue_name)
        started.set()
        got.extend(other.next(1, block=10))

    consumer = threading.Thread(target=consume)
    consumer.start()
    started.wait()
    time.sleep(0.5)
    assert got == []  # still blocked while paused
    woke = time.monotonic()
    q.resume()
    consumer.join(10)
    assert [job.id for job in got] == ["a"]
    assert time.monotonic() - woke < 5  # woken, not timed out


def test_stop_when_empty_waits_for_scheduled_jobs(client: redis.Redis, queue_name: str) -> None:
    q = Rotator(client, queue_name)
    q.push("now")
    q.push("soon", delay=0.5)
    seen: list[str] = []
    summary = q.work(
        lambda job: seen.append(job.id),
        stop_when_empty=True,
        poll=0.1,
        install_signal_handlers=False,
    )
    assert seen == ["now", "soon"]
    assert summary.processed == 2
    assert q.drained()


def test_the_async_client_schedules_and_pauses(server: ServerProcess, queue_name: str) -> None:
    async def run() -> None:
        client = aredis.Redis.from_url(server.url)
        q = AsyncRotator(client, queue_name)
        assert await q.push("a", delay=0.2) == 1
        assert await q.push_many(["b"], at=time.time() - 1) == 1
        assert [job.id for job in await q.next(5)] == ["b"]
        assert await q.pause() is True
        assert await q.next(5, block=0.5) == []  # a falls due, but the queue is paused
        assert (await q.stats()).scheduled == 1
        assert await q.resume() is True
        assert [job.id for job in await q.next(5, block=3)] == ["a"]
        await client.aclose()

    asyncio.run(run())


def test_cli_push_delay_and_at_pause_and_resume(server: ServerProcess, queue_name: str) -> None:
    assert ok(cli(server, "push", queue_name, "r1", "--delay", "3600")) == "1\n"
    at = (datetime.now(UTC) + timedelta(hours=2)).isoformat().replace("+00:00", "Z")
    assert ok(cli(server, "push", queue_name, "r2", "--at", at)) == "1\n"
    assert ok(cli(server, "push", queue_name, "r3", "--at", str(time.time() - 5))) == "1\n"
    stats = ok_json(cli(server, "stats", queue_name, "--json"))
    assert (stats["scheduled"], stats["paused"]) == (3, False)  # r3 moves at the next claim
    assert ok(cli(server, "pause", queue_name)) == "paused\n"
    assert ok(cli(server, "pause", queue_name)) == "already paused\n"
    assert ok_json(cli(server, "stats", queue_name, "--json"))["paused"] is True
    assert ok_json(cli(server, "next", queue_name, "--json")) == []
    assert ok(cli(server, "resume", queue_name)) == "resumed\n"
    assert ok(cli(server, "resume", queue_name)) == "not paused\n"
    [job] = ok_json(cli(server, "next", queue_name, "--json"))
    assert job["id"] == "r3"
    for args, fragment in [
        (("--delay", "-1"), "--delay"),
        (("--at", "2030-01-01T00:00:00"), "no time zone"),
        (("--at", "someday"), "not an ISO 8601 time"),
        (("--delay", "5", "--at", at), "not both"),
    ]:
        result = cli(server, "push", queue_name, "x", *args)
        assert_one_line_error(result.exit_code, result.stdout, result.stderr, fragment)
    assert ok_json(cli(server, "stats", queue_name, "--json"))["scheduled"] == 2
