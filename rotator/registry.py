"""Who works on a queue: one heartbeat entry per running worker loop, in one hash per queue.

Lease tokens do not name their holder, so each :class:`rotator.worker.Worker` and
:class:`rotator.worker.AsyncWorker` says what it holds itself, in the hash
``<queue base>:workers`` (:attr:`rotator.keys.QueueKeys.workers`, in the queue's slot). The
field is the worker's id (``host:pid:random``), the value a compact JSON object. The Python
worker loops write it, not the Lua module: one HSET on the loop's own heartbeat, at most once
per REPORT_EVERY seconds (never per job), and an HDEL when the loop stops cleanly.

Times in an entry are unix seconds from the writing worker's clock, not the server's (a
server TIME would cost a round trip); the lease deadlines it shows are the worker's estimate.
So a reader on another machine compares its clock with the worker's: STALE_AFTER leaves room
for a few seconds of skew. A worker that crashed leaves its entry behind; readers call it
stale once it is STALE_AFTER old, and a read (``rotator workers``, ``Rotator.workers``)
deletes the entries PRUNE_AFTER old: the hash holds the live workers and the dead ones since
the last read, at most an hour's if anyone looks. Workers never read it (a worker's ACL rule
need not allow HGETALL).
"""

from __future__ import annotations

import json
import math
import os
import secrets
import socket
import time
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import asdict, dataclass
from typing import Any

from redis.exceptions import NoPermissionError

from rotator.commands import ClientCall, Flow
from rotator.protocol import text

# The least seconds between two reports of one worker. It reports on its heartbeat, which
# runs every lease/4 seconds, at most 5 s apart (Ledger.heartbeat_interval).
REPORT_EVERY = 1.0
# An entry not rewritten for this long is a worker gone: three of the longest heartbeat
# intervals (5 s), so a live worker is never called stale unless its clock is far off.
STALE_AFTER = 15.0
# Entries older than this are deleted when the registry is read (a worker that crashed).
PRUNE_AFTER = 3600.0
# Held jobs an entry names (it counts them all): keeps an entry small whatever the batch.
HELD_SHOWN = 10


@dataclass(frozen=True, slots=True)
class HeldJob:
    """A job a worker holds, and when its lease runs out (the worker's estimate)."""

    id: str
    deadline: float  # unix seconds


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """One worker loop's registry entry: who it is, what it holds, what it has done."""

    id: str  # host:pid:random, one per worker loop
    host: str
    pid: int
    queue: str
    started: float  # unix seconds, the worker's clock
    seen: float  # unix seconds of its last report, the worker's clock
    holding: int  # jobs it holds now (claimed, not yet acked or given back)
    completed: int
    retried: int
    dead: int
    held: tuple[HeldJob, ...] = ()  # the first HELD_SHOWN of the jobs it holds
    stale: bool = False  # when read: not seen for STALE_AFTER seconds (likely gone)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def new_worker_id(host: str, pid: int) -> str:
    """``host:pid:random``: unique per loop even when one process runs several."""
    return f"{host}:{pid}:{secrets.token_hex(4)}"


def is_stale(seen: float, now: float) -> bool:
    return now - seen > STALE_AFTER


def encode_entry(info: WorkerInfo) -> str:
    """The hash value: compact JSON without the id (the field) or ``stale`` (a reader's)."""
    return json.dumps(
        {
            "host": info.host,
            "pid": info.pid,
            "queue": info.queue,
            "started": round(info.started, 3),
            "seen": round(info.seen, 3),
            "holding": info.holding,
            "completed": info.completed,
            "retried": info.retried,
            "dead": info.dead,
            "held": [[job.id, round(job.deadline, 3)] for job in info.held],
        },
        separators=(",", ":"),
    )


def _float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return 0.0
    return float(value)


def _int(value: Any) -> int:
    return int(_float(value))


def decode_entry(worker_id: str, raw: Any, now: float) -> WorkerInfo:
    """An entry as a reader sees it. Anything unreadable (written by hand, cut short) reads
    as zeros, so it shows as a stale entry and is pruned like one."""
    try:
        data = json.loads(text(raw))
    except ValueError:
        data = {}
    if not isinstance(data, dict):
        data = {}
    held: list[HeldJob] = []
    listed = data.get("held")
    for item in listed if isinstance(listed, list) else ():
        if isinstance(item, list) and len(item) == 2 and isinstance(item[0], str):
            held.append(HeldJob(item[0], _float(item[1])))
    seen = _float(data.get("seen"))
    return WorkerInfo(
        id=worker_id,
        host=str(data.get("host", "")),
        pid=_int(data.get("pid")),
        queue=str(data.get("queue", "")),
        started=_float(data.get("started")),
        seen=seen,
        holding=_int(data.get("holding")),
        completed=_int(data.get("completed")),
        retried=_int(data.get("retried")),
        dead=_int(data.get("dead")),
        held=tuple(held[:HELD_SHOWN]),
        stale=is_stale(seen, now),
    )


# -- flows (run by Rotator and AsyncRotator, see rotator.flows) --------------------------------


def report(key: str, info: WorkerInfo) -> Flow[None]:
    yield ClientCall("hset", (key, info.id, encode_entry(info)))


def forget(key: str, worker_id: str) -> Flow[bool]:
    removed = yield ClientCall("hdel", (key, worker_id))
    return bool(removed)


def read(key: str, include_stale: bool) -> Flow[list[WorkerInfo]]:
    """Every entry (without the stale ones unless ``include_stale``), by host, pid and id;
    entries older than PRUNE_AFTER are deleted on the way. One HGETALL (the hash holds the
    live workers and at most an hour of dead ones), and one HDEL when some are that old."""
    raw = yield ClientCall("hgetall", (key,))
    now = time.time()
    entries: list[WorkerInfo] = []
    old: list[Any] = []
    for field, value in raw.items():
        info = decode_entry(text(field), value, now)
        if now - info.seen > PRUNE_AFTER:
            old.append(field)  # as read: a field that is not UTF-8 is deleted as it is
        elif include_stale or not info.stale:
            entries.append(info)
    if old:
        with suppress(NoPermissionError):  # a read-only user sees the live entries all the same
            yield ClientCall("hdel", (key, *old))
    return sorted(entries, key=lambda info: (info.host, info.pid, info.id))


class Presence:
    """One worker loop's entry, as its heartbeat keeps it: when a report is due, and what it
    says. Not thread-safe: only the heartbeat uses it."""

    def __init__(self, queue: str) -> None:
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.id = new_worker_id(self.host, self.pid)
        self.queue = queue
        self.started = time.time()
        self.enabled = True  # False once the server refused a report (an ACL without HSET)
        self.failing = False  # the last report failed (said once, until one succeeds)
        self._last = -math.inf

    def start(self) -> None:
        self.started = time.time()
        self._last = -math.inf

    def due(self) -> bool:
        return self.enabled and time.monotonic() - self._last >= REPORT_EVERY

    def entry(
        self, held: Sequence[tuple[str, float]], holding: int, done: tuple[int, int, int]
    ) -> WorkerInfo:
        """This worker's entry now; ``held`` is ``(id, monotonic lease expiry)`` of the first
        held jobs, ``done`` its completed, retried and dead counts."""
        self._last = mono = time.monotonic()
        now = time.time()
        completed, retried, dead = done
        return WorkerInfo(
            id=self.id,
            host=self.host,
            pid=self.pid,
            queue=self.queue,
            started=self.started,
            seen=now,
            holding=holding,
            completed=completed,
            retried=retried,
            dead=dead,
            held=tuple(HeldJob(job_id, now + expiry - mono) for job_id, expiry in held),
        )
