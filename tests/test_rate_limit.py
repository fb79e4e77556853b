"""Rate limits (``Rotator.set_rate_limit``) through the Python API, the worker loop and the
CLI, on real servers: enforced inside the claim across every consumer, waited on without
polling, and refused bad input that changes nothing."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis
import redis.asyncio as aredis

from rotator import RateLimit, Rotator
from rotator.aio import AsyncRotator
from rotator.errors import InvalidArgument
from tests.servers import ServerProcess
from tests.test_bury_and_overdue import state
from tests.test_cli import assert_one_line_error, cli, ok, ok_json


def test_the_limit_holds_across_consumers(client: redis.Redis, queue_name: str) -> None:
    q = Rotator(client, queue_name)
    q.set_rate_limit(10, per=0.5)
    assert q.stats().rate_limit == RateLimit(10, 0.5)
    q.push_many(f"j{i}" for i in range(200))
    taken: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + 1.6

    def consume() -> None:
        mine = Rotator(client, queue_name)
        while time.monotonic() < stop:
            jobs = mine.next(50, block=0.3)
            mine.ack(*jobs)
            with lock:
                taken.extend(time.monotonic() for _ in jobs)

    threads = [threading.Thread(target=consume) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # A burst of 10, then 20 a second, never more (one more for where the span's ends fall).
    span = max(taken) - min(taken)
    assert len(taken) >= 20
    assert len(taken) <= 10 + span * 20 + 1


def test_a_limited_consumer_waits_without_polling(client: redis.Redis, queue_name: str) -> None:
    q = Rotator(client, queue_name)
    q.set_rate_limit(1, per=0.4)
    q.push("a", "b")
    assert [job.id for job in q.next(5)] == ["a"]
    assert q.next(5) == []  # at the limit: nothing, at once
    before = client.info("commandstats").get("cmdstat_blpop", {}).get("calls", 0)
    started = time.monotonic()
    [job] = q.next(5, block=3)  # told when one more may go, and blocks until then
    waited = time.monotonic() - started
    assert job.id == "b"
    assert 0.2 <= waited < 2.5
    calls = client.info("commandstats").get("cmdstat_blpop", {}).get("calls", 0) - before
    assert calls <= 3  # one wait, not a poll loop


def test_lifting_the_limit_and_bad_limits(client: redis.Redis, queue_name: str) -> None:
    q = Rotator(client, queue_name)
    q.set_rate_limit(1, per=60)
    q.push("a", "b", "c")
    assert len(q.next(5)) == 1
    before = state(client, q)
    for jobs, per in [(0, 1.0), (-1, 1.0), (5, 0), (5, -1.0), (5, 86_401.0), (1.5, 1.0)]:
        with pytest.raises(InvalidArgument):
            q.set_rate_limit(jobs, per=per)  # type: ignore[arg-type]
    assert state(client, q) == before
    q.set_rate_limit(None)
    assert q.stats().rate_limit is None
    assert len(q.next(5)) == 2


def test_the_async_client_sets_a_limit(server: ServerProcess, queue_name: str) -> None:
    async def run() -> RateLimit | None:
        client = aredis.Redis.from_url(server.url)
        q = AsyncRotator(client, queue_name)
        await q.set_rate_limit(2, per=60)
        await q.push("a", "b", "c")
        assert len(await q.next(5)) == 2
        assert await q.next(5) == []
        limit = (await q.stats()).rate_limit
        await client.aclose()
        return limit

    assert asyncio.run(run()) == RateLimit(2, 60.0)


def test_cli_limit(server: ServerProcess, queue_name: str) -> None:
    assert ok(cli(server, "push", queue_name, "a")) == "1\n"
    assert ok(cli(server, "limit", queue_name, "100/s")) == "at most 100 per 1 s\n"
    assert ok_json(cli(server, "stats", queue_name, "--json"))["rate_limit"] == {
        "jobs": 100,
        "per": 1.0,
    }
    assert "100/1s" in ok(cli(server, "stats", queue_name))
    assert ok(cli(server, "limit", queue_name, "5/30s")) == "at most 5 per 30 s\n"
    assert ok(cli(server, "limit", queue_name, "10/m")) == "at most 10 per 60 s\n"
    assert ok(cli(server, "limit", queue_name, "off")) == "no limit\n"
    assert ok_json(cli(server, "stats", queue_name, "--json"))["rate_limit"] is None
    for rate in ["fast", "0/s", "10/2d", "10/0s", "1.5/s"]:
        result = cli(server, "limit", queue_name, rate)
        assert_one_line_error(result.exit_code, result.stdout, result.stderr, "RATE")
