"""Queue key names: the only place they are built.

Every key of a queue shares the hash tag ``{name}``, so all of them hash to one Redis Cluster
slot and one script call can touch them all. The order of :data:`KEY_ROLES` is the KEYS order
documented at the top of ``lua/rotator.lua``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rotator.defaults import DEFAULT_PREFIX
from rotator.errors import InvalidQueueName

KEY_ROLES = (
    "ring",
    "done",
    "done_old",
    "marks",
    "marks_old",
    "revoked",
    "dead",
    "wake",
    "meta",
    "pushlog",
)

# No braces (they would break the hash tag), no glob characters (they would widen ACL key
# patterns such as ~rotator:{name}:*), no whitespace or control bytes.
_NAME = re.compile(r"[A-Za-z0-9._:@/-]{1,128}")


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """The ten keys of one queue, in KEYS order."""

    name: str
    all: tuple[str, ...]

    @property
    def ring(self) -> str:
        return self.all[0]

    @property
    def dead(self) -> str:
        return self.all[6]

    @property
    def wake(self) -> str:
        return self.all[7]

    @property
    def acl_pattern(self) -> str:
        """The ACL key pattern (``~...``) that covers exactly this queue's keys."""
        return f"{self.all[0].rsplit(':', 1)[0]}:*"


def validate_queue_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidQueueName(
            f"queue name must be 1..128 of A-Z a-z 0-9 . _ : @ / -, got {name!r}"
        )
    return name


def queue_keys(name: str, prefix: str = DEFAULT_PREFIX) -> QueueKeys:
    validate_queue_name(name)
    if not isinstance(prefix, str) or not _NAME.fullmatch(prefix):
        raise InvalidQueueName(f"key prefix must match the queue-name rules, got {prefix!r}")
    return QueueKeys(name, tuple(f"{prefix}:{{{name}}}:{role}" for role in KEY_ROLES))
