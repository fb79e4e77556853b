"""Small test helpers shared by the integration tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import redis

from rotator import Rotator
from rotator.protocol import text


def snapshot(client: redis.Redis, rotator: Rotator) -> dict[str, Any]:
    """Every key of a queue, by value, so a test can assert that nothing changed."""
    state: dict[str, Any] = {}
    for key in rotator.keys.all:
        kind = text(client.type(key))
        if kind == "list":
            state[key] = client.lrange(key, 0, -1)
        elif kind == "set":
            state[key] = sorted(client.smembers(key))
        elif kind == "hash":
            state[key] = client.hgetall(key)
        elif kind == "zset":
            state[key] = client.zrange(key, 0, -1, withscores=True)
        elif kind == "string":
            state[key] = client.get(key)
        else:
            state[key] = kind
    return state


def drain(rotator: Rotator, count: int = 100) -> list[str]:
    """Leases and acks everything available now; returns the job ids, in order."""
    seen: list[str] = []
    while jobs := rotator.next(count):
        seen.extend(job.id for job in jobs)
        rotator.ack(*jobs)
    return seen


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    give_up = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < give_up, "condition not reached in time"
        time.sleep(0.01)
