"""Finding every queue and topic on a server, without KEYS.

One SCAN over the keyspace, each call bounded (``COUNT`` keyspace slots, 1000 by default),
asking only for hashes whose names match ``<prefix>:{*}:*``: a queue is found by its meta
hash (``rotator:{orders}:meta``, written by its first push) and kept while its ring, its
scheduled jobs or its dead letters exist (a deleted queue keeps only its seq there), a topic
by its meta or groups hash (its first publish or subscribe). The whole scan is O(keys on the
server), like any SCAN, and sees every key that exists from its start to its end; one created
or deleted meanwhile may or may not be seen.

A standalone server (or one node) only: on Redis Cluster, run it on each primary's client.
:func:`discover` is the flow; :func:`find` runs it on a client and :func:`find_async` awaits it
on a ``redis.asyncio`` client.
"""

from __future__ import annotations

from typing import Any

from redis.cluster import RedisCluster

from rotator import protocol
from rotator.commands import ClientCall, Flow
from rotator.defaults import DEFAULT_PREFIX, DEFAULT_SCAN_COUNT
from rotator.errors import InvalidArgument
from rotator.keys import discovered, discovery_pattern, queue_keys
from rotator.models import Discovered
from rotator.sending import Sender

__all__ = ["discover", "find", "find_async"]


def discover(prefix: str = DEFAULT_PREFIX, count: int = DEFAULT_SCAN_COUNT) -> Flow[Discovered]:
    """The flow: SCAN until the cursor comes back to 0, then the names found, sorted."""
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
            break
    # A deleted queue keeps its meta hash (its seq: see the module's delete): it is a queue
    # only while its ring, its scheduled jobs or its dead letters exist.
    live = []
    for name in sorted(queues):
        keys = queue_keys(name, prefix)
        if (yield ClientCall("exists", (keys.ring, keys.scheduled, keys.dead))):
            live.append(name)
    return Discovered(tuple(live), tuple(sorted(topics)))


def _refuse_cluster() -> None:
    raise InvalidArgument(
        "finding queues needs a standalone client: on Redis Cluster, ask each primary"
        " (RedisCluster.get_redis_connection(node))"
    )


def find(
    client: Any, *, prefix: str = DEFAULT_PREFIX, count: int = DEFAULT_SCAN_COUNT
) -> Discovered:
    """Every queue and topic on the server of ``client`` (a ``redis.Redis``)."""
    if isinstance(client, RedisCluster):
        _refuse_cluster()
    return Sender(client, False, None).run(discover(prefix, count))


async def find_async(
    client: Any, *, prefix: str = DEFAULT_PREFIX, count: int = DEFAULT_SCAN_COUNT
) -> Discovered:
    """:func:`find` on a ``redis.asyncio.Redis`` client."""
    # Imported here, so that sync callers never load redis.asyncio.
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster  # noqa: PLC0415

    from rotator.aio import AsyncSender  # noqa: PLC0415

    if isinstance(client, AsyncRedisCluster):
        _refuse_cluster()
    return await AsyncSender(client, False, None).run(discover(prefix, count))
