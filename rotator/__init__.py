"""rotator: a reliable job queue for Redis and Valkey on one circular list."""

from __future__ import annotations

from rotator.core import Rotator
from rotator.errors import (
    EmbeddedServerError,
    FunctionsUnavailable,
    GroupsChanged,
    InvalidArgument,
    InvalidJobId,
    InvalidQueueName,
    InvalidToken,
    JobCancelled,
    LeaseLost,
    NotDurable,
    NotTracked,
    ProtocolError,
    RotatorError,
    ServerBusy,
    ShardsMismatch,
    UnknownGroup,
    WrongKeyType,
)
from rotator.models import (
    DeadLetter,
    Discovered,
    Durability,
    Durations,
    ItemStats,
    Job,
    RateLimit,
    Retention,
    RingEntry,
    Schedule,
    Stats,
    TopicStats,
    WorkSummary,
)
from rotator.sharded import ShardedRotator
from rotator.topic import Topic, TopicGroup

__all__ = [
    "DeadLetter",
    "Discovered",
    "Durability",
    "Durations",
    "EmbeddedServerError",
    "FunctionsUnavailable",
    "GroupsChanged",
    "InvalidArgument",
    "InvalidJobId",
    "InvalidQueueName",
    "InvalidToken",
    "ItemStats",
    "Job",
    "JobCancelled",
    "LeaseLost",
    "NotDurable",
    "NotTracked",
    "ProtocolError",
    "RateLimit",
    "Retention",
    "RingEntry",
    "Rotator",
    "RotatorError",
    "Schedule",
    "ServerBusy",
    "ShardedRotator",
    "ShardsMismatch",
    "Stats",
    "Topic",
    "TopicGroup",
    "TopicStats",
    "UnknownGroup",
    "WorkSummary",
    "WrongKeyType",
]
__version__ = "0.1.0"
