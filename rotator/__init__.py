"""rotator: a reliable job queue for Redis and Valkey on one circular list."""

from __future__ import annotations

from rotator.core import Rotator
from rotator.durability import Durability, NotDurable
from rotator.errors import (
    InvalidArgument,
    InvalidJobId,
    InvalidQueueName,
    InvalidToken,
    LeaseLost,
    ProtocolError,
    RotatorError,
    ServerBusy,
    WrongKeyType,
)
from rotator.models import DeadLetter, Job, RingEntry, Stats
from rotator.worker import WorkSummary

__all__ = [
    "DeadLetter",
    "Durability",
    "InvalidArgument",
    "InvalidJobId",
    "InvalidQueueName",
    "InvalidToken",
    "Job",
    "LeaseLost",
    "NotDurable",
    "ProtocolError",
    "RingEntry",
    "Rotator",
    "RotatorError",
    "ServerBusy",
    "Stats",
    "WorkSummary",
    "WrongKeyType",
]
__version__ = "0.1.0"
