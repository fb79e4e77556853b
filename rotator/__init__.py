"""rotator: a reliable job queue for Redis and Valkey on one circular list."""

from __future__ import annotations

from rotator.core import Rotator
from rotator.durability import Durability, NotDurable
from rotator.errors import (
    GroupsChanged,
    InvalidArgument,
    InvalidJobId,
    InvalidQueueName,
    InvalidToken,
    LeaseLost,
    ProtocolError,
    RotatorError,
    ServerBusy,
    UnknownGroup,
    WrongKeyType,
)
from rotator.models import DeadLetter, ItemStats, Job, RingEntry, Stats
from rotator.topic import Retention, Topic, TopicGroup, TopicStats
from rotator.worker import WorkSummary

__all__ = [
    "DeadLetter",
    "Durability",
    "GroupsChanged",
    "InvalidArgument",
    "InvalidJobId",
    "InvalidQueueName",
    "InvalidToken",
    "ItemStats",
    "Job",
    "LeaseLost",
    "NotDurable",
    "ProtocolError",
    "Retention",
    "RingEntry",
    "Rotator",
    "RotatorError",
    "ServerBusy",
    "Stats",
    "Topic",
    "TopicGroup",
    "TopicStats",
    "UnknownGroup",
    "WorkSummary",
    "WrongKeyType",
]
__version__ = "0.1.0"
