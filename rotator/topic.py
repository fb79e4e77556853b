"""Topics: each message published once reaches every registered consumer group.

A topic keeps each payload once (``bodies``), in an ordered log of message ids
(``<ms>-<seq>``), and a registry of groups. Each group is an ordinary rotator ring inside the
topic's hash tag, so every guarantee of :class:`rotator.Rotator` holds per group: a group's
instances share its ring, so one message goes to one instance of each group at a time.

``publish`` is one Lua call that stores the payloads and pushes their ids onto every
registered group's ring. It names every group's keys, as the topic last read them; the
module refuses the call (``GroupsChanged``, nothing written) when the set it got is not the
registered set, and ``publish`` reads the groups again and retries. So a message published
while a group registers is either in the group's ring or was published before the group
existed.

Retention decides when a payload is deleted, not acks: a message leaves the topic (payload
and log entry) once it is beyond the retained count or older than the retained age, trimmed by
each publish and by :meth:`Topic.trim`. A group that acks a message only removes the id from
its own ring; the payload stays retained for replay. A message that leaves retention before a
group consumed it is still delivered to that group, with ``payload=None``, unless the group's
backlog bound dropped it: each publish keeps every group's pending ids within the retained
count (1,000,000 with age-only retention), give or take 16, by dropping its oldest pending
ids, which are never delivered to that group (:meth:`Topic.expired` counts them; leased
messages never go).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rotator import commands
from rotator.core import Client, Rotator
from rotator.defaults import DEFAULT_PREFIX, MAX_PUBLISH
from rotator.flows import GroupView, TopicFlows, TopicView, message_seq
from rotator.keys import TopicKeys, validate_group_name
from rotator.models import Retention, TopicStats
from rotator.retries import check_retry_for, push_marker_ttl_ms, sender

__all__ = ["Retention", "Topic", "TopicGroup", "TopicStats", "message_seq"]


class TopicGroup(GroupView, Rotator):
    """One consumer group's view of a topic: the Rotator API over the group's ring, with each
    job's ``payload`` read in the same call as the lease. ``Job.id`` is the message id.

    Acks leave payloads alone (the topic's retention owns them); ``delete`` empties the
    group's ring (it stays registered) and leaves the payloads.
    """

    def __init__(self, client: Client, topic: TopicKeys, group: str, **options: Any) -> None:
        self.group = group
        self._topic = topic
        super().__init__(client, topic.name, **options)


class Topic(TopicView):
    """A topic on one Redis or Valkey server (or Redis Cluster: all its keys and its groups'
    keys share the hash tag ``{name}``).

    ``retry_for`` (seconds, 0..3600; 0, the default, is off) sends a call again after a
    connection error, a timeout or a reply that says it never ran, for at most that long, as
    :class:`rotator.Rotator`'s does, and is its groups' default. A publish then goes as
    ``tpublish_chunk`` under a marker of its own (one small hash, kept a minute), so that a
    publish sent again after its reply was lost publishes nothing twice and returns the ids
    its first call published. ``subscribe``, ``unsubscribe`` and ``replay`` are not sent
    again once they may have run: they raise, as without ``retry_for``.
    """

    def __init__(
        self,
        client: Client,
        name: str,
        *,
        retention: Retention | None = None,
        prefix: str = DEFAULT_PREFIX,
        functions: bool | None = None,
        retry_for: float = 0.0,
    ) -> None:
        self.client = client
        self.retry_for = check_retry_for(retry_for)
        self._flows = TopicFlows(
            name,
            retention=retention,
            prefix=prefix,
            publish_marker_ttl_ms=push_marker_ttl_ms(self.retry_for),
        )
        self._functions = functions
        self._sender = sender(client, functions, self.retry_for)
        self._run = self._sender.run

    def _call(self, keys: tuple[str, ...], *args: Any) -> Any:
        """One raw module call naming ``keys`` (for tests and debugging)."""
        return self._sender.perform(commands.raw(keys, args))

    # -- groups ----------------------------------------------------------------------------

    def exists(self) -> bool:
        """True once a group was registered or a message published, until :meth:`delete`."""
        return self._run(self._flows.exists())

    def groups(self) -> list[str]:
        """The registered group names, sorted."""
        return self._run(self._flows.groups())

    def subscribe(self, group: str, start: str = "latest") -> bool:
        """Registers ``group``; returns False if it already was (then nothing changes).

        ``start``: "latest" (only messages published from now on), "earliest" (every retained
        message too) or a message id (the retained messages from that id on, then new ones).
        Registration is atomic with respect to publishing: every publish after it reaches the
        group. The retained messages are pushed after registering, in calls of up to 5000.
        """
        return self._run(self._flows.subscribe(group, start))

    def unsubscribe(self, group: str) -> bool:
        """Forgets ``group`` and deletes its ring (its pending and leased messages)."""
        return self._run(self._flows.unsubscribe(group))

    def group(self, group: str, **options: Any) -> TopicGroup:
        """The consumer of ``group`` (options as for Rotator: timeout, max_deliveries, ...;
        ``retry_for`` the topic's unless given). It does not register the group: call
        :meth:`subscribe` once first."""
        validate_group_name(group)
        options.setdefault("retry_for", self.retry_for)
        return TopicGroup(self.client, self.keys, group, functions=self._functions, **options)

    # -- publishing ------------------------------------------------------------------------

    def publish(self, payload: bytes | str) -> str:
        """Publishes one message to every registered group; returns its id (``<ms>-<seq>``)."""
        return self._run(self._flows.publish_many([payload], MAX_PUBLISH))[0]

    def publish_many(self, payloads: Iterable[bytes | str], chunk: int = MAX_PUBLISH) -> list[str]:
        """Publishes messages in order; returns their ids.

        Each call of up to ``chunk`` (at most 1000) messages is atomic: payloads stored, ids
        logged and pushed onto every group's ring together, then retention applied.
        """
        return self._run(self._flows.publish_many(payloads, chunk))

    # -- replay and retention --------------------------------------------------------------

    def replay(
        self, group: str, *, from_id: str | None = None, from_time: float | None = None
    ) -> int:
        """Pushes the retained messages from ``from_id`` (inclusive) or from ``from_time``
        (unix seconds, inclusive) up to the latest onto ``group``'s ring again; returns how
        many. Messages published meanwhile reach the group by publishing, not twice."""
        return self._run(self._flows.replay(group, from_id, from_time))

    def trim(self) -> int:
        """Applies retention now (publishing also does); returns how many messages left.
        Runs in calls of up to 2000 messages each, so any backlog over retention goes."""
        return self._run(self._flows.trim())

    def expired(self, group: str) -> int:
        """How many message ids left ``group``'s backlog unconsumed: publishing keeps a
        group's pending ids within the retained count (1,000,000 with age-only retention),
        give or take 16, by dropping its oldest pending ids, never delivered to that group."""
        return self._run(self._flows.expired(group))

    # -- inspecting ------------------------------------------------------------------------

    def stats(self) -> TopicStats:
        """Retained count and bytes, and each group's ring stats, in one atomic call."""
        return self._run(self._flows.stats())

    def delete(self) -> None:
        """Unsubscribes every group and removes the topic's keys."""
        self._run(self._flows.delete())
