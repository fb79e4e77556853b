"""Rolling upgrades: a queue or topic a newer rotator converted to another storage format
refuses every call of this client's module with UnknownFormat, nothing written, and a worker
loop stops on it instead of retrying (the module's FORMAT: its check is the first read of
every call). Both clients' module calls are checked by the conformance scenarios
(tests/conformance/bad_input.json) and the Lua scenarios; here, the Python API."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis
import redis.asyncio as aredis

from rotator import Job, Rotator, Topic, UnknownFormat
from rotator.aio import AsyncRotator
from rotator.protocol import text
from rotator.script import module_source
from rotator.worker import transient
from tests.helpers import snapshot, wait_until
from tests.lua.scenarios import NEWER_FORMAT
from tests.servers import ServerProcess
from tests.test_aio import run_on

ROOT = Path(__file__).resolve().parent.parent


def convert(client: redis.Redis, key: str) -> None:
    """What a newer module's first write would leave: its format in the hash at `key`."""
    client.hset(key, "format", NEWER_FORMAT)


def test_every_call_on_a_queue_a_newer_rotator_converted_raises_and_writes_nothing(
    client: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(client, queue_name, payloads=True)
    queue.push("a", "b")
    held = queue.next(1)
    convert(client, queue.keys.meta)
    before = snapshot(client, queue)
    calls = [
        lambda: queue.push("c"),
        lambda: queue.push_payloads({"p": b"body"}),
        lambda: queue.next(1),
        lambda: queue.ack(*held),
        lambda: queue.nack(*held),
        lambda: queue.extend(held[0]),
        queue.stats,
        queue.peek,
        queue.pause,
    ]
    for call in calls:
        with pytest.raises(UnknownFormat, match='storage format "2"'):
            call()
    assert snapshot(client, queue) == before
    assert not transient(UnknownFormat("x"))  # (a worker loop does not wait it out)


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_worker_loop_stops_on_it_instead_of_retrying(
    client: redis.Redis, queue_name: str, concurrency: int
) -> None:
    """With several loops (threads) too: the error that ends one ends them all, and work
    raises it."""
    queue = Rotator(client, queue_name)
    queue.push("a")
    convert(client, queue.keys.meta)
    ran: list[str] = []
    with pytest.raises(UnknownFormat):
        queue.work(
            lambda job: ran.append(job.id),
            concurrency=concurrency,
            poll=0.05,
            install_signal_handlers=False,
        )
    assert ran == []
    client.hdel(queue.keys.meta, "format")  # (as before the conversion: the job is there)
    assert [job.id for job in queue.next(1)] == ["a"]


def test_the_async_client_raises_it_too(server: ServerProcess, queue_name: str) -> None:
    async def handle(job: Job) -> None:
        raise AssertionError(f"{job.id} was delivered")

    async def scenario(client: aredis.Redis) -> None:
        queue = AsyncRotator(client, queue_name)
        await queue.push("a")
        await client.hset(queue.keys.meta, "format", NEWER_FORMAT)
        with pytest.raises(UnknownFormat):
            await queue.next(1)
        with pytest.raises(UnknownFormat):
            await queue.push("b")
        with pytest.raises(UnknownFormat):  # (its worker loops stop on it)
            await queue.work(handle, concurrency=4, poll=0.05, install_signal_handlers=False)

    run_on(server, scenario)


def test_a_topic_a_newer_rotator_converted_refuses_publish_and_changes_nothing(
    client: redis.Redis, queue_name: str
) -> None:
    topic = Topic(client, queue_name)
    topic.subscribe("g")
    group = topic.group("g")
    topic.publish(b"one")
    convert(client, topic.keys.all[0])
    before = {key: client.dump(key) for key in topic.keys.all}
    with pytest.raises(UnknownFormat):
        topic.publish(b"two")
    assert {key: client.dump(key) for key in before} == before
    assert [job.payload for job in group.next(10)] == [b"one"]  # (the group's own meta)


# -- a rolling upgrade, end to end ----------------------------------------------------------

# A newer worker process runs this: its rotator is a copy of this one whose module is a
# "format 2" module (newer_module): every call it makes converts the queue first.
NEWER_WORKER = """
import sys
import redis
from rotator import Rotator

url, name = sys.argv[1:3]
client = redis.Redis.from_url(url)
queue = Rotator(client, name, timeout=1)
queue.work(lambda job: client.hincrby(name + ":handled", job.id, 1), poll=0.1)
"""


def newer_module(source: str) -> str:
    """This module as a later one with storage format 2 would behave at the check: it knows
    format 1 and converts such a queue (here by writing its format, which is all the check
    sees) at every call that finds it there."""
    check = "    if format and format ~= LIMIT.format then\n"
    assert source.count(check) == 1
    assert source.count("format = '1',") == 1
    convert = (
        "    if not format or format == '1' then rcall('HSET', meta, 'format', '2') end\n"
        "    if format and format ~= LIMIT.format and format ~= '1' then\n"
    )
    return source.replace(check, convert).replace("format = '1',", "format = '2',")


def test_a_rolling_upgrade_stops_the_older_worker_and_the_newer_one_finishes_every_job(
    redis_server: ServerProcess, queue_name: str, tmp_path: Path
) -> None:
    """An older worker and producer run; a newer rotator's worker process starts on the same
    queue and converts it. The older worker's loop stops with UnknownFormat (its leases run
    out), the older producer's push is refused whole, and the newer worker handles every job
    pushed before: none lost."""
    package = tmp_path / "rotator"
    shutil.copytree(ROOT / "rotator", package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "lua").mkdir()
    (package / "lua" / "rotator.lua").write_text(newer_module(module_source()), "utf-8")
    client = redis_server.client()
    older = Rotator(client, queue_name, timeout=1)
    jobs = [f"job-{i}" for i in range(300)]
    older.push_many(jobs)
    handled = f"{queue_name}:handled"
    stopped: list[BaseException] = []

    def older_worker() -> None:
        def handle(job: Job) -> None:
            client.hincrby(handled, job.id, 1)
            time.sleep(0.005)

        try:
            older.work(handle, concurrency=4, poll=0.1, install_signal_handlers=False)
        except BaseException as error:  # (what stopped it is the assertion)
            stopped.append(error)

    thread = threading.Thread(target=older_worker)
    thread.start()
    wait_until(lambda: client.hlen(handled) >= 20, timeout=10)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    newer = subprocess.Popen(  # (cwd: a `-c` script imports from it first)
        [sys.executable, "-c", NEWER_WORKER, redis_server.url, queue_name], env=env, cwd=tmp_path
    )
    try:
        thread.join(timeout=20)
        assert not thread.is_alive(), "the older worker went on after the conversion"
        assert [type(error) for error in stopped] == [UnknownFormat]
        with pytest.raises(UnknownFormat):
            older.push("late")

        def all_done() -> bool:  # (handled, and nothing pending or in flight: all acked)
            in_flight = client.llen(older.keys.leases)
            pending = client.lrange(older.keys.ring, 0, -1) != [b"*lap"]  # ("late" refused)
            return client.hlen(handled) == len(jobs) and not in_flight and not pending

        wait_until(all_done, timeout=30)  # (the older worker's leases run out in 1 s)
    finally:
        newer.terminate()
        assert newer.wait(timeout=20) == 0
    assert client.hget(older.keys.meta, "format") == b"2"
    assert sorted(text(job_id) for job_id in client.hkeys(handled)) == sorted(jobs)
