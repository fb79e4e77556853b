"""A client made with decode_responses=True gets what any other client gets: module replies
are read undecoded on every path (the fast lane, redis-py's own, pipelines, EVALSHA, asyncio),
so a payload that is not UTF-8 reaches the consumer byte for byte instead of failing the
claim that delivers it (a poison pill: every delivery of its batch would fail)."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio as aredis

import rotator.lane
from rotator import Rotator
from rotator.aio import AsyncRotator
from tests.helpers import drain, later
from tests.servers import ServerProcess

BINARY = {"a": b"\xff\xfe\x00 not utf-8", "b": "bödy".encode(), "c": b""}


@pytest.mark.parametrize("lane", [True, False], ids=["lane", "redis-py"])
@pytest.mark.parametrize("functions", [True, False], ids=["fcall", "evalsha"])
def test_a_decoding_client_gets_binary_payloads_byte_for_byte(
    server: ServerProcess,
    queue_name: str,
    monkeypatch: pytest.MonkeyPatch,
    lane: bool,
    functions: bool,
) -> None:
    monkeypatch.setattr(rotator.lane, "ENABLED", lane)
    with redis.Redis(port=server.port, decode_responses=True) as client:
        q = Rotator(client, queue_name, functions=functions, payloads=True)
        assert q.push_payloads(BINARY) == 3
        jobs = q.next(3)
        assert {j.id: j.payload for j in jobs} == BINARY
        assert all(isinstance(j.id, str) and isinstance(j.token, str) for j in jobs)
        assert q.nack(jobs[0]) == 1  # comes back with its payload
        assert q.ack(*jobs[1:]) == 2
        (again,) = q.next(1)
        assert (again.id, again.payload, again.deliveries) == ("a", BINARY["a"], 2)
        assert q.ack(again) == 1
        assert drain(q) == []
        stats = q.stats()
        assert (stats.pending, stats.in_flight, stats.completed) == (0, 0, 3)


def test_a_blocked_decoding_consumer_is_woken_with_a_binary_payload(
    server: ServerProcess, queue_name: str
) -> None:
    """The claim after a wake-up goes in one pipeline with the BLPOP."""
    with redis.Redis(port=server.port, decode_responses=True) as client:
        q = Rotator(client, queue_name, payloads=True)
        q.next()  # (idle: the next call blocks)
        with later(0.2, lambda: q.push_payloads({"x": b"\x80\x81"})):
            (job,) = q.next(1, block=5.0)
        assert (job.id, job.payload) == ("x", b"\x80\x81")
        assert q.ack(job) == 1


def test_a_decoding_asyncio_client_gets_binary_payloads(
    server: ServerProcess, queue_name: str
) -> None:
    async def scenario() -> None:
        client = aredis.Redis(port=server.port, decode_responses=True)
        try:
            for functions in (True, False):
                q = AsyncRotator(
                    client, f"{queue_name}-{functions}", functions=functions, payloads=True
                )
                await q.push_payloads(BINARY)
                jobs = await q.next(3)
                assert {j.id: j.payload for j in jobs} == BINARY
                assert await q.ack(*jobs) == 3
        finally:
            await client.aclose()

    asyncio.run(scenario())
