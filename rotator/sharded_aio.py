"""AsyncShardedRotator: the asyncio twin of :class:`rotator.sharded.ShardedRotator`, on
``redis.asyncio.cluster.RedisCluster``.

Each method awaits the same flow (:class:`rotator.sharded.ShardedFlows`) its sync twin runs,
through :class:`rotator.aio.AsyncRetryingSender`: the same bounded retries
(:class:`rotator.retries.Tries`), paused with ``asyncio.sleep``. So the two cannot drift: same
layout, routing, wake-ups and retries, same methods, arguments and results (a test compares
them). See the sync classes and :mod:`rotator.sharded` for the semantics.

One difference: a constructor cannot await, so a queue opened with its stored shard count
is opened by ``await AsyncShardedRotator.open(cluster, name)`` (``shards=None``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, cast

from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry

from rotator import registry
from rotator.aio import AsyncIdempotency, AsyncRetryingSender
from rotator.defaults import (
    DEFAULT_BUDGET,
    DEFAULT_LEASE_TIMEOUT,
    DEFAULT_POLL,
    DEFAULT_PREFIX,
    DEFAULT_PUSH_CHUNK,
    DEFAULT_WORK_BATCH,
    MAX_BATCH,
)
from rotator.errors import InvalidArgument
from rotator.models import (
    AsyncHandler,
    DeadLetter,
    Durability,
    Durations,
    Job,
    QueueSettings,
    Stats,
    WorkSummary,
)
from rotator.protocol import JobRef, When
from rotator.registry import WorkerInfo
from rotator.retries import DEFAULT_RETRY_FOR, bounded_options, check_retry_for
from rotator.sharded import ShardedView, stored_count
from rotator.urls import check_not_sentinel

if TYPE_CHECKING:
    from rotator.aio import AsyncRotator


def async_cluster_client(url: str, **options: Any) -> RedisCluster:
    """A redis.asyncio RedisCluster for ``url`` made for :class:`AsyncShardedRotator`: the
    settings of :func:`rotator.sharded.cluster_client` (redis-py's retries off, socket
    timeouts set). The caller closes it (``await client.aclose()``)."""
    check_not_sentinel(url, "a Redis Cluster")
    return RedisCluster.from_url(url, **bounded_options(options, Retry))


class AsyncShardedRotator(ShardedView):
    """The asyncio twin of :class:`rotator.sharded.ShardedRotator`; see it for the semantics.

    Give a client made by :func:`async_cluster_client` (``from_url`` does). ``shards`` must
    be a count here: ``await AsyncShardedRotator.open(cluster, name)`` opens a queue with
    its stored count. ``idempotency`` may be a plain function or a coroutine function.
    ``durability``: as on ShardedRotator, each durable call and its wait go in one
    pipeline on one connection of the shard's master (a ``redis.asyncio`` ClusterNode's).
    """

    def __init__(
        self,
        cluster: RedisCluster,
        name: str,
        *,
        shards: int | None,
        timeout: float = DEFAULT_LEASE_TIMEOUT,
        idempotency: AsyncIdempotency | None = None,
        max_deliveries: int | None = None,
        budget: int = DEFAULT_BUDGET,
        prefix: str = DEFAULT_PREFIX,
        functions: bool | None = False,
        retry_for: float = DEFAULT_RETRY_FOR,
        durability: Durability | None = None,
    ) -> None:
        if shards is None:
            raise InvalidArgument(
                "a constructor cannot read the stored shard count: "
                "await AsyncShardedRotator.open(cluster, name) does"
            )
        self.retry_for = check_retry_for(retry_for)
        self._sender = AsyncRetryingSender(cluster, functions, self.retry_for, durability)
        self.durability = self._sender.durability
        self._run = self._sender.run
        self._lay_out(
            cluster,
            name,
            shards,
            self.retry_for,
            timeout=timeout,
            idempotency=idempotency,
            max_deliveries=max_deliveries,
            budget=budget,
            prefix=prefix,
        )

    @classmethod
    async def open(
        cls, cluster: RedisCluster, name: str, *, shards: int | None = None, **options: Any
    ) -> AsyncShardedRotator:
        """The queue ``name``, opened with its stored shard count (``shards=None``: raises
        ShardsMismatch when it has none) or with ``shards`` (checked at its first call)."""
        if shards is None:
            retry_for = check_retry_for(options.get("retry_for", DEFAULT_RETRY_FOR))
            sender = AsyncRetryingSender(cluster, False, retry_for)
            shards = await sender.run(stored_count(name, options.get("prefix", DEFAULT_PREFIX)))
        return cls(cluster, name, shards=shards, **options)

    @classmethod
    def from_url(
        cls, url: str, name: str, *, shards: int | None, **options: Any
    ) -> AsyncShardedRotator:
        """An AsyncShardedRotator on a new :func:`async_cluster_client` for any node's
        ``url`` (close it with ``await queue.client.aclose()``)."""
        return cls(async_cluster_client(url), name, shards=shards, **options)

    # -- what it is ------------------------------------------------------------------------

    async def placement(self) -> list[str]:
        """Each shard's master now, ``host:port``, shard 0 first (it moves with resharding)."""
        await self.client.initialize()  # the slot map: read at the client's first command
        return self._flows.placement(self.client)

    def shard(self, k: int) -> AsyncRotator:
        """Shard ``k`` as an ordinary :class:`rotator.aio.AsyncRotator` (to inspect or drain
        it; push through the sharded queue, so that ids keep to their shards)."""
        from rotator.aio import AsyncRotator  # noqa: PLC0415 (only for this view)

        return AsyncRotator(self.client, **self._flows.shard_options(k))

    async def server_warnings(self) -> list[str]:
        return await self._run(self._flows.server_warnings())

    # -- producing -------------------------------------------------------------------------

    async def push(
        self,
        *ids: str | int,
        delay: float | None = None,
        at: When | None = None,
        unique: bool = False,
        priority: int = 0,
    ) -> int:
        return await self.push_many(ids, delay=delay, at=at, unique=unique, priority=priority)

    async def push_many(
        self,
        ids: Iterable[str | int],
        chunk: int = DEFAULT_PUSH_CHUNK,
        *,
        delay: float | None = None,
        at: When | None = None,
        unique: bool = False,
        priority: int = 0,
    ) -> int:
        return await self._run(
            self._flows.push_many(ids, chunk, delay=delay, at=at, unique=unique, priority=priority)
        )

    async def cancel(self, *ids: str | int) -> int:
        return await self._run(self._flows.cancel(ids))

    async def keep_schedules(self) -> int:
        """Sharded queues have no schedules: 0 (for the worker loops)."""
        return 0

    async def durations(self, *seconds: float) -> Durations:
        return await self._run(self._flows.durations(seconds))

    async def pause(self) -> bool:
        return await self._run(self._flows.pause())

    async def resume(self) -> bool:
        return await self._run(self._flows.resume())

    # -- consuming -------------------------------------------------------------------------

    async def next(
        self,
        count: int = 1,
        block: float | None = None,
        *,
        ack: Iterable[JobRef] = (),
        durations: Iterable[float] = (),
    ) -> list[Job]:
        """As :meth:`rotator.sharded.ShardedRotator.next`: with ``block``, the task waits on
        the wake list (a BLPOP on a connection of its own), never polling."""
        return await self._run(self._flows.next(count, block, ack, durations))

    async def ack(self, *jobs: JobRef) -> int:
        return await self._run(self._flows.ack(jobs))

    async def nack(self, *jobs: JobRef, delay: float = 0.0) -> int:
        return await self._run(self._flows.nack(jobs, delay))

    async def fail(self, *jobs: JobRef, error: str, delay: float = 0.0) -> int:
        return await self._run(self._flows.fail(jobs, error, delay))

    async def bury(self, *jobs: JobRef, error: str = "") -> int:
        return await self._run(self._flows.bury(jobs, error))

    async def extend(self, job: JobRef, seconds: float | None = None) -> float:
        return await self._run(self._flows.extend(job, seconds))

    async def extend_many(self, jobs: Iterable[JobRef], seconds: float | None = None) -> list[bool]:
        return await self._run(self._flows.extend_many(jobs, seconds))

    @asynccontextmanager
    async def claim(self, block: float | None = None) -> AsyncIterator[Job | None]:
        """As :meth:`rotator.aio.AsyncRotator.claim`."""
        jobs = await self.next(1, block)
        if not jobs:
            yield None
            return
        job = jobs[0]
        try:
            yield job
        except BaseException:
            await self.nack(job)
            raise
        await self.ack(job)

    async def work(
        self,
        handler: AsyncHandler,
        *,
        concurrency: int = 1,
        stop_when_empty: bool = False,
        batch: int = DEFAULT_WORK_BATCH,
        poll: float = DEFAULT_POLL,
        install_signal_handlers: bool = True,
    ) -> WorkSummary:
        """:meth:`rotator.aio.AsyncRotator.work` over the sharded queue: the same worker."""
        from rotator.worker import AsyncWorker  # noqa: PLC0415 (the worker builds on this API)

        # The worker uses only what an AsyncShardedRotator shares with an AsyncRotator.
        worker = AsyncWorker(
            cast("AsyncRotator", self), handler, concurrency=concurrency, batch=batch, poll=poll
        )
        return await worker.run(
            stop_when_empty=stop_when_empty, install_signal_handlers=install_signal_handlers
        )

    # -- inspecting ------------------------------------------------------------------------

    async def configure(
        self,
        *,
        fence_window: float | None = None,
        fence_max: int | None = None,
        dead_max: int | None = None,
        dead_max_age: float | None = None,
        track_ids: bool | None = None,
    ) -> QueueSettings:
        return await self._run(
            self._flows.configure(fence_window, fence_max, dead_max, dead_max_age, track_ids)
        )

    async def exists(self) -> bool:
        return await self._run(self._flows.exists())

    async def delete(self, *, forget: bool = False) -> bool:
        return await self._run(self._flows.delete(forget))

    async def sweep(self) -> int:
        return await self._run(self._flows.sweep())

    async def drained(self) -> bool:
        return await self._run(self._flows.drained())

    async def stats(self) -> Stats:
        return (await self._run(self._flows.stats()))[0]

    async def shard_stats(self) -> list[Stats]:
        return (await self._run(self._flows.stats()))[1]

    async def dead(self, start: int = 0, limit: int = 100) -> list[DeadLetter]:
        return await self._run(self._flows.dead(start, limit))

    async def requeue_dead(self, *ids: str | int, count: int = MAX_BATCH) -> int:
        return await self._run(self._flows.requeue_dead(ids, count))

    # -- workers (rotator.registry): one registry for the whole queue ------------------------

    async def workers(self, *, include_stale: bool = False) -> list[WorkerInfo]:
        return await self._run(registry.read(self.keys.workers, include_stale))

    async def report_worker(self, info: WorkerInfo) -> None:
        await self._run(registry.report(self.keys.workers, info))

    async def forget_worker(self, worker_id: str) -> bool:
        return await self._run(registry.forget(self.keys.workers, worker_id))


__all__ = ["AsyncShardedRotator", "async_cluster_client"]
