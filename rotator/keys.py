"""Queue key names: the only place they are built.

Every key of a queue shares the hash tag ``{name}``, so all of them hash to one Redis Cluster
slot and one script call can touch them all. The order of :data:`KEY_ROLES` is the KEYS order
documented at the top of ``lua/rotator.lua``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rotator.defaults import DEFAULT_PREFIX, MAX_GROUP_BYTES
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
    "leases",
    "scheduled",
    "ids",
)

# No braces (they would break the hash tag), no glob characters (they would widen ACL key
# patterns such as ~rotator:{name}:*), no whitespace or control bytes.
_NAME = re.compile(r"[A-Za-z0-9._:@/-]{1,128}")


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """The thirteen keys of one queue, in KEYS order, and where its payloads live (KEYS[14] of
    pushp/nextp/ackp): the queue's own hash, or for a topic group the topic's bodies."""

    name: str
    all: tuple[str, ...]
    payloads: str = ""
    items: str = ""  # per-item stats (KEYS[15]); "" where there are none (a topic group)

    @property
    def with_payloads(self) -> tuple[str, ...]:
        return (*self.all, self.payloads)

    @property
    def with_items(self) -> tuple[str, ...]:
        return (*self.all, self.payloads, self.items)

    @property
    def ring(self) -> str:
        return self.all[0]

    def push_marker(self, run: str) -> str:
        """The marker hash of push call ``run`` (``push_chunk``'s KEYS[14]): a key under the
        queue's base, so in its slot."""
        return f"{self.ring.rsplit(':', 1)[0]}:push:{run}"

    @property
    def dead(self) -> str:
        return self.all[6]

    @property
    def meta(self) -> str:
        return self.all[8]

    @property
    def leases(self) -> str:
        return self.all[10]

    @property
    def scheduled(self) -> str:
        return self.all[11]

    @property
    def ids(self) -> str:
        return self.all[12]

    @property
    def wake(self) -> str:
        return self.all[7]

    @property
    def workers(self) -> str:
        """The worker registry hash (``<base>:workers``, rotator.registry): written by the
        Python worker loops, never passed to the Lua module, so not in KEY_ROLES."""
        return f"{self.all[0].rsplit(':', 1)[0]}:workers"

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
    return QueueKeys(
        name,
        tuple(f"{prefix}:{{{name}}}:{role}" for role in KEY_ROLES),
        f"{prefix}:{{{name}}}:payloads",
        f"{prefix}:{{{name}}}:items",
    )


# The topic's own keys, in the order of the header's TOPIC KEYS.
TOPIC_ROLES = ("meta", "groups", "log", "bodies")
# Group names end up inside key names: no ":" (keeps "<group>:<role>" unambiguous).
_GROUP = re.compile(rf"[A-Za-z0-9._@/-]{{1,{MAX_GROUP_BYTES}}}")


@dataclass(frozen=True, slots=True)
class TopicKeys:
    """The four keys of one topic, in TOPIC KEYS order; its groups' keys share its tag."""

    name: str
    all: tuple[str, ...]
    prefix: str

    @property
    def groups(self) -> str:
        return self.all[1]

    @property
    def log(self) -> str:
        return self.all[2]

    @property
    def bodies(self) -> str:
        return self.all[3]

    def publish_marker(self, run: str) -> str:
        """The marker hash of publish call ``run`` (``tpublish_chunk``'s last key): a key under
        ``<prefix>:{<topic>}:publish:``, so in the topic's slot."""
        return f"{self.prefix}:{{{self.name}}}:publish:{run}"

    def group(self, group: str) -> QueueKeys:
        """Group ``group``'s thirteen queue keys (``<prefix>:{<topic>}:group:<group>:<role>``);
        its payloads are the topic's bodies."""
        validate_group_name(group)
        base = f"{self.prefix}:{{{self.name}}}:group:{group}"
        return QueueKeys(
            f"{self.name}.{group}", tuple(f"{base}:{role}" for role in KEY_ROLES), self.bodies
        )


def validate_group_name(group: object) -> str:
    if not isinstance(group, str) or not _GROUP.fullmatch(group):
        raise InvalidQueueName(
            f"group name must be 1..{MAX_GROUP_BYTES} of A-Z a-z 0-9 . _ @ / -, got {group!r}"
        )
    return group


def topic_keys(name: str, prefix: str = DEFAULT_PREFIX) -> TopicKeys:
    validate_queue_name(name)
    if not isinstance(prefix, str) or not _NAME.fullmatch(prefix):
        raise InvalidQueueName(f"key prefix must match the queue-name rules, got {prefix!r}")
    return TopicKeys(
        name, tuple(f"{prefix}:{{{name}}}:topic:{role}" for role in TOPIC_ROLES), prefix
    )


# -- finding queues and topics by their keys (rotator.discovery) ------------------------------


def discovery_pattern(prefix: str = DEFAULT_PREFIX) -> str:
    """The SCAN MATCH pattern of every key under ``prefix`` with a hash tag. Neither the
    prefix nor a name can hold a glob character, so the pattern matches nothing else."""
    if not isinstance(prefix, str) or not _NAME.fullmatch(prefix):
        raise InvalidQueueName(f"key prefix must match the queue-name rules, got {prefix!r}")
    return f"{prefix}:{{*}}:*"


def discovered(key: str, prefix: str = DEFAULT_PREFIX) -> tuple[str, str] | None:
    """``("queue", name)`` for a queue's meta hash, ``("topic", name)`` for a topic's meta
    or groups hash, None for any other key. A queue has its meta from its first push on, a
    topic its groups from the first subscribe and its meta from the first publish."""
    head = f"{prefix}:{{"
    if not key.startswith(head):
        return None
    name, sep, role = key[len(head) :].partition("}:")
    if not sep or not _NAME.fullmatch(name):
        return None
    if role == "meta":
        return "queue", name
    if role in ("topic:meta", "topic:groups"):
        return "topic", name
    return None
