"""Recurring schedules, the client's half: checking a schedule, the due times of a cron
expression, and reading the module's ``schedules`` reply.

The Lua module decides every tick atomically (one job per tick, however many clients run),
but it does not read cron: for a cron schedule it is given the next :data:`CRON_WINDOW`
due times, computed here with `cronsim <https://pypi.org/project/cronsim/>`_ (the ``cron``
extra), and the worker loops give it more before they run out (:data:`KEEP_EVERY`). An
interval schedule needs nothing of the client once it is set.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from datetime import UTC, datetime, tzinfo
from typing import Any, NamedTuple
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from rotator.defaults import MAX_SCHEDULE_SECONDS
from rotator.errors import InvalidArgument, InvalidJobId
from rotator.models import Schedule
from rotator.protocol import encode_id, text

# The due times a cron schedule is given at once (a window): at most CRON_WINDOW (the module
# takes 1000), within CRON_SPAN seconds (but at least the next one, if it comes within ten
# years). A worker loop gives it a fresh window once what it holds reaches less than half as
# far as a fresh one would.
CRON_WINDOW = 256
CRON_SPAN = 31 * 86_400.0
# How often a worker loop looks at the schedules' due times (one HGETALL of the meta hash).
KEEP_EVERY = 60.0
MAX_NAME_BYTES = 128
MAX_SPEC_BYTES = 256
# A tick's job id is "<job id>@<tick ms>": room for the ms within the 1024 bytes of an id.
MAX_JOB_ID_BYTES = 1024 - 16
_NAME = re.compile(rf"[A-Za-z0-9._:@/-]{{1,{MAX_NAME_BYTES}}}")
# How a cron schedule's time zone is kept in its spec: "<expression>;<zone>".
_ZONE_MARK = ";"


class Keeper:
    """When a worker loop next looks at the schedules' due times: at its first heartbeat,
    then every :data:`KEEP_EVERY` seconds."""

    def __init__(self, every: float = KEEP_EVERY) -> None:
        self.every = every
        self._last = -math.inf

    def due(self) -> bool:
        now = time.monotonic()
        if now - self._last < self.every:
            return False
        self._last = now
        return True


class ScheduleCall(NamedTuple):
    """The arguments of the module's ``schedule`` command after its mode."""

    name: str
    job_id: bytes
    every_ms: int
    spec: str
    dues: list[int]


def check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidArgument(
            f"schedule name must be 1..{MAX_NAME_BYTES} of A-Z a-z 0-9 . _ : @ / -, got {name!r}"
        )
    return name


def zone(tz: object) -> tzinfo:
    if tz is None:
        return UTC
    if not isinstance(tz, str) or _ZONE_MARK in tz:
        raise InvalidArgument(f"tz must be a time zone name such as 'Europe/Paris', got {tz!r}")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError) as error:
        raise InvalidArgument(f"unknown time zone {tz!r}") from error


def cron_dues(expression: str, tz: str | None, after: float, count: int = CRON_WINDOW) -> list[int]:
    """The times (unix ms) after ``after`` (unix seconds) that ``expression`` names in zone
    ``tz`` (UTC when None): at most ``count``, within CRON_SPAN but at least the first, and
    none beyond what the module takes (a day short of ten years ahead)."""
    try:
        from cronsim import CronSim, CronSimError  # noqa: PLC0415 (the cron extra)
    except ImportError as error:
        raise InvalidArgument(
            "cron schedules need the cron extra: pip install 'rotator-queue[cron]'"
        ) from error
    start = datetime.fromtimestamp(after, zone(tz))
    try:
        times = CronSim(expression, start)
        dues: list[int] = []
        for moment in times:
            at = moment.timestamp()
            if at > after + MAX_SCHEDULE_SECONDS - 86_400 or (dues and at > after + CRON_SPAN):
                break
            dues.append(math.floor(at * 1000))
            if len(dues) == count:
                break
    except (CronSimError, ValueError) as error:
        raise InvalidArgument(f"malformed cron expression {expression!r}: {error}") from error
    return dues


def check(
    name: object,
    *,
    every: object = None,
    cron: object = None,
    job_id: object = None,
    tz: object = None,
    now: float,
) -> ScheduleCall:
    """A schedule's ``schedule SET`` arguments, every one checked (cron due times from
    ``now``, unix seconds)."""
    name = check_name(name)
    raw_id = encode_id(name if job_id is None else job_id)
    if len(raw_id) > MAX_JOB_ID_BYTES:
        raise InvalidJobId(f"a schedule's job id must be at most {MAX_JOB_ID_BYTES} bytes")
    if (every is None) == (cron is None):
        raise InvalidArgument("give every (seconds) or cron (an expression), one of them")
    if every is not None:
        if tz is not None:
            raise InvalidArgument("tz applies to cron schedules only")
        if isinstance(every, bool) or not isinstance(every, int | float):
            raise InvalidArgument(f"every must be a number of seconds, got {every!r}")
        if not (math.isfinite(every) and 0.001 <= every <= MAX_SCHEDULE_SECONDS):
            raise InvalidArgument(f"every must be in 0.001..{MAX_SCHEDULE_SECONDS:g} s")
        every_ms = round(every * 1000)
        return ScheduleCall(name, raw_id, every_ms, f"every {every:g}s", [])
    if not isinstance(cron, str) or _ZONE_MARK in cron or not cron.strip():
        raise InvalidArgument(f"cron must be a cron expression such as '*/5 * * * *', got {cron!r}")
    zone(tz)
    spec = cron if tz is None else f"{cron}{_ZONE_MARK}{tz}"
    if len(spec.encode()) > MAX_SPEC_BYTES:
        raise InvalidArgument(f"a cron expression and its zone take at most {MAX_SPEC_BYTES} bytes")
    dues = cron_dues(cron, tz if isinstance(tz, str) else None, now)
    if not dues:
        raise InvalidArgument(f"cron expression {cron!r} names no time in the next ten years")
    return ScheduleCall(name, raw_id, 0, spec, dues)


def decode(reply: Sequence[Any]) -> list[Schedule]:
    """The module's ``schedules`` reply: eight fields per schedule."""
    found = []
    for i in range(0, len(reply), 8):
        name, job_id, every_ms, spec, next_ms, last_ms, left, until_ms = reply[i : i + 8]
        every, spec_text = int(every_ms), text(spec)
        cron, tz = None, None
        if every == 0:
            cron, _, zone_name = spec_text.partition(_ZONE_MARK)
            tz = zone_name or None
        found.append(
            Schedule(
                name=text(name),
                spec=cron if cron is not None else spec_text,
                next_due=int(next_ms) / 1000 if int(next_ms) >= 0 else None,
                last_run=int(last_ms) / 1000 if int(last_ms) > 0 else None,
                job_id=text(job_id),
                every=every / 1000 if every else None,
                cron=cron,
                tz=tz,
                dues_left=int(left) if every == 0 else None,
                dues_until=int(until_ms) / 1000 if int(until_ms) >= 0 else None,
            )
        )
    return found


def refill(schedule: Schedule, now: float) -> ScheduleCall | None:
    """The ``schedule FILL`` arguments that give a cron schedule a fresh window of due times,
    once what it holds reaches less than half as far as the window would; None otherwise."""
    if schedule.cron is None:
        return None
    spec = schedule.cron if schedule.tz is None else f"{schedule.cron}{_ZONE_MARK}{schedule.tz}"
    dues = cron_dues(schedule.cron, schedule.tz, now)
    until = schedule.dues_until
    if not dues:
        return None  # (none in ten years: nothing to give)
    if until is not None and until * 1000 - now * 1000 >= (dues[-1] - now * 1000) / 2:
        return None
    if schedule.next_due is None and schedule.last_run is not None:
        # Its due times ran out: a tick missed since the last one makes one catch-up job.
        [missed] = cron_dues(schedule.cron, schedule.tz, schedule.last_run, 1)
        if missed < dues[0]:
            dues = [missed, *dues[:-1]]
    return ScheduleCall(schedule.name, encode_id(schedule.job_id), 0, spec, dues)
