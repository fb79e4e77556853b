"""Bounded retries of module calls: which errors say a call never ran, which calls are harmless
twice, and the sender that tries again within ``retry_for`` seconds.

A call whose connection broke may or may not have run: the request may have been lost on the
way, or its reply. It is sent again only when that is safe:

- the error says it never ran (the server or the cluster refused it, or no connection was
  made): any call;
- it may have run: only a call whose second run changes nothing a caller relies on (reads,
  acks, claims, a push made idempotent by a marker or by the id index; :data:`REPEATABLE`).

A plain push is made idempotent by sending it as ``push_chunk`` with a marker of its own
(:func:`rotator.keys.QueueKeys.push_marker`), which records each chunk in the push's own
atomic call: the chunk sent again after a lost reply pushes nothing twice.

Used by :class:`rotator.Rotator` and :class:`rotator.aio.AsyncRotator` with ``retry_for``,
by :class:`rotator.sharded.ShardedRotator` (cluster errors during a failover or a slot
migration) and by the Spark loaders.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from redis.backoff import NoBackoff
from redis.exceptions import (
    AskError,
    AuthenticationError,
    AuthorizationError,
    BusyLoadingError,
    ClusterDownError,
    ClusterError,
    ConnectionError,
    MaxConnectionsError,
    ReadOnlyError,
    SlotNotCoveredError,
    TimeoutError,
    TryAgainError,
)

from rotator.commands import ModuleCall, Request, Together
from rotator.errors import InvalidArgument
from rotator.models import Durability
from rotator.sending import Sender

# Seconds one module call may spend retrying, where retries are on by default (a sharded
# queue's; a failover takes a few).
DEFAULT_RETRY_FOR = 10.0
# The first pause between two tries of a call, doubled up to RETRY_PAUSE_CAP.
RETRY_PAUSE_FIRST = 0.05
RETRY_PAUSE_CAP = 1.0
# Socket timeouts of the clients made for bounded retries: one try waits at most this long.
SOCKET_TIMEOUT = 5.0
CONNECT_TIMEOUT = 1.0
# How push markers (push_chunk) outlive the retries of the push that wrote them, at least.
MARKER_TTL = 60.0

# Module commands whose repetition changes nothing a caller relies on: reads, acks and
# nacks of the same tokens (the second is refused or a no-op), extends, cancels, a claim
# (the leases of a claim whose reply was lost run out and are reclaimed: nothing is lost),
# settings set to the same values again, pushes that a marker or the id index makes
# idempotent (push_chunk, once, unique ...), a topic's publishes under a marker (tpublish_chunk),
# its reads and its retention.
REPEATABLE = frozenset(
    {
        b"next", b"next_packed", b"nextp", b"nextp_packed", b"ack", b"ackp", b"nack",
        b"nackp", b"bury", b"extend", b"cancel", b"stats", b"peek", b"scan", b"dead",
        b"schedules", b"items", b"durations", b"configure", b"sweep", b"pause", b"resume",
        b"rate_limit", b"schedule", b"unschedule", b"push_chunk", b"unique", b"delete",
        b"tpublish_chunk", b"tstats", b"tseek", b"ttrim", b"once",
    }
)  # fmt: skip
# Errors that say the command never ran: refused before it ran, or no connection was made.
NOTHING_RAN = (
    ClusterDownError,  # CLUSTERDOWN, MASTERDOWN
    TryAgainError,  # TRYAGAIN (a multi-key command during a slot migration)
    SlotNotCoveredError,  # the client's slot map has no node for the slot (yet)
    BusyLoadingError,  # LOADING: a restarted server reading its data
    ReadOnlyError,  # a demoted master: the write was refused before anything ran
    AskError,  # MOVED or ASK to a node's own client (a durable call): not run there
)


def may_repeat(request: Request) -> bool:
    """True when running ``request`` twice does no harm a caller would notice."""
    if type(request) is ModuleCall:
        return bytes(request.args[0]) in REPEATABLE
    return True  # AfterWake (a claim), ClientCall (reads, the wake list, HSETNX), Ask


def retryable(request: Request, error: Exception) -> bool:
    """True when ``request`` may be sent again after ``error``: the error says it never ran
    (refused, or no connection was made), or it may have run and running it twice does no
    harm. A connection lost after a plain push was sent is not retried (the push may be in):
    pushes go as push_chunk with a marker, or unique, so that they are."""
    if isinstance(error, AuthenticationError | AuthorizationError | MaxConnectionsError):
        return False
    if isinstance(error, NOTHING_RAN) or ttl_exhausted(error):
        return True
    if isinstance(error, ConnectionError) and " connecting to " in str(error):
        return True  # refused or timed out while connecting: nothing was sent
    return isinstance(error, ConnectionError | TimeoutError) and may_repeat(request)


def ttl_exhausted(error: Exception) -> bool:
    """redis-py's RedisCluster follows MOVED, ASK and TRYAGAIN replies itself, 16 times in
    about 0.4 s, then raises ClusterError("TTL exhausted."): every try was answered by a
    redirect or TRYAGAIN, so nothing ran. A slot migration gives TRYAGAIN for as long as
    a shard's keys are split between the two masters."""
    return type(error) is ClusterError and str(error) == "TTL exhausted."


def retry_pause(failures: int, left: float) -> float:
    return float(max(0.0, min(RETRY_PAUSE_FIRST * 2 ** (failures - 1), RETRY_PAUSE_CAP, left)))


class Tries:
    """The retry policy of one request: tries for at most ``retry_for`` seconds from the
    first, while :func:`retryable` says so, pausing 50 ms, 100 ms, ... 1 s between them.
    Shared by :class:`RetryingSender` and its asyncio twin, which only sleep differently."""

    def __init__(self, client: Any, request: Request, retry_for: float) -> None:
        self.client = client
        self.request = request
        self.give_up = time.monotonic() + retry_for
        self.failures = 0

    def pause_after(self, error: Exception) -> float | None:
        """Seconds to wait before the next try after ``error``; None: raise it."""
        left = self.give_up - time.monotonic()
        if left <= 0 or not retryable(self.request, error):
            return None
        self.failures += 1
        if isinstance(error, ConnectionError | TimeoutError):
            self._away_from()
        return retry_pause(self.failures, left)

    def _away_from(self) -> None:
        """redis-py asks the cluster client's default node about some commands before it
        sends them, and replaces a dead default node only when its own retries are on:
        pick another, so that a dead master cannot fail every call that asks it."""
        replace = getattr(self.client, "replace_default_node", None)
        if replace is not None:
            replace()


class RetryingSender(Sender):
    """A :class:`rotator.sending.Sender` that retries each request as :class:`Tries` says.
    One request thus returns or raises within ``retry_for`` plus one try's socket
    timeout."""

    def __init__(
        self,
        client: Any,
        functions: bool | None,
        retry_for: float,
        durability: Durability | None = None,
    ) -> None:
        super().__init__(client, functions, durability)
        self.retry_for = retry_for

    def perform(self, request: Request) -> Any:
        if type(request) is Together:  # each call it makes again is retried on its own
            return super().perform(request)
        tries = Tries(self.client, request, self.retry_for)
        while True:
            try:
                return super().perform(request)
            except Exception as error:
                pause = tries.pause_after(error)
                if pause is None:
                    raise
                time.sleep(pause)


def sender(
    client: Any, functions: bool | None, retry_for: float, durability: Durability | None = None
) -> Sender:
    """The sender of a queue or topic: retrying for ``retry_for`` seconds, or (0) plain."""
    if retry_for:
        return RetryingSender(client, functions, retry_for, durability)
    return Sender(client, functions, durability)


def check_retry_for(retry_for: object) -> float:
    if (
        isinstance(retry_for, bool)
        or not isinstance(retry_for, int | float)
        or not 0 <= retry_for <= 3600
    ):
        raise InvalidArgument(f"retry_for must be 0..3600 seconds, got {retry_for!r}")
    return float(retry_for)


def marker_ttl_ms(retry_for: float) -> int:
    """How long a push's marker is kept: longer than all the retries of the push."""
    return int(max(MARKER_TTL, 2 * retry_for) * 1000)


def push_marker_ttl_ms(retry_for: float) -> int | None:
    """A queue's ``push_marker_ttl_ms`` (:class:`rotator.flows.QueueFlows`): None, pushes
    unmarked, where its calls are not retried."""
    return marker_ttl_ms(retry_for) if retry_for else None


def bounded_options(options: dict[str, Any], retry: Callable[..., Any]) -> dict[str, Any]:
    """``options`` for a client whose calls ``retry_for`` retries, completed: redis-py's own
    retries off (its default is more tries per command, a push among them) and socket
    timeouts set, so that no try waits unbounded. ``retry`` is the client's Retry class
    (redis.retry's, or redis.asyncio.retry's)."""
    options = dict(options)
    options.setdefault("socket_connect_timeout", CONNECT_TIMEOUT)
    options.setdefault("socket_timeout", SOCKET_TIMEOUT)
    options.setdefault("retry", retry(NoBackoff(), 0))
    return options
