"""The values rotator hands back: immutable records, nothing clever."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, NamedTuple


class Job(NamedTuple):
    """One delivery of a job.

    ``token`` (``<id>*<deadline>.<deliveries>.<seq>``) names this delivery only: ack, nack
    and extend take it, so a consumer whose lease was re-issued cannot complete the new one.
    A NamedTuple rather than a dataclass: a batch of 1000 is built per call, and a tuple is
    built several times faster than a frozen dataclass.
    """

    id: str
    token: str
    deliveries: int
    reclaimed: bool
    deadline_ms: int
    payload: bytes | None = None  # with payloads on: the job's payload (None when it has none)

    def __str__(self) -> str:
        return self.token


@dataclass(frozen=True, slots=True)
class Stats:
    """A queue's counts. ``done`` counts acked jobs whose element is not yet removed."""

    length: int
    pending: int
    in_flight: int
    done: int
    deferred: int
    dead: int
    oldest_pending_age: float | None  # seconds, None when nothing is pending

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class ItemStats:
    """One job's stats (``stats=True``), kept from its push until it is acked."""

    enqueued_ms: int | None  # None when it was pushed without stats
    deliveries: int
    last_delivery_ms: int | None
    last_error: str | None


@dataclass(frozen=True, slots=True)
class RingEntry:
    """An element of the ring as ``peek`` sees it."""

    element: str
    state: str  # lap, pending, leased, done, deferred or corrupt
    time_ms: int  # lease deadline or nack due time; 0 when there is none


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A job that left the ring without being acked, and why."""

    id: str  # the job id, or the raw element for a corrupt one
    reason: str  # max_deliveries or corrupt
    deliveries: int
    died_ms: int
    element: str


@dataclass(frozen=True, slots=True)
class NextReply:
    """What one `next` script call answered."""

    idle: bool
    wait_ms: int
    acked: int
    jobs: list[Job]
    # The call's batch of first deliveries as the reply named it ("<deadline>.1.<seq>") and
    # its size; "" when the reply did not say (its jobs then tell, see Batches.note).
    batch: bytes = b""
    batch_jobs: int = 0
