"""Finding every queue and topic on a server or a Redis Cluster, without KEYS.

On one server: one SCAN over the keyspace, each call bounded (``COUNT`` keyspace slots, 1000
by default), asking only for hashes whose names match ``<prefix>:{*}:*``: a queue is found by
its meta hash (``rotator:{orders}:meta``, written by its first push) and kept while its ring,
its scheduled jobs or its dead letters exist (a deleted queue keeps only its seq there), a
topic by its meta or groups hash (its first publish or subscribe). The whole scan is O(keys on
the server), like any SCAN, and sees every key that exists from its start to its end; one
created or deleted meanwhile may or may not be seen.

On Redis Cluster (a ``redis.cluster.RedisCluster`` or ``redis.asyncio.cluster.RedisCluster``
client): the same bounded SCAN on each primary in turn (each step sent to that node alone with
``target_nodes``, each node with its own cursor), the names merged and deduplicated; then each
queue's liveness check (one EXISTS of its ring, scheduled jobs and dead letters) goes to the
node that holds the queue: all of a queue's keys share its hash tag, so the cluster client
sends that EXISTS to one slot's node. Replicas are not scanned (they copy their primary's
keys). A slot migrating between primaries during the scan may show a queue on both nodes (the
merge keeps one) or on neither (the next call finds it again). The scan is O(keys in the
cluster) in all, each call bounded.

Sharded queues (:mod:`rotator.sharded`) are found by their layout hash,
``<prefix>:{NAME}:shards`` (the shard count and naming scheme, written at first use and
deleted with the queue), which the same SCAN sees. Each is reported once, as a
:class:`ShardedQueue` under its logical name NAME with its shard count; its shard queues
(``NAME:k.SALT``, a function of NAME and the count) are listed nowhere else. It is listed while
one of its shards holds jobs (the liveness check of one shard queue after another, stopping at
the first live one). A layout this version cannot read (another naming scheme, a count out of
range) groups nothing: its shards stay ordinary queues.

:func:`scan_names` is the SCAN flow for one server or one primary, :func:`keep_live` the
liveness check and :func:`discover` both on one server; :func:`find` runs them on a client
and :func:`find_async` awaits them on a ``redis.asyncio`` client.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from redis.cluster import RedisCluster

from rotator import protocol
from rotator.commands import ClientCall, Flow, Request
from rotator.defaults import DEFAULT_PREFIX, DEFAULT_SCAN_COUNT
from rotator.errors import InvalidQueueName
from rotator.keys import discovered, discovery_pattern, queue_keys, validate_queue_name
from rotator.models import Discovered
from rotator.sending import Sender
from rotator.sharded import LAYOUT, MAX_SHARDS, layout_key, shard_names

__all__ = [
    "Found",
    "Seen",
    "ShardedQueue",
    "discover",
    "find",
    "find_async",
    "keep_live",
    "layout_count",
    "layout_name",
    "scan_names",
]


@dataclass(frozen=True, slots=True)
class ShardedQueue:
    """A sharded queue found: its logical name, its stored shard count and its shards' queue
    names, shard 0 first (open it with ``ShardedRotator(cluster, name, shards=shards)``)."""

    name: str
    shards: int
    shard_names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Found(Discovered):
    """What discovery found: the ordinary queues and the topics (as :class:`Discovered`), and
    the sharded queues, each once under its logical name, sorted; a sharded queue's shard
    queues are in none of the lists."""

    sharded: tuple[ShardedQueue, ...] = ()

    @property
    def names(self) -> frozenset[str]:
        """Every queue name found, ordinary and sharded."""
        return frozenset(self.queues) | {queue.name for queue in self.sharded}


class Seen(NamedTuple):
    """The queue and topic names a scan saw (the queues not yet checked for liveness), and
    the names of the sharded queues whose layout hash it saw."""

    queues: frozenset[str]
    topics: frozenset[str]
    sharded: frozenset[str] = frozenset()


def merged(parts: Iterable[Seen]) -> Seen:
    """The names seen on any node, each once."""
    queues: set[str] = set()
    topics: set[str] = set()
    sharded: set[str] = set()
    for part in parts:
        queues |= part.queues
        topics |= part.topics
        sharded |= part.sharded
    return Seen(frozenset(queues), frozenset(topics), frozenset(sharded))


def layout_name(key: str, prefix: str = DEFAULT_PREFIX) -> str | None:
    """The sharded queue whose layout hash (:func:`rotator.sharded.layout_key`) ``key`` is,
    or None for any other key."""
    head, _, tail = layout_key("\0", prefix).partition("\0")
    if not key.startswith(head) or not key.endswith(tail):
        return None
    try:
        return validate_queue_name(key[len(head) : -len(tail)])
    except InvalidQueueName:
        return None


def layout_count(stored: Sequence[Any]) -> int | None:
    """The shard count of a layout hash's ``shards`` and ``layout`` fields (HMGET), or None
    when there is none, or it is not one this version names shards by."""
    count, layout = (None if value is None else protocol.text(value) for value in stored)
    if layout != LAYOUT or count is None or not count.isdigit():
        return None
    shards = int(count)
    return shards if 1 <= shards <= MAX_SHARDS else None


def scan_names(prefix: str = DEFAULT_PREFIX, count: int = DEFAULT_SCAN_COUNT) -> Flow[Seen]:
    """The flow: SCAN one server (or one primary) until its cursor comes back to 0."""
    pattern = discovery_pattern(prefix)
    count = protocol.whole(count, "count", 1, 1_000_000)
    queues: set[str] = set()
    topics: set[str] = set()
    sharded: set[str] = set()
    cursor: Any = 0
    while True:
        cursor, keys = yield ClientCall("scan", (cursor, pattern, count, "hash"))
        for key in keys:
            text = protocol.text(key)
            found = discovered(text, prefix)
            if found is not None:
                (queues if found[0] == "queue" else topics).add(found[1])
            elif (name := layout_name(text, prefix)) is not None:
                sharded.add(name)
        if int(cursor) == 0:
            return Seen(frozenset(queues), frozenset(topics), frozenset(sharded))


def is_live(name: str, prefix: str) -> Flow[bool]:
    """The flow: True while queue ``name`` holds jobs. A deleted queue keeps its meta hash
    (its seq: see the module's delete): it is a queue only while its ring, its scheduled
    jobs or its dead letters exist."""
    keys = queue_keys(name, prefix)
    return bool((yield ClientCall("exists", (keys.ring, keys.scheduled, keys.dead))))


def keep_live(seen: Seen, prefix: str = DEFAULT_PREFIX) -> Flow[Found]:
    """The flow: the sharded queues seen (their layout read, then their shards checked for
    liveness until one is live), the other queues seen that still hold jobs, and the
    topics, each sorted."""
    sharded: list[ShardedQueue] = []
    grouped: set[str] = set()
    for name in sorted(seen.sharded):
        stored = yield ClientCall("hmget", (layout_key(name, prefix), ["shards", "layout"]))
        count = layout_count(stored)
        if count is None:
            continue  # deleted since the scan, or a layout this version cannot name
        names = shard_names(name, count)
        grouped.update(names)
        for shard in names:
            # A shard never pushed to has no meta hash, so the scan did not see it: not live.
            if shard in seen.queues and (yield from is_live(shard, prefix)):
                sharded.append(ShardedQueue(name, count, names))
                break
    live = []
    for name in sorted(seen.queues - grouped):
        if (yield from is_live(name, prefix)):
            live.append(name)
    return Found(tuple(live), tuple(sorted(seen.topics)), tuple(sharded))


def discover(prefix: str = DEFAULT_PREFIX, count: int = DEFAULT_SCAN_COUNT) -> Flow[Found]:
    """The flow on one server: its SCAN, then the liveness check."""
    seen = yield from scan_names(prefix, count)
    return (yield from keep_live(seen, prefix))


def _scan_args(request: Request) -> tuple[Any, ...]:
    """The arguments of a SCAN step (the scan flow asks for nothing else)."""
    if not isinstance(request, ClientCall) or request.method != "scan":
        raise TypeError(f"not a SCAN step: {request!r}")
    return request.args


def _node_reply(reply: Any, node: Any) -> tuple[Any, list[Any]]:
    """This node's cursor and keys: a cluster client answers SCAN with each node's cursor by
    node name, even for one node (its reply callback, which redis-py's types do not show)."""
    cursors, keys = reply
    return cursors[node.name], keys


def _scan_primary(client: RedisCluster, node: Any, flow: Flow[Seen]) -> Seen:
    """Runs the scan flow on one primary: each step goes to ``node`` alone, through the
    cluster client (its connections and its handling of a node that moved or failed)."""
    reply: Any = None
    try:
        while True:
            args = _scan_args(flow.send(reply))
            reply = _node_reply(client.scan(*args, target_nodes=node), node)
    except StopIteration as stop:
        seen: Seen = stop.value
        return seen


async def _scan_primary_async(client: Any, node: Any, flow: Flow[Seen]) -> Seen:
    """:func:`_scan_primary` on a ``redis.asyncio`` cluster client."""
    reply: Any = None
    try:
        while True:
            args = _scan_args(flow.send(reply))
            reply = _node_reply(await client.scan(*args, target_nodes=node), node)
    except StopIteration as stop:
        seen: Seen = stop.value
        return seen


def find(client: Any, *, prefix: str = DEFAULT_PREFIX, count: int = DEFAULT_SCAN_COUNT) -> Found:
    """Every queue, sharded queue and topic on the server of ``client`` (a ``redis.Redis``),
    or on every primary of a cluster (a ``redis.cluster.RedisCluster``)."""
    sender = Sender(client, False, None)
    if not isinstance(client, RedisCluster):
        return sender.run(discover(prefix, count))
    primaries = client.get_primaries()  # type: ignore[no-untyped-call]
    seen = merged(_scan_primary(client, node, scan_names(prefix, count)) for node in primaries)
    return sender.run(keep_live(seen, prefix))


async def find_async(
    client: Any, *, prefix: str = DEFAULT_PREFIX, count: int = DEFAULT_SCAN_COUNT
) -> Found:
    """:func:`find` on a ``redis.asyncio`` client (``Redis`` or ``cluster.RedisCluster``)."""
    # Imported here, so that sync callers never load redis.asyncio.
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster  # noqa: PLC0415

    from rotator.aio import AsyncSender  # noqa: PLC0415

    sender = AsyncSender(client, False, None)
    if not isinstance(client, AsyncRedisCluster):
        return await sender.run(discover(prefix, count))
    await client.initialize()  # a new client learns its primaries from the slot map here
    # One primary after another, as find does: the same load on the cluster, errors simpler.
    parts = [
        await _scan_primary_async(client, node, scan_names(prefix, count))
        for node in client.get_primaries()
    ]
    return await sender.run(keep_live(merged(parts), prefix))
