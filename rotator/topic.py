"""Topics: each message published once reaches every registered consumer group.

A topic keeps each payload once (``bodies``), in an ordered log of message ids
(``<ms>-<seq>``), and a registry of groups. Each group is an ordinary rotator ring inside the
topic's hash tag, so every guarantee of :class:`rotator.Rotator` holds per group: a group's
instances share its ring, so one message goes to one instance of each group at a time.

``publish`` is one Lua call that stores the payloads and pushes their ids onto every
registered group's ring. It names every group's keys; the module refuses the call
(``GroupsChanged``, nothing written) when the set it got is not the registered set, and
``publish`` reads the groups again and retries. So a message published while a group
registers is either in the group's ring or was published before the group existed.

Retention decides when a payload is deleted, not acks: a message leaves the topic (payload
and log entry) once it is beyond the retained count or older than the retained age, trimmed by
each publish and by :meth:`Topic.trim`. A group that acks a message only removes the id from
its own ring; the payload stays retained for replay. A message that leaves retention before a
group consumed it is still delivered to that group, with ``payload=None``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rotator import protocol
from rotator.aio import AsyncClient, AsyncRotator
from rotator.core import Client, Rotator
from rotator.defaults import (
    DEFAULT_PREFIX,
    DEFAULT_TOPIC_RETENTION,
    MAX_BATCH,
    MAX_BUDGET,
    MAX_PUBLISH,
    MAX_RETENTION_SECONDS,
    TOPIC_STALE_RETRIES,
)
from rotator.errors import GroupsChanged, InvalidArgument
from rotator.keys import QueueKeys, TopicKeys, topic_keys, validate_group_name
from rotator.models import Stats
from rotator.script import async_module_caller, module_caller, run, run_async

_T = TypeVar("_T")
_MESSAGE_ID = re.compile(r"(\d{1,15})-(\d{1,15})")


@dataclass(frozen=True, slots=True)
class Retention:
    """How much a topic keeps: at most ``count`` messages and/or none older than ``age``
    seconds. At least one must be set, so the topic's memory is bounded."""

    count: int | None = DEFAULT_TOPIC_RETENTION
    age: float | None = None

    def args(self) -> tuple[int, int]:
        count = 0 if self.count is None else protocol.whole(self.count, "count", 1, 10**12)
        age = (
            0
            if self.age is None
            else protocol.seconds_to_ms(self.age, "age", limit=MAX_RETENTION_SECONDS)
        )
        if count == 0 and age == 0:
            raise InvalidArgument("retention needs a count, an age or both")
        return count, age


@dataclass(frozen=True, slots=True)
class TopicStats:
    """A topic's counts, read in one atomic call."""

    retained: int  # messages in the log (and payloads kept)
    bytes: int  # payload bytes retained
    last_seq: int  # seq of the last message published (0 before the first)
    groups: dict[str, Stats] = field(default_factory=dict)  # backlog = Stats.pending


def message_seq(message_id: str) -> int:
    """The seq of a message id ``<ms>-<seq>``."""
    found = _MESSAGE_ID.fullmatch(message_id) if isinstance(message_id, str) else None
    if not found:
        raise InvalidArgument(f"not a message id (<ms>-<seq>): {message_id!r}")
    return int(found[2])


def start_seq(start: str) -> int | None:
    """The first seq a new group gets from the retained log: None for "latest"."""
    if start == "latest":
        return None
    if start == "earliest":
        return 0
    return message_seq(start)


def time_ms(from_time: object) -> int:
    if isinstance(from_time, bool) or not isinstance(from_time, int | float):
        raise InvalidArgument(f"from_time must be unix seconds, got {from_time!r}")
    return protocol.whole(int(max(from_time, 0) * 1000), "from_time", 0, 10**15)


def decode_topic_stats(reply: list[Any]) -> TopicStats:
    head = {protocol.text(reply[i]): int(reply[i + 1]) for i in range(0, 8, 2)}
    groups: dict[str, Stats] = {}
    names = ("length", "pending", "in_flight", "done", "deferred", "dead", "oldest_pending_age_ms")
    step = len(names) + 1
    for i in range(8, len(reply), step):
        flat: list[Any] = []
        for name, value in zip(names, reply[i + 1 : i + step], strict=True):
            flat += [name, int(value)]
        groups[protocol.text(reply[i])] = protocol.decode_stats(flat)
    return TopicStats(head["retained"], head["bytes"], head["last_seq"], groups)


class TopicGroup(Rotator):
    """One consumer group's view of a topic: the Rotator API over the group's ring, with each
    job's ``payload`` read in the same call as the lease. ``Job.id`` is the message id.

    Acks leave payloads alone (the topic's retention owns them).
    """

    _drop_payloads = False

    def __init__(self, client: Client, topic: TopicKeys, group: str, **options: Any) -> None:
        if options.pop("item_stats", False):
            raise InvalidArgument("topic groups keep no item stats")
        super().__init__(client, topic.name, payloads=True, **options)
        self.group = group
        self.keys = topic.group(group)

    def __repr__(self) -> str:
        return f"TopicGroup({self.keys.name!r}, timeout={self.timeout})"

    def push_payloads(self, items: Any, chunk: int = 0) -> int:
        raise InvalidArgument("publish to the topic instead of pushing payloads to a group")

    def delete(self) -> bool:
        """Empties the group's ring (it stays registered); the topic's payloads stay."""
        return bool(self.client.delete(*self.keys.all))


class Topic:
    """A topic on one Redis or Valkey server (or Redis Cluster: all its keys and its groups'
    keys share the hash tag ``{name}``)."""

    def __init__(
        self,
        client: Client,
        name: str,
        *,
        retention: Retention | None = None,
        prefix: str = DEFAULT_PREFIX,
        functions: bool = False,
    ) -> None:
        self.client = client
        self.name = name
        self.keys = topic_keys(name, prefix)
        self.retention = retention if retention is not None else Retention()
        self._retention = self.retention.args()
        self._functions = functions
        self._script: Any = module_caller(client, functions)

    def __repr__(self) -> str:
        return f"Topic({self.name!r}, retention={self.retention})"

    def _call(self, keys: tuple[str, ...], *args: Any) -> Any:
        return run(self._script, keys, list(args))

    def _group_keys(self, group: str) -> tuple[str, ...]:
        return (*self.keys.all, *self.keys.group(group).all)

    def _with_every_group(self, call: Callable[[list[str], tuple[str, ...]], _T]) -> _T:
        """Runs a call that names every registered group, re-reading them when they changed."""
        for _ in range(TOPIC_STALE_RETRIES):
            names = self.groups()
            keys = [key for name in names for key in self.keys.group(name).all]
            try:
                return call(names, (*self.keys.all, *keys))
            except GroupsChanged:
                continue
        raise GroupsChanged(f"topic {self.name!r}: groups kept changing during the call")

    # -- groups ----------------------------------------------------------------------------

    def groups(self) -> list[str]:
        """The registered group names, sorted."""
        raw = self.client.hkeys(self.keys.groups)
        return sorted(protocol.text(name) for name in raw)

    def subscribe(self, group: str, start: str = "latest") -> bool:
        """Registers ``group``; returns False if it already was (then nothing changes).

        ``start``: "latest" (only messages published from now on), "earliest" (every retained
        message too) or a message id (the retained messages from that id on, then new ones).
        Registration is atomic with respect to publishing: every publish after it reaches the
        group. The retained messages are pushed after registering, in calls of up to 5000.
        """
        validate_group_name(group)
        first = start_seq(start)
        added, last_seq = self._call(self._group_keys(group), b"tsubscribe", group)
        # Messages after last_seq reach the group by publishing (0: there were none before).
        if int(added) == 1 and first is not None and int(last_seq) > 0:
            self._replay(group, first, int(last_seq))
        return int(added) == 1

    def unsubscribe(self, group: str) -> bool:
        """Forgets ``group`` and deletes its ring (its pending and leased messages)."""
        validate_group_name(group)
        return int(self._call(self._group_keys(group), b"tunsubscribe", group)) == 1

    def group(self, group: str, **options: Any) -> TopicGroup:
        """The consumer of ``group`` (options as for Rotator: timeout, max_deliveries, ...).
        It does not register the group: call :meth:`subscribe` once first."""
        validate_group_name(group)
        return TopicGroup(self.client, self.keys, group, functions=self._functions, **options)

    def group_keys(self, group: str) -> QueueKeys:
        return self.keys.group(group)

    # -- publishing ------------------------------------------------------------------------

    def publish(self, payload: bytes | str) -> str:
        """Publishes one message to every registered group; returns its id (``<ms>-<seq>``)."""
        return self.publish_many([payload])[0]

    def publish_many(self, payloads: Iterable[bytes | str], chunk: int = MAX_PUBLISH) -> list[str]:
        """Publishes messages in order; returns their ids.

        Each call of up to ``chunk`` (at most 1000) messages is atomic: payloads stored, ids
        logged and pushed onto every group's ring together, then retention applied.
        """
        raw = [protocol.encode_payload(payload) for payload in payloads]
        size = protocol.whole(chunk, "chunk", 1, MAX_PUBLISH)
        count, age = self._retention
        ids: list[str] = []
        for start in range(0, len(raw), size):
            part = raw[start : start + size]

            def call(_: list[str], keys: tuple[str, ...], part: list[bytes] = part) -> Any:
                return self._call(keys, b"tpublish", count, age, *part)

            ids.extend(protocol.text(i) for i in self._with_every_group(call))
        return ids

    # -- replay and retention --------------------------------------------------------------

    def replay(
        self, group: str, *, from_id: str | None = None, from_time: float | None = None
    ) -> int:
        """Pushes the retained messages from ``from_id`` (inclusive) or from ``from_time``
        (unix seconds, inclusive) up to the latest onto ``group``'s ring again; returns how
        many. Messages published meanwhile reach the group by publishing, not twice."""
        validate_group_name(group)
        if (from_id is None) == (from_time is None):
            raise InvalidArgument("give exactly one of from_id and from_time")
        if from_id is not None:
            first = message_seq(from_id)
        else:
            first = int(self._call(self.keys.all, b"tseek", time_ms(from_time)))
        return self._replay(group, first, 0)

    def _replay(self, group: str, first: int, last: int) -> int:
        keys = self._group_keys(group)
        pushed = 0
        while True:
            done, after, last = self._call(keys, b"treplay", group, first, last, MAX_BATCH)
            pushed += int(done)
            first, last = int(after), int(last)
            if first > last or int(done) == 0:
                return pushed

    def trim(self) -> int:
        """Applies retention now (publishing also does); returns how many messages left."""
        count, age = self._retention
        dropped = 0
        while True:
            gone = int(self._call(self.keys.all, b"ttrim", count, age, MAX_BUDGET))
            dropped += gone
            if gone < MAX_BUDGET:
                return dropped

    # -- inspecting ------------------------------------------------------------------------

    def stats(self) -> TopicStats:
        """Retained count and bytes, and each group's ring stats, in one atomic call."""
        reply = self._with_every_group(lambda _, keys: self._call(keys, b"tstats"))
        return decode_topic_stats(reply)

    def delete(self) -> None:
        """Unsubscribes every group and removes the topic's keys."""
        for group in self.groups():
            self.unsubscribe(group)
        self.client.delete(*self.keys.all)


class AsyncTopicGroup(AsyncRotator):
    """The asyncio twin of :class:`TopicGroup`."""

    _drop_payloads = False

    def __init__(self, client: AsyncClient, topic: TopicKeys, group: str, **options: Any) -> None:
        if options.pop("item_stats", False):
            raise InvalidArgument("topic groups keep no item stats")
        super().__init__(client, topic.name, payloads=True, **options)
        self.group = group
        self.keys = topic.group(group)

    async def push_payloads(self, items: Any, chunk: int = 0) -> int:
        raise InvalidArgument("publish to the topic instead of pushing payloads to a group")


class AsyncTopic:
    """The asyncio twin of :class:`Topic`; see it for the semantics."""

    def __init__(
        self,
        client: AsyncClient,
        name: str,
        *,
        retention: Retention | None = None,
        prefix: str = DEFAULT_PREFIX,
        functions: bool = False,
    ) -> None:
        self.client = client
        self.name = name
        self.keys = topic_keys(name, prefix)
        self.retention = retention if retention is not None else Retention()
        self._retention = self.retention.args()
        self._functions = functions
        self._script: Any = async_module_caller(client, functions)

    async def _call(self, keys: tuple[str, ...], *args: Any) -> Any:
        return await run_async(self._script, keys, list(args))

    def _group_keys(self, group: str) -> tuple[str, ...]:
        return (*self.keys.all, *self.keys.group(group).all)

    async def _every_group(self, *args: Any) -> Any:
        for _ in range(TOPIC_STALE_RETRIES):
            names = await self.groups()
            keys = [key for name in names for key in self.keys.group(name).all]
            try:
                return await self._call((*self.keys.all, *keys), *args)
            except GroupsChanged:
                continue
        raise GroupsChanged(f"topic {self.name!r}: groups kept changing during the call")

    async def groups(self) -> list[str]:
        raw = await self.client.hkeys(self.keys.groups)
        return sorted(protocol.text(name) for name in raw)

    async def subscribe(self, group: str, start: str = "latest") -> bool:
        validate_group_name(group)
        first = start_seq(start)
        added, last_seq = await self._call(self._group_keys(group), b"tsubscribe", group)
        if int(added) == 1 and first is not None and int(last_seq) > 0:
            await self._replay(group, first, int(last_seq))
        return int(added) == 1

    async def unsubscribe(self, group: str) -> bool:
        validate_group_name(group)
        return int(await self._call(self._group_keys(group), b"tunsubscribe", group)) == 1

    def group(self, group: str, **options: Any) -> AsyncTopicGroup:
        validate_group_name(group)
        return AsyncTopicGroup(self.client, self.keys, group, functions=self._functions, **options)

    async def publish(self, payload: bytes | str) -> str:
        return (await self.publish_many([payload]))[0]

    async def publish_many(
        self, payloads: Iterable[bytes | str], chunk: int = MAX_PUBLISH
    ) -> list[str]:
        raw = [protocol.encode_payload(payload) for payload in payloads]
        size = protocol.whole(chunk, "chunk", 1, MAX_PUBLISH)
        count, age = self._retention
        ids: list[str] = []
        for start in range(0, len(raw), size):
            reply = await self._every_group(b"tpublish", count, age, *raw[start : start + size])
            ids.extend(protocol.text(i) for i in reply)
        return ids

    async def replay(
        self, group: str, *, from_id: str | None = None, from_time: float | None = None
    ) -> int:
        validate_group_name(group)
        if (from_id is None) == (from_time is None):
            raise InvalidArgument("give exactly one of from_id and from_time")
        if from_id is not None:
            first = message_seq(from_id)
        else:
            first = int(await self._call(self.keys.all, b"tseek", time_ms(from_time)))
        return await self._replay(group, first, 0)

    async def _replay(self, group: str, first: int, last: int) -> int:
        keys = self._group_keys(group)
        pushed = 0
        while True:
            done, after, last = await self._call(keys, b"treplay", group, first, last, MAX_BATCH)
            pushed += int(done)
            first, last = int(after), int(last)
            if first > last or int(done) == 0:
                return pushed

    async def trim(self) -> int:
        count, age = self._retention
        dropped = 0
        while True:
            gone = int(await self._call(self.keys.all, b"ttrim", count, age, MAX_BUDGET))
            dropped += gone
            if gone < MAX_BUDGET:
                return dropped

    async def stats(self) -> TopicStats:
        return decode_topic_stats(await self._every_group(b"tstats"))

    async def delete(self) -> None:
        for group in await self.groups():
            await self.unsubscribe(group)
        await self.client.delete(*self.keys.all)
