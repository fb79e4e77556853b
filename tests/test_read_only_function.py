"""The library's read-only function: the calls that only read go by FCALL_RO, which a server
runs where it refuses FCALL of a function that may write (out of memory under noeviction, a
read-only replica), so stats and the other reads answer there as they do by EVALSHA. On real
Redis 7 and Valkey 8 servers; tests/lua/test_read_only.py runs the same reads on the stub."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

from rotator import Rotator, Stats, Topic
from rotator.aio import AsyncRotator
from rotator.errors import ProtocolError, error_from_reply
from rotator.script import READ_COMMANDS, function_name, module_source, reads_only
from tests.helpers import snapshot, without_age
from tests.servers import Kind, ServerProcess

KINDS = pytest.mark.parametrize("kind", ["redis", "valkey"], ids=["redis7", "valkey8"])
# The server's refusal (redis-py takes its "OOM" code off where it knows the error's class).
OOM = "command not allowed when used memory > 'maxmemory'"


def test_the_calls_sent_by_fcall_ro_are_the_modules_reads() -> None:
    found = re.search(r"local READS = ' ([a-z_ ]+) '", module_source())
    assert found, "no READS in the module"
    assert set(found[1].split()) == {command.decode() for command in READ_COMMANDS}
    assert all(reads_only(args) for args in ([b"stats"], ["peek", 5], [b"durations"]))
    assert not reads_only([b"durations", 90, 6, 2])  # counts to add: a write
    assert not any(reads_only(args) for args in ([b"push", b"a"], [b"unique", b"push", b"a"]))
    assert not reads_only([])


@pytest.fixture
def out_of_memory(kind: Kind, tmp_path: Path) -> Iterator[ServerProcess]:
    with ServerProcess(kind, tmp_path / kind, {"maxmemory-policy": "noeviction"}) as server:
        yield server


def reads_of(queue: Rotator, topic: Topic) -> dict[str, Callable[[], Any]]:
    """Every read the Python client makes, by name: each goes by FCALL_RO by default."""
    return {
        "stats": queue.stats,
        "peek": lambda: queue.peek(10),
        "dead": queue.dead,
        "schedules": queue.schedules,
        "durations": queue.durations,
        "item_stats": lambda: queue.item_stats("a", "b", "gone"),
        "topic stats": topic.stats,
    }


async def async_stats(server: ServerProcess, functions: bool | None) -> Stats:
    client = aredis.Redis(host=server.host, port=server.port)
    try:
        return await AsyncRotator(client, "oom", functions=functions).stats()
    finally:
        await client.aclose()


@KINDS
@pytest.mark.parametrize("functions", [None, True], ids=["default", "fcall"])
def test_out_of_memory_every_read_answers_by_fcall_ro_and_a_write_changes_nothing(
    out_of_memory: ServerProcess, functions: bool | None
) -> None:
    client = out_of_memory.client()
    queue = Rotator(client, "oom", functions=functions, payloads=True, item_stats=True)
    queue.push_payloads({"a": b"1", "b": b"2", "c": b"3"})
    (job, _) = queue.next(2)
    queue.bury(job, error="bad input")
    queue.next(5)  # (the letter is written when a claim reaches the job)
    queue.schedule("nightly", every=86400.0, job_id="report")
    queue.durations(0.05, 0.2)
    topic = Topic(client, "news", functions=functions)
    topic.subscribe("mail", start="earliest")
    topic.publish_many([b"hello", b"world"])
    reads = reads_of(queue, topic)
    before = {name: without_age(read()) for name, read in reads.items()}
    assert all((before["dead"], before["schedules"], before["item_stats"][0]))
    keys = snapshot(client, queue)

    client.config_resetstat()
    client.config_set("maxmemory", 1)
    try:
        with pytest.raises(redis.ResponseError, match=OOM):
            client.set("probe", "x")  # the server is out of memory
        during = {name: without_age(read()) for name, read in reads.items()}
        by_asyncio = without_age(asyncio.run(async_stats(out_of_memory, functions)))
        with pytest.raises(redis.ResponseError, match=OOM):
            queue.push("d")
        with pytest.raises(redis.ResponseError, match=OOM):
            queue.durations(0.1)  # counts to add: a write, by FCALL
        after = snapshot(client, queue)
    finally:
        client.config_set("maxmemory", 0)
    assert during == before
    assert by_asyncio == before["stats"]
    assert after == keys
    calls = client.info("commandstats")
    assert calls["cmdstat_fcall_ro"]["calls"] == len(reads) + 1
    assert "cmdstat_evalsha" not in calls  # (nothing fell back to a script)


@KINDS
def test_fcall_ro_refuses_every_command_that_may_write_and_changes_nothing(
    out_of_memory: ServerProcess,
) -> None:
    client = out_of_memory.client()
    queue = Rotator(client, "refused")
    queue.push("a", "b")
    queue.next()
    keys = snapshot(client, queue)
    read_only = f"{function_name()}_ro"
    refused = (
        [b"push", b"c"],
        [b"next", 1, 30000, 1000, 0],
        [b"unique", b"push", b"c"],
        [b"durations", 90, 6, 2],
        [b"sweep", 100],
        [b"configure", b"track_ids", 1],
        [b"no_such_command"],
        [b"STATS"],
        [b""],
    )
    for args in refused:
        with pytest.raises(redis.ResponseError) as raised:
            client.fcall_ro(read_only, len(queue.keys.all), *queue.keys.all, *args)
        error = error_from_reply(raised.value)
        assert isinstance(error, ProtocolError), (args, error)
        assert "may write: call it by FCALL, not FCALL_RO" in str(error), (args, error)
    assert snapshot(client, queue) == keys

    # A read it runs as FCALL does (the oldest pending job's age aside: time moves).
    def stats_by(command: Callable[..., Any], function: str) -> dict[bytes, Any]:
        reply = command(function, len(queue.keys.all), *queue.keys.all, b"stats")
        stats = dict(zip(reply[::2], reply[1::2], strict=True))
        del stats[b"oldest_pending_age_ms"]
        return stats

    assert stats_by(client.fcall_ro, read_only) == stats_by(client.fcall, function_name())
