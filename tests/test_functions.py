"""The same module called with FCALL, loaded as a function library (functions=True)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import redis
import redis.asyncio as aredis
from redis.cluster import RedisCluster

from rotator import Rotator
from rotator.aio import AsyncRotator
from rotator.script import chosen_mode, function_name
from tests.helpers import drain, later, monitored
from tests.servers import ServerProcess


def test_a_whole_lifecycle_runs_through_fcall(client: redis.Redis, queue_name: str) -> None:
    q = Rotator(client, queue_name, functions=True, timeout=0.15)
    assert q.push("a", "b", "c") == 3
    a, b = q.next(2)
    assert q.ack(a) == 1
    assert q.nack(b, delay=0) == 1
    time.sleep(0.2)
    jobs = q.next(5)
    assert sorted((j.id, j.deliveries) for j in jobs) == [("b", 2), ("c", 1)]
    q.ack(*jobs)
    assert drain(q) == []
    assert q.stats().length == 0
    # FUNCTION LIST answers flat [field, value, ...] lists, one per library.
    libraries = {
        dict(zip(lib[::2], lib[1::2], strict=True))[b"library_name"]
        for lib in client.function_list()
    }
    assert function_name().encode() in libraries


def test_fcall_reloads_the_library_after_function_flush(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name, functions=True)
    q.push("x")
    client.function_flush()
    (job,) = q.next()
    client.function_flush()
    assert q.ack(job) == 1


def test_a_consumer_woken_after_a_function_flush_still_gets_the_job(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name, functions=True)
    q.next()  # the library is loaded
    with later(0.2, lambda: (client.function_flush(), q.push("after"))):
        (job,) = q.next(block=10.0)
    assert (job.id, job.deliveries) == ("after", 1)
    assert q.ack(job) == 1


def test_fcall_and_evalsha_share_one_queue(client: redis.Redis, queue_name: str) -> None:
    by_function = Rotator(client, queue_name, functions=True)
    by_script = Rotator(client, queue_name)
    by_function.push("shared")
    (job,) = by_script.next()
    assert by_function.ack(job) == 1


def test_the_library_survives_a_server_restart(tmp_path: Path) -> None:
    with ServerProcess("valkey", tmp_path, {"appendonly": "yes"}) as server:
        q = Rotator(server.client(), "persisted", functions=True)
        q.push("kept")
        server.restart()
        client = server.client()
        # Functions are persisted with the data: FCALL works before any reload.
        assert client.fcall(function_name(), len(q.keys.all), *q.keys.all, "stats")[1] == 1
        assert [j.id for j in Rotator(client, "persisted", functions=True).next()] == ["kept"]


@pytest.mark.cluster
def test_fcall_on_redis_cluster(cluster_client: RedisCluster) -> None:
    names = ["fc-a", "fc-b", "fc-c"]
    for name in names:
        q = Rotator(cluster_client, name, functions=True)
        q.delete()
        q.push(f"{name}-job")
        (job,) = q.next()
        assert q.ack(job) == 1
        assert q.stats().done == 1


def test_async_fcall(server: ServerProcess, queue_name: str) -> None:
    async def main() -> list[str]:
        client = aredis.Redis.from_url(server.url)
        q = AsyncRotator(client, queue_name, functions=True)
        await q.push("x", "y")
        jobs = await q.next(2)
        await q.ack(*jobs)
        await client.function_flush()
        await q.push("z")
        got = [j.id for j in jobs] + [j.id for j in await q.next(1)]
        await client.aclose()
        return got

    assert asyncio.run(main()) == ["x", "y", "z"]


# -- the default: the faster mode the server allows ------------------------------------------


def test_by_default_a_client_calls_the_module_with_fcall(
    server: ServerProcess, queue_name: str
) -> None:
    client = server.client()
    client.function_flush()
    q = Rotator(client, queue_name)
    assert chosen_mode(client) is None  # nothing is asked before the first call
    # (MONITOR, filtered by the queue's name: the server is shared, and its command counts
    # count every client's calls)
    with monitored(client) as sent:
        q.push("a")
        (job,) = q.next(block=1.0)  # a blocking call pipelines BLPOP with the module call
        assert q.ack(job) == 1
    assert chosen_mode(client) == "fcall"
    own = [command.split(" ", 1)[0].upper() for command in sent if queue_name in command]
    # The push twice (the library was missing: loaded in between), next, ack.
    assert own == ["FCALL"] * 4, [command[:160] for command in sent if queue_name in command]
    loads = [command for command in sent if command.upper().startswith("FUNCTION LOAD")]
    assert len(loads) == 1
    # A second Rotator on the same client asks nothing again.
    with monitored(client) as sent:
        assert Rotator(client, f"{queue_name}-2").push("b") == 1
    assert [command.split(" ", 1)[0].upper() for command in sent] == ["FCALL"]


def test_by_default_a_call_survives_function_flush_between_calls(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name)
    q.push("x", "y")
    client.function_flush()
    (x,) = q.next()
    client.function_flush()
    assert q.ack(x) == 1
    assert [job.id for job in q.next(block=1.0)] == ["y"]
    assert q.stats().length == 1


def test_functions_false_forces_evalsha_and_true_forces_fcall(
    server: ServerProcess, queue_name: str
) -> None:
    for functions, used, unused in ((False, "evalsha", "fcall"), (True, "fcall", "evalsha")):
        client = server.client()
        client.config_resetstat()
        assert Rotator(client, f"{queue_name}-{used}", functions=functions).push("a") == 1
        stats = client.info("commandstats")
        assert f"cmdstat_{used}" in stats
        assert f"cmdstat_{unused}" not in stats
        assert chosen_mode(client) is None  # a forced mode is not the default's choice


def test_a_read_only_replica_serves_reads_in_the_default_mode(tmp_path: Path) -> None:
    """A replica refuses FCALL of a library that may write before running it (the module's
    functions write), so the default runs that call as a script: reads work on a replica."""
    with (
        ServerProcess("redis", tmp_path / "primary", {}) as primary,
        ServerProcess(
            "redis", tmp_path / "replica", {"replicaof": f"127.0.0.1 {primary.port}"}
        ) as replica,
    ):
        Rotator(primary.client(), "seen").push("a", "b")
        reader = Rotator(replica.client(), "seen")
        give_up = time.monotonic() + 10
        while replica.client().llen(reader.keys.ring) < 3:
            assert time.monotonic() < give_up, "the replica never caught up"
            time.sleep(0.05)
        assert reader.stats().pending == 2
        assert reader.exists()
