"""One poll loop shared by every open page.

The loop runs while at least one page listens (server-sent events) and stops when the last one
goes. Each tick (every ``interval`` seconds, 1 by default) it reads every queue's and topic's
counts once, plus the detail of each queue that a page shows, whatever the number of pages:
ten open pages cost the server what one does. Discovery (the SCAN for queue and topic names)
runs every ``discover_every`` seconds (10), not every tick. Each page gets the latest reading
as soon as it is made; a slow page skips readings rather than queueing them.

A page listens to one key: :data:`OVERVIEW`, ``queue_key(name)`` or ``topic_key(name)`` (a
topic's page needs no read of its own: its counts come with the overview's).

The hub also keeps the last ``history`` points (5 minutes at 1 s) of the totals and of each
queue's backlog and rates, so a page opened later draws its chart at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections import Counter, deque
from collections.abc import AsyncGenerator, Callable
from typing import Any

from rotator.dashboard.snapshot import (
    COUNTERS,
    UNREACHABLE,
    Overview,
    QueueDetail,
    Reader,
    Reading,
    add_rates,
    backlog,
    detail_json,
    gather_errors,
    queue_row_json,
    rates,
    topic_json,
)
from rotator.discovery import Found
from rotator.errors import RotatorError
from rotator.models import Stats

# Seconds between two readings while a page listens.
POLL_INTERVAL = 1.0
# Seconds between two discoveries (SCANs of the keyspace for queue and topic names).
DISCOVER_EVERY = 10.0
# Chart points kept: 5 minutes at one reading a second.
HISTORY_POINTS = 300
# With more queues than this, only the queues a page shows keep a chart history.
HISTORY_QUEUES = 200

OVERVIEW = "overview"
# Seconds the app's shutdown waits for the poll loop to stop.
CLOSE_WAIT = 5.0

log = logging.getLogger(__name__)
Point = dict[str, Any]
# Renders a snapshot's live parts (HTML by element id), once for every page that shows it.
Render = Callable[[dict[str, Any]], dict[str, str]]


def queue_key(name: str) -> str:
    return f"queue:{name}"


def topic_key(name: str) -> str:
    return f"topic:{name}"


def point(at: float, stats: Stats, queue_rates: dict[str, float | None]) -> Point:
    """One chart point: the backlog, the jobs in flight, the dead letters and the rates."""
    return {
        "at": at,
        "backlog": backlog(stats),
        "in_flight": stats.in_flight,
        "dead": stats.dead,
        **{name: queue_rates.get(name) for name in COUNTERS},
    }


class Hub:
    """The shared poll loop; :meth:`listen` is what a page's event stream iterates."""

    def __init__(
        self,
        reader: Reader,
        *,
        interval: float = POLL_INTERVAL,
        discover_every: float = DISCOVER_EVERY,
        history: int = HISTORY_POINTS,
        render: Render | None = None,
    ) -> None:
        self.reader = reader
        self.interval = interval
        self.discover_every = discover_every
        self.history_points = history
        self.render = render
        self.polls = 0  # readings made (a test can tell one shared loop from one per page)
        self._watched: Counter[str] = Counter()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._changed: asyncio.Event | None = None
        self._wake: asyncio.Event | None = None
        self._version = 0
        self._found: Found | None = None
        self._found_at = -math.inf
        self._discovered_at: float | None = None
        self._readings: dict[str, Reading] = {}
        self._rates: dict[str, dict[str, float | None]] = {}
        self._history: deque[Point] = deque(maxlen=history)
        self._queue_history: dict[str, deque[Point]] = {}
        self._snapshots: dict[str, dict[str, Any]] = {}
        self._encoded: dict[str, str] = {}

    @property
    def listeners(self) -> int:
        return sum(self._watched.values())

    # -- what pages see --------------------------------------------------------------------

    async def listen(self, key: str = OVERVIEW) -> AsyncGenerator[str, None]:
        """JSON snapshots for one page, until the caller stops iterating (or closes this
        generator): the latest at once, with its chart's history, then each new one."""
        self._watched[key] += 1
        self._start()
        try:
            first = True
            seen = -1
            while True:
                assert self._changed is not None
                changed = self._changed
                if seen != self._version and key in self._encoded:
                    seen = self._version
                    yield self._with_history(key) if first else self._encoded[key]
                    first = False
                    continue
                await changed.wait()
        finally:
            self._watched[key] -= 1
            if self._watched[key] <= 0:
                del self._watched[key]
                if key != OVERVIEW:
                    self._snapshots.pop(key, None)
                    self._encoded.pop(key, None)
            if not self._watched:
                self._stop()

    def _with_history(self, key: str) -> str:
        if key == OVERVIEW:
            history: Any = self._history
        elif key.startswith("queue:"):
            history = self._queue_history.get(key.removeprefix("queue:"), ())
        else:
            history = ()
        return json.dumps({**self._snapshots[key], "history": list(history)})

    # -- the loop --------------------------------------------------------------------------

    def _start(self) -> None:
        if self._changed is None:
            self._changed = asyncio.Event()
            self._wake = asyncio.Event()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="rotator-dashboard-poll")
        elif self._wake is not None:
            self._wake.set()  # a new page: read now rather than at the next tick

    def _stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def close(self) -> None:
        """Stops the loop (the app's shutdown), waiting for it CLOSE_WAIT seconds at most: a
        cancellation can be lost inside a read that times out at the same moment (the read
        then raises TimeoutError instead), so the loop also stops at ``_closing``."""
        self._closing = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task}, timeout=CLOSE_WAIT)

    async def _run(self) -> None:
        assert self._wake is not None
        while not self._closing:
            self._wake.clear()
            started = time.monotonic()
            try:
                await self.poll()
            except UNREACHABLE as error:
                self._failed(error)
            except Exception as error:  # a bug must not leave every page waiting in silence
                log.exception("the dashboard's poll failed")
                self._failed(error)
            pause = self.interval - (time.monotonic() - started)
            if pause > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), pause)

    async def poll(self) -> None:
        """One reading of the overview and of each queue a page shows, then publish."""
        now = time.monotonic()
        if self._found is None or now - self._found_at >= self.discover_every:
            self._found = await self.reader.discover()
            self._found_at = now
            self._discovered_at = time.time()
        overview = await self.reader.overview(self._found)
        queues = sorted(k.removeprefix("queue:") for k in self._watched if k.startswith("queue:"))
        details = await gather_errors(self.reader.detail, queues)
        self.polls += 1
        self._take_overview(overview)
        for name, detail in zip(queues, details, strict=True):
            self._take_detail(name, detail)
        for key in self._watched:
            if key.startswith("topic:"):
                self._take_topic(key.removeprefix("topic:"), overview)
        self._publish()

    def _take_overview(self, overview: Overview) -> None:
        keep_all = len(overview.queues) <= HISTORY_QUEUES
        rows = []
        totals: dict[str, float | None] = dict.fromkeys((*COUNTERS, "backlog"))
        counts = {"backlog": 0, "in_flight": 0, "dead": 0, "pending": 0}
        for name, stats in overview.queues.items():
            shards = overview.shards.get(name)
            if isinstance(stats, RotatorError):
                rows.append(queue_row_json(name, stats, {}, shards))
                continue
            queue_rates = self._rate(name, Reading(overview.at, stats))
            add_rates(totals, queue_rates)
            counts["backlog"] += backlog(stats)
            counts["in_flight"] += stats.in_flight
            counts["dead"] += stats.dead
            counts["pending"] += stats.pending
            rows.append(queue_row_json(name, stats, queue_rates, shards))
            if keep_all or queue_key(name) in self._watched:
                self._queue_points(name).append(point(overview.at, stats, queue_rates))
        watched = {k.removeprefix("queue:") for k in self._watched if k.startswith("queue:")}
        for gone in set(self._readings) - set(overview.queues) - watched:
            del self._readings[gone]
            self._rates.pop(gone, None)
            self._queue_history.pop(gone, None)
        self._history.append(
            {"at": overview.at, **counts, **{name: totals[name] for name in COUNTERS}}
        )
        self._snapshots[OVERVIEW] = {
            "kind": "overview",
            "at": overview.at,
            "error": None,
            "discovered_at": self._discovered_at,
            "queues": rows,
            "topics": [topic_json(name, stats) for name, stats in overview.topics.items()],
            "totals": {**counts, "rates": totals},
            "point": self._history[-1],
        }

    def _rate(self, name: str, reading: Reading) -> dict[str, float | None]:
        """The queue's rates since its last reading. A reading sooner than half an interval
        after it (a page that just opened asks for one at once) keeps the last rates: a
        count over a few milliseconds says more about when workers ack than about rates."""
        before = self._readings.get(name)
        if before is not None and reading.at - before.at < self.interval / 2:
            return self._rates.get(name) or rates(None, reading)
        self._readings[name] = reading
        self._rates[name] = found = rates(before, reading)
        return found

    def _queue_points(self, name: str) -> deque[Point]:
        found = self._queue_history.get(name)
        if found is None:
            found = self._queue_history[name] = deque(maxlen=self.history_points)
        return found

    def _take_detail(self, name: str, detail: QueueDetail | RotatorError) -> None:
        key = queue_key(name)
        if isinstance(detail, RotatorError):
            self._snapshots[key] = {"kind": "queue", "name": name, "error": str(detail)}
            return
        if self._found is None or name not in self._found.names:
            # Not in the overview (made since the last discovery, or gone): rate it here.
            found = self._rate(name, Reading(detail.at, detail.stats))
            self._queue_points(name).append(point(detail.at, detail.stats, found))
        queue_rates = self._rates.get(name) or rates(None, Reading(detail.at, detail.stats))
        points = self._queue_history.get(name)
        self._snapshots[key] = {
            "kind": "queue",
            "error": None,
            **detail_json(detail, queue_rates),
            "point": points[-1] if points else None,
        }

    def _take_topic(self, name: str, overview: Overview) -> None:
        stats = overview.topics.get(name)
        if stats is None:  # not discovered yet (or gone): keep what the page shows
            return
        self._snapshots[topic_key(name)] = {
            "kind": "topic",
            "at": overview.at,
            **topic_json(name, stats),
        }

    def _failed(self, error: BaseException) -> None:
        message = f"cannot read the server: {error}"
        now = time.time()
        for key in [OVERVIEW, *self._watched]:
            known = self._snapshots.get(key) or {"kind": key.partition(":")[0]}
            self._snapshots[key] = {**known, "at": now, "error": message, "point": None}
        self._publish()

    def _publish(self) -> None:
        for key in self._watched:
            snapshot = self._snapshots.get(key)
            if snapshot is not None:
                if self.render is not None:
                    snapshot["html"] = self.render(snapshot)
                self._encoded[key] = json.dumps(snapshot)
        self._version += 1
        if self._changed is not None:
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()
