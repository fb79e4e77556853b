"""The queue patterns measured side by side: each a preload and a consumer loop.

A job is claimed once and acked once by a no-op consumer. Loops run in their own processes
(see harness.run_clients) and return their per-batch latencies in milliseconds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aredis

from rotator import Rotator
from rotator.aio import AsyncRotator
from rotator.models import Job

PRELOAD_CHUNK = 5000


def job_ids(n: int) -> list[str]:
    return [f"job-{i:012d}" for i in range(n)]  # 16 bytes, as in the targets


# -- rotator ----------------------------------------------------------------------------------


def preload_rotator(client: redis.Redis, name: str, n: int) -> None:
    Rotator(client, name).push_many(job_ids(n), chunk=PRELOAD_CHUNK)


def rotator_loop(url: str, name: str, batch: int, functions: Any) -> list[float]:
    """next(batch) carrying the previous batch's acks: one round trip per batch."""
    q = Rotator.from_url(url, name, timeout=300, functions=bool(functions))
    latencies: list[float] = []
    finished: list[Job] = []
    while True:
        began = time.perf_counter()
        jobs = q.next(batch, ack=finished)
        latencies.append((time.perf_counter() - began) * 1000)
        if not jobs:
            break
        finished = jobs
    q.sweep()  # whoever finds the queue empty pays for removing the acked elements
    return latencies


def rotator_fcall_loop(url: str, name: str, batch: int, _: Any) -> list[float]:
    """The same loop with the module called by FCALL (loaded as a function library)."""
    return rotator_loop(url, name, batch, True)


def rotator_async_loop(url: str, name: str, batch: int, _: Any) -> list[float]:
    async def main() -> list[float]:
        q = AsyncRotator(aredis.Redis.from_url(url), name, timeout=300)
        latencies: list[float] = []
        finished: list[Job] = []
        while True:
            began = time.perf_counter()
            jobs = await q.next(batch, ack=finished)
            latencies.append((time.perf_counter() - began) * 1000)
            if not jobs:
                break
            finished = jobs
        await q.client.aclose()
        return latencies

    latencies = asyncio.run(main())
    Rotator.from_url(url, name).sweep()
    return latencies


def rotator_work_loop(url: str, name: str, batch: int, _: Any) -> list[float]:
    """The worker loop end to end, with a no-op handler."""
    q = Rotator.from_url(url, name, timeout=300)
    q.work(lambda job: None, batch=batch, stop_when_empty=True, poll=0.05)
    return []


# -- the limit: the same moves and acks with no Lua -----------------------------------------


def preload_list(client: redis.Redis, name: str, n: int) -> None:
    ids = job_ids(n)
    for start in range(0, n, PRELOAD_CHUNK):
        client.lpush(name, *ids[start : start + PRELOAD_CHUNK])


def raw_limit_loop(url: str, name: str, batch: int, _: Any) -> list[float]:
    """Pipelined LMOVEs to claim and one SADD to ack: what any move-and-ack design costs."""
    client = redis.Redis.from_url(url)
    latencies: list[float] = []
    while True:
        began = time.perf_counter()
        pipe = client.pipeline(transaction=False)
        for _ in range(batch):
            pipe.lmove(name, f"{name}:inflight", "RIGHT", "LEFT")
        ids = [i for i in pipe.execute() if i is not None]
        if ids:
            client.sadd(f"{name}:done", *ids)
        latencies.append((time.perf_counter() - began) * 1000)
        if not ids:
            return latencies


# -- the pattern's floor: the circular rotate in its least script ---------------------------

FLOOR_SCRIPT = (Path(__file__).parent / "floor.lua").read_text(encoding="utf-8")


def preload_floor(client: redis.Redis, name: str, n: int) -> None:
    """The ring as the floor's steady state has it: from the tail, an acked lease (removed
    when it comes round), then a pending id, n times; so each one-job call does every move
    of the pattern once."""
    ids = job_ids(n)
    for start in range(0, n, PRELOAD_CHUNK):
        part = ids[start : start + PRELOAD_CHUNK]
        leases = [f"{job_id}*1" for job_id in part]
        client.lpush(name, *[e for pair in zip(leases, part, strict=True) for e in pair])
        client.sadd(f"{name}:done", *leases)


def floor_loop(url: str, name: str, batch: int, _: Any) -> list[float]:
    """The floor script (bench/floor.lua) by EVALSHA, acking the previous batch."""
    client = redis.Redis.from_url(url)
    script = client.register_script(FLOOR_SCRIPT)
    keys = [name, f"{name}:done"]
    latencies: list[float] = []
    finished: list[bytes] = []
    while True:
        began = time.perf_counter()
        tokens = script(keys=keys, args=[300_000, batch, *finished])
        latencies.append((time.perf_counter() - began) * 1000)
        if not tokens:
            return latencies
        finished = tokens


# -- Redis Streams consumer groups ------------------------------------------------------------


def preload_stream(client: redis.Redis, name: str, n: int) -> None:
    ids = job_ids(n)
    for start in range(0, n, PRELOAD_CHUNK):
        pipe = client.pipeline(transaction=False)
        for job_id in ids[start : start + PRELOAD_CHUNK]:
            pipe.xadd(name, {"id": job_id})
        pipe.execute()
    client.xgroup_create(name, "workers", id="0")


def streams_loop(url: str, name: str, batch: int, _: Any) -> list[float]:
    """XREADGROUP COUNT batch, then XACK of the batch: two round trips per batch."""
    client = redis.Redis.from_url(url)
    consumer = f"c{time.perf_counter_ns()}"
    latencies: list[float] = []
    while True:
        began = time.perf_counter()
        reply: Any = client.xreadgroup("workers", consumer, {name: ">"}, count=batch)
        entries = reply[0][1] if reply else []
        if entries:
            client.xack(name, "workers", *[entry[0] for entry in entries])
        latencies.append((time.perf_counter() - began) * 1000)
        if not entries:
            return latencies


# -- the per-worker processing list ------------------------------------------------------------


def processing_list_loop(url: str, name: str, batch: int, _: Any) -> list[float]:
    """LMOVE into a private processing list, then LREM from it to ack (BLMOVE when idle)."""
    client = redis.Redis.from_url(url)
    mine = f"{name}:processing:{time.perf_counter_ns()}"
    latencies: list[float] = []
    while True:
        began = time.perf_counter()
        pipe = client.pipeline(transaction=False)
        for _ in range(batch):
            pipe.lmove(name, mine, "RIGHT", "LEFT")
        ids = [i for i in pipe.execute() if i is not None]
        if ids:
            pipe = client.pipeline(transaction=False)
            for job_id in ids:
                pipe.lrem(mine, 1, job_id)
            pipe.execute()
        latencies.append((time.perf_counter() - began) * 1000)
        if not ids:
            return latencies


Preload = Callable[[redis.Redis, str, int], None]
PATTERNS: dict[str, tuple[Preload, Any]] = {
    "rotator": (preload_rotator, rotator_loop),
    "rotator-fcall": (preload_rotator, rotator_fcall_loop),
    "rotator-asyncio": (preload_rotator, rotator_async_loop),
    "rotator-work": (preload_rotator, rotator_work_loop),
    "raw-limit": (preload_list, raw_limit_loop),
    "floor": (preload_floor, floor_loop),
    "streams": (preload_stream, streams_loop),
    "processing-list": (preload_list, processing_list_loop),
}
