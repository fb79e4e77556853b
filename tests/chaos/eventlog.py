"""The event log every chaos process writes, and what reads it back.

One file per process, opened with O_APPEND and written with one ``os.write`` per line: nothing
is buffered in Python, so a SIGKILL loses at most the line being written (a torn last line,
which readers skip). A line is ``<unix time> <EVENT> <field> ...``; fields never hold spaces.

Worker events: ``BOOT mode``, ``FETCH id token reclaimed deliveries``, ``START id token``,
``DONE id token`` (the job's side effect, written before the ack), ``ACK_OK id token
accepted`` (accepted 0 = the lease was fenced), ``ACK_SENT id token`` (acked in the same call
as the next claim, count unknown), ``CLAIM id token reclaimed deliveries`` (``work`` mode:
each job the library's loop claimed, run or not), ``ACK_ERR id token kind``, ``IDEM id
verdict``, ``LAP``, ``RETRY kind`` (redis-py retried a command internally), ``ERR op kind``,
``CRASH point``, ``WORK_DIED kind``, ``EXIT reason``.
Producer events: ``PUSH_INVOKE batch id,id,... [due]`` (due: for a scheduled push, the
earliest unix ms it can be due), ``PUSH_OK batch``, ``PUSH_FAIL batch kind``,
``PUSH_RETRY batch kind``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import (
    BusyLoadingError,
    NoScriptError,
    OutOfMemoryError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from rotator import RotatorError, ServerBusy

T = TypeVar("T")

# The retry policy redis-py 8 gives every client by default (10 retries, jittered exponential
# backoff from 10 ms, capped at 1 s), spelled out so the chaos clients can log each retry.
RETRIES = 10
RETRY_BASE = 0.01
RETRY_CAP = 1.0


class EventLog:
    """Appends event lines to one file; safe across threads and a SIGKILL."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, event: str, *fields: object) -> None:
        line = " ".join([f"{time.time():.6f}", event, *(str(f) for f in fields)])
        os.write(self._fd, (line + "\n").encode("utf-8", "surrogateescape"))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def chaos_body(job_id: str) -> bytes:
    """The payload a payload run pushes with ``job_id``: each job's own, so a worker can tell
    a payload lost (None) or another job's from the right one."""
    return b"body:" + job_id.encode("utf-8", "surrogateescape")


@dataclass(frozen=True, slots=True)
class Event:
    at: float
    source: str  # the log file's stem: one process (or the test itself)
    kind: str
    fields: tuple[str, ...]


@dataclass(slots=True)
class LogRead:
    events: list[Event]
    torn: int  # last lines cut short by a SIGKILL, skipped


def read_logs(directory: Path) -> LogRead:
    """Every complete event line of every ``*.log`` in ``directory``, file by file in order."""
    events: list[Event] = []
    torn = 0
    for path in sorted(directory.glob("*.log")):
        data = path.read_bytes()
        lines = data.split(b"\n")
        if lines[-1]:
            torn += 1  # no newline: the process died while writing this line
        for raw in lines[:-1]:
            parts = raw.decode("utf-8", "surrogateescape").split(" ")
            if len(parts) < 2:
                torn += 1
                continue
            try:
                at = float(parts[0])
            except ValueError:
                torn += 1
                continue
            events.append(Event(at, path.stem, parts[1], tuple(parts[2:])))
    return LogRead(events, torn)


def tail_event(path: Path) -> str | None:
    """The kind of the last complete event in one log (None when there is none)."""
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - 512))
            chunk = handle.read()
    except FileNotFoundError:
        return None
    lines = chunk.split(b"\n")[:-1]  # the part after the last newline is torn or empty
    if not lines:
        return None
    parts = lines[-1].split(b" ")
    return parts[1].decode() if len(parts) > 1 else None


class DoneIndex:
    """The ids with a DONE line in any log of a directory, read incrementally.

    This is the chaos workers' idempotency store: a job's side effect *is* its DONE line,
    written before the ack, so "was this job already done?" is answered from the very place
    the side effect went to, and it survives the SIGKILL of the process that did it.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._done: set[str] = set()
        self._offsets: dict[Path, int] = {}

    def __contains__(self, job_id: object) -> bool:
        self.refresh()
        return job_id in self._done

    def refresh(self) -> None:
        for path in self.directory.glob("*.log"):
            offset = self._offsets.get(path, 0)
            with path.open("rb") as handle:
                handle.seek(offset)
                data = handle.read()
            end = data.rfind(b"\n")
            if end < 0:
                continue
            for raw in data[:end].split(b"\n"):
                parts = raw.split(b" ")
                if len(parts) >= 3 and parts[1] == b"DONE":
                    self._done.add(parts[2].decode("utf-8", "surrogateescape"))
            self._offsets[path] = offset + end + 1


def error_kind(error: BaseException) -> str:
    """A short, space-free name for an error, for event lines and reports."""
    if isinstance(error, BusyLoadingError):
        return "loading"
    if isinstance(error, RedisTimeoutError):
        return "timeout"
    if isinstance(error, RedisConnectionError):
        return "conn"
    if isinstance(error, NoScriptError):
        return "noscript"
    if isinstance(error, OutOfMemoryError):
        return "oom"
    if isinstance(error, ServerBusy):
        return "busy"
    if isinstance(error, ResponseError):
        message = str(error)
        if message.lower().startswith("function not found"):
            return "nofunction"  # FCALL's NOSCRIPT: the library is not loaded
        # A module that re-raises the refusal as ERR says "ERR OOM command not allowed ...".
        return "oom" if message.startswith("OOM") else "resp:" + message.split(" ", 1)[0]
    if isinstance(error, RotatorError):
        return type(error).__name__
    return "other:" + type(error).__name__


class LoggingRetry(Retry):
    """redis-py's default retry policy, plus a callback on every failed attempt.

    redis-py replays a command after a connection error or timeout, so a command whose reply
    was lost can run twice; the callback makes each such replay visible in the event log.
    """

    def __init__(
        self, on_failure: Callable[[Exception], None] | None = None, retries: int = RETRIES
    ) -> None:
        super().__init__(ExponentialWithJitterBackoff(base=RETRY_BASE, cap=RETRY_CAP), retries)
        self.on_failure = on_failure

    def __deepcopy__(self, memo: dict[int, Any]) -> LoggingRetry:
        return self  # redis-py deep-copies its retry; the callback must stay this one

    def call_with_retry(
        self,
        do: Callable[[], T],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        def noted(error: Exception, *count: int) -> Any:
            if self.on_failure is not None:
                self.on_failure(error)
            return fail(error, *count)

        return super().call_with_retry(do, noted, is_retryable, with_failure_count)


def chaos_client(
    url: str,
    *,
    socket_timeout: float,
    on_failure: Callable[[Exception], None] | None = None,
    retries: int = RETRIES,
) -> redis.Redis:
    """A client as a user would have it (redis-py's retries on), with its retries logged;
    ``retries=0``: redis-py's retries off."""
    client: redis.Redis = redis.Redis.from_url(
        url,
        socket_timeout=socket_timeout,
        socket_connect_timeout=min(socket_timeout, 1.0),
        retry=LoggingRetry(on_failure, retries),
    )
    return client


def stop_with_parent(stop: threading.Event, grace: float = 5.0) -> None:
    """Sets ``stop`` when the process that started us dies (a test killed by a timeout, say),
    and exits outright ``grace`` seconds later, so no chaos process outlives its test."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        stop.set()
        time.sleep(grace)
        os._exit(3)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()
