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

:func:`scan_names` is the SCAN flow for one server or one primary, :func:`keep_live` the
liveness check and :func:`discover` both on one server; :func:`find` runs them on a client
and :func:`find_async` awaits them on a ``redis.asyncio`` client.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from redis.cluster import RedisCluster

from rotator import protocol
from rotator.commands import ClientCall, Flow, Request
from rotator.defaults import DEFAULT_PREFIX, DEFAULT_SCAN_COUNT
from rotator.keys import discovered, discovery_pattern, queue_keys
from rotator.models import Discovered
from rotator.sending import Sender

__all__ = ["Seen", "discover", "find", "find_async", "keep_live", "scan_names"]


class Seen(NamedTuple):
    """The queue and topic names a scan saw (the queues not yet checked for liveness)."""

    queues: frozenset[str]
    topics: frozenset[str]


def merged(parts: Iterable[Seen]) -> Seen:
    """The names seen on any node, each once."""
    queues: set[str] = set()
    topics: set[str] = set()
    for part in parts:
        queues |= part.queues
        topics |= part.topics
    return Seen(frozenset(queues), frozenset(topics))


def scan_names(prefix: str = DEFAULT_PREFIX, count: int = DEFAULT_SCAN_COUNT) -> Flow[Seen]:
    """The flow: SCAN one server (or one primary) until its cursor comes back to 0."""
    pattern = discovery_pattern(prefix)
    count = protocol.whole(count, "count", 1, 1_000_000)
    queues: set[str] = set()
    topics: set[str] = set()
    cursor: Any = 0
    while True:
        cursor, keys = yield ClientCall("scan", (cursor, pattern, count, "hash"))
        for key in keys:
            found = discovered(protocol.text(key), prefix)
            if found is not None:
                (queues if found[0] == "queue" else topics).add(found[1])
        if int(cursor) == 0:
            return Seen(frozenset(queues), frozenset(topics))


def keep_live(seen: Seen, prefix: str = DEFAULT_PREFIX) -> Flow[Discovered]:
    """The flow: the queues seen that still hold jobs, and the topics, each sorted."""
    # A deleted queue keeps its meta hash (its seq: see the module's delete): it is a queue
    # only while its ring, its scheduled jobs or its dead letters exist.
    live = []
    for name in sorted(seen.queues):
        keys = queue_keys(name, prefix)
        if (yield ClientCall("exists", (keys.ring, keys.scheduled, keys.dead))):
            live.append(name)
    return Discovered(tuple(live), tuple(sorted(seen.topics)))


def discover(prefix: str = DEFAULT_PREFIX, count: int = DEFAULT_SCAN_COUNT) -> Flow[Discovered]:
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


def find(
    client: Any, *, prefix: str = DEFAULT_PREFIX, count: int = DEFAULT_SCAN_COUNT
) -> Discovered:
    """Every queue and topic on the server of ``client`` (a ``redis.Redis``), or on every
    primary of a cluster (a ``redis.cluster.RedisCluster``)."""
    sender = Sender(client, False, None)
    if not isinstance(client, RedisCluster):
        return sender.run(discover(prefix, count))
    primaries = client.get_primaries()  # type: ignore[no-untyped-call]
    seen = merged(_scan_primary(client, node, scan_names(prefix, count)) for node in primaries)
    return sender.run(keep_live(seen, prefix))


async def find_async(
    client: Any, *, prefix: str = DEFAULT_PREFIX, count: int = DEFAULT_SCAN_COUNT
) -> Discovered:
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
