"""The asyncio twins of :class:`rotator.Rotator`, :class:`rotator.Topic` and
:class:`rotator.TopicGroup`, on ``redis.asyncio``.

Each method awaits the same flow (:mod:`rotator.flows`) its sync twin runs, so the two APIs
cannot drift: same methods, same arguments, same results (a test compares them). See the
sync classes for the semantics.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Generator,
    Iterable,
    Mapping,
    Sequence,
)
from contextlib import asynccontextmanager
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

import redis.asyncio as aredis
from redis.asyncio.cluster import PipelineCommand, RedisCluster
from redis.asyncio.retry import Retry
from redis.exceptions import ConnectionError, RedisClusterException, RedisError, TimeoutError

from rotator import commands, protocol, registry
from rotator.commands import AfterWake, Ask, ClientCall, Flow, ModuleCall, Request, Together
from rotator.defaults import (
    DEFAULT_BUDGET,
    DEFAULT_LEASE_TIMEOUT,
    DEFAULT_POLL,
    DEFAULT_PREFIX,
    DEFAULT_PUSH_CHUNK,
    DEFAULT_WORK_BATCH,
    MAX_BATCH,
    MAX_PUBLISH,
)
from rotator.durability import (
    NewSlotMap,
    NodeCall,
    check_durability,
    durable_flow,
    waitaof_memo,
)
from rotator.flows import GroupView, QueueFlows, QueueView, TopicFlows, TopicView
from rotator.keys import TopicKeys, validate_group_name
from rotator.lane import RAW
from rotator.models import (
    AsyncHandler,
    DeadLetter,
    Durability,
    Durations,
    ItemStats,
    Job,
    QueueSettings,
    Retention,
    RingEntry,
    Schedule,
    Stats,
    TopicStats,
    WorkSummary,
)
from rotator.protocol import JobRef, When
from rotator.registry import WorkerInfo
from rotator.retries import Tries, bounded_options, check_retry_for, push_marker_ttl_ms
from rotator.script import (
    async_module_caller,
    module_command,
    not_loaded,
    pipeline_reply,
    pipelined_caller,
    run_async,
)
from rotator.sending import UNSENT, blpop_command, socket_timeout, wake_wait
from rotator.urls import async_client_from_url

if TYPE_CHECKING:
    from rotator.buffering import AsyncConsumer, AsyncProducer

AsyncClient = aredis.Redis | RedisCluster
AsyncIdempotency = Callable[[str], bool | Awaitable[bool]]
T = TypeVar("T")
R = TypeVar("R")


async def drive_async(flow: Generator[R, Any, T], perform: Callable[[R], Awaitable[Any]]) -> T:
    """The asyncio twin of :func:`rotator.sending.drive`: each request awaited."""
    try:
        request = next(flow)
        while True:
            try:
                reply = await perform(request)
            except Exception as error:
                request = flow.throw(error)
            else:
                request = flow.send(reply)
    except StopIteration as stop:
        result: T = stop.value
        return result


async def client_pipeline(client: aredis.Redis, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    """As :func:`rotator.sending.node_pipeline`, on a ``redis.asyncio.Redis``."""
    async with client.pipeline(transaction=False) as pipe:
        for command in commands:
            pipe.execute_command(*command, **RAW)
        return list(await pipe.execute(raise_on_error=False))


async def node_pipeline(node: Any, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    """As :func:`rotator.sending.node_pipeline`, on one connection of a
    ``redis.asyncio`` ClusterNode. Its pipeline keeps a connection error as the reply of
    the command it met (and of those after it): raised here, as the sync client raises
    it."""
    stack = [PipelineCommand(i, *command, **RAW) for i, command in enumerate(commands)]
    await node.execute_pipeline(stack)
    replies = [command.result for command in stack]
    for reply in replies:
        if isinstance(reply, ConnectionError | TimeoutError):
            raise reply
    return replies


class AsyncSender:
    """The asyncio twin of :class:`rotator.sending.Sender`."""

    def __init__(self, client: Any, functions: bool | None, durability: Durability | None) -> None:
        self.client = client
        self.script: Any = async_module_caller(client, functions)
        self.durability = (
            None if durability is None else check_durability(durability, self._socket_timeout)
        )
        self._pipelines = isinstance(client, aredis.Redis)
        self._cluster = client if isinstance(client, RedisCluster) else None
        self.waitaof: dict[str, bool] = {} if durability is None else waitaof_memo(client)

    @cached_property
    def _socket_timeout(self) -> float | None:
        """Asked on first use (a block or a durability check), not when the client is made:
        reading a URL client's default makes a connection object, which costs milliseconds."""
        return socket_timeout(self.client)

    async def run(self, flow: Flow[T]) -> T:
        return await drive_async(flow, self.perform)

    async def perform(self, request: Request) -> Any:
        if type(request) is ModuleCall:
            if request.durable and self.durability is not None:
                return await self.durable_call(request, self.durability)
            return request.decode(await run_async(self.script, request.keys, request.args))
        if type(request) is AfterWake:
            return await self._after_wake(request)
        if type(request) is ClientCall:
            return await getattr(self.client, request.method)(*request.args)
        if type(request) is Ask:
            answer = request.callback(request.job_id)
            return await answer if inspect.isawaitable(answer) else answer
        if type(request) is Together:
            return await self._together(request)
        raise TypeError(f"not a request: {request!r}")

    async def _together(self, request: Together) -> list[Any]:
        """As :meth:`rotator.sending.Sender._together`."""
        calls = request.calls
        if len(calls) < 2 or self.durability is not None:
            return [await self.perform(call) for call in calls]
        replies: list[Any]
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                for call in calls:
                    pipe.execute_command(*module_command(self.script, call.keys, call.args), **RAW)
                replies = await pipe.execute(raise_on_error=False)
        except Exception:  # which calls ran is unknown, and none matters
            replies = [UNSENT] * len(calls)
        return [
            await self.perform(call)
            if reply is UNSENT or isinstance(reply, Exception)
            else call.decode(reply)
            for call, reply in zip(calls, replies, strict=True)
        ]

    async def durable_call(self, call: ModuleCall[T], durability: Durability) -> T:
        """As :meth:`rotator.sending.Sender.durable_call`: the call and its wait in one
        pipeline on one connection."""
        if self._cluster is not None:
            await self._cluster.initialize()  # the slot map (read at a client's first command)
        flow = durable_flow(call, self.script, durability, self.waitaof, self._cluster)
        return await drive_async(flow, self._on_node)

    async def _on_node(self, request: NodeCall | NewSlotMap) -> Any:
        if isinstance(request, NodeCall):
            if request.node is None:
                return await client_pipeline(self.client, request.commands)
            return await node_pipeline(request.node, request.commands)
        manager = self.client.nodes_manager
        try:
            if request.moved is not None:
                await manager.move_slot(request.moved)
            else:
                await manager.initialize()
        except (RedisError, RedisClusterException):
            pass  # the next try meets whatever is wrong, and raises or retries it
        return None

    async def _after_wake(self, request: AfterWake[Any]) -> Any:
        wait = wake_wait(request.seconds, self._socket_timeout)
        call = request.call
        if not self._pipelines or (call.durable and self.durability is not None):
            await self.client.blpop([request.wake], timeout=wait)
            return await self.perform(call)
        lane = getattr(pipelined_caller(self.script), "lane", None)
        replies = None
        if lane is not None and await lane.ready():
            first = blpop_command(request.wake, wait)
            replies = await lane.call_after(first, call.keys, call.args)
        if replies is None:
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.blpop([request.wake], timeout=wait)
                pipe.execute_command(*module_command(self.script, call.keys, call.args), **RAW)
                replies = await pipe.execute(raise_on_error=False)
        woken, reply = replies
        if isinstance(woken, Exception):
            raise woken
        if not_loaded(reply):
            return await self.perform(call)
        return call.decode(pipeline_reply(reply))


def async_sender(
    client: Any, functions: bool | None, retry_for: float, durability: Durability | None = None
) -> AsyncSender:
    """The asyncio twin of :func:`rotator.retries.sender`."""
    if retry_for:
        return AsyncRetryingSender(client, functions, retry_for, durability)
    return AsyncSender(client, functions, durability)


class AsyncRetryingSender(AsyncSender):
    """The asyncio twin of :class:`rotator.retries.RetryingSender`: each request is retried
    as :class:`rotator.retries.Tries` says, for at most ``retry_for`` seconds."""

    def __init__(
        self,
        client: Any,
        functions: bool | None,
        retry_for: float,
        durability: Durability | None = None,
    ) -> None:
        super().__init__(client, functions, durability)
        self.retry_for = retry_for

    async def perform(self, request: Request) -> Any:
        if type(request) is Together:  # each call it makes again is retried on its own
            return await super().perform(request)
        tries = Tries(self.client, request, self.retry_for)
        while True:
            try:
                return await super().perform(request)
            except Exception as error:
                pause = tries.pause_after(error)
                if pause is None:
                    raise
                await asyncio.sleep(pause)


class AsyncRotator(QueueView):
    """The asyncio twin of :class:`rotator.Rotator`; see it for the semantics.

    ``idempotency`` may be a plain function or a coroutine function.
    """

    def __init__(
        self,
        client: AsyncClient,
        name: str,
        *,
        timeout: float = DEFAULT_LEASE_TIMEOUT,
        idempotency: AsyncIdempotency | None = None,
        max_deliveries: int | None = None,
        budget: int = DEFAULT_BUDGET,
        prefix: str = DEFAULT_PREFIX,
        durability: Durability | None = None,
        functions: bool | None = None,
        payloads: bool = False,
        item_stats: bool = False,
        retry_for: float = 0.0,
    ) -> None:
        self.client = client
        self.durability = durability
        self.retry_for = check_retry_for(retry_for)
        self._flows: QueueFlows = self._make_flows(
            name,
            timeout=timeout,
            idempotency=idempotency,
            max_deliveries=max_deliveries,
            budget=budget,
            prefix=prefix,
            payloads=payloads,
            item_stats=item_stats,
            push_marker_ttl_ms=push_marker_ttl_ms(self.retry_for),
        )
        self._sender = async_sender(client, functions, self.retry_for, durability)
        self._run = self._sender.run

    @classmethod
    def from_url(
        cls, url: str, name: str, *, cluster: bool = False, **options: Any
    ) -> AsyncRotator:
        """As :meth:`rotator.Rotator.from_url`; ``cluster=True`` makes the client with
        :func:`rotator.sharded_aio.async_cluster_client` (redis-py's retries off, socket
        timeouts set), and so does a ``retry_for`` in ``options``."""
        if not cluster:
            retry_for = check_retry_for(options.get("retry_for", 0.0))
            bounded = bounded_options({}, Retry) if retry_for else {}
            return cls(async_client_from_url(url, **bounded), name, **options)
        # (sharded_aio builds on this module: imported when called)
        from rotator.sharded_aio import async_cluster_client  # noqa: PLC0415

        return cls(async_cluster_client(url), name, **options)

    @classmethod
    def embedded(cls, name: str, *, data_dir: str | None = None, **options: Any) -> AsyncRotator:
        """As :meth:`rotator.Rotator.embedded` (the server is started synchronously)."""
        from rotator.server import EmbeddedServer  # noqa: PLC0415 (the API does not need it)

        server = EmbeddedServer(data_dir)
        server.start()
        return cls(aredis.Redis(unix_socket_path=str(server.socket)), name, **options)

    async def _call(self, *args: Any) -> Any:
        return await self._sender.perform(commands.raw(self.keys.all, args))

    async def server_warnings(self) -> list[str]:
        return await self._run(self._flows.server_warnings())

    async def push(
        self,
        *ids: str | int,
        delay: float | None = None,
        at: When | None = None,
        unique: bool = False,
        priority: int = 0,
    ) -> int:
        due = protocol.check_due(delay, at)
        level = protocol.check_priority(priority)
        return await self._run(self._flows.push_many(ids, DEFAULT_PUSH_CHUNK, due, unique, level))

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
        due = protocol.check_due(delay, at)
        level = protocol.check_priority(priority)
        return await self._run(self._flows.push_many(ids, chunk, due, unique, level))

    async def push_payloads(
        self,
        items: Mapping[Any, bytes | str],
        chunk: int = DEFAULT_PUSH_CHUNK,
        *,
        delay: float | None = None,
        at: When | None = None,
        unique: bool = False,
    ) -> int:
        due = protocol.check_due(delay, at)
        return await self._run(self._flows.push_payloads(items, chunk, due, unique))

    async def cancel(self, *ids: str | int) -> int:
        return await self._run(self._flows.cancel(ids))

    async def schedule(
        self,
        name: str,
        *,
        every: float | None = None,
        cron: str | None = None,
        job_id: str | int | None = None,
        tz: str | None = None,
    ) -> bool:
        return await self._run(self._flows.schedule(name, every, cron, job_id, tz))

    async def schedules(self) -> list[Schedule]:
        return await self._run(self._flows.schedules())

    async def unschedule(self, name: str) -> bool:
        return await self._run(self._flows.unschedule(name))

    async def keep_schedules(self) -> int:
        return await self._run(self._flows.keep_schedules())

    async def set_rate_limit(self, jobs: int | None, per: float = 1.0) -> None:
        await self._run(self._flows.set_rate_limit(jobs, per))

    async def durations(self, *seconds: float) -> Durations:
        return await self._run(self._flows.durations(seconds))

    async def pause(self) -> bool:
        return await self._run(self._flows.pause())

    async def resume(self) -> bool:
        return await self._run(self._flows.resume())

    async def next(
        self,
        count: int = 1,
        block: float | None = None,
        *,
        ack: Iterable[JobRef] = (),
        durations: Iterable[float] = (),
    ) -> list[Job]:
        return await self._run(self._flows.next(count, block, ack, durations))

    async def ack(self, *jobs: JobRef) -> int:
        return await self._run(self._flows.ack_refs(jobs, pack=True))

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
        """Runs ``await handler(job)`` in ``concurrency`` tasks; see
        :meth:`rotator.Rotator.work`. Cancelling the task gives back the jobs in hand."""
        from rotator.worker import AsyncWorker  # noqa: PLC0415 (the worker builds on this API)

        worker = AsyncWorker(self, handler, concurrency=concurrency, batch=batch, poll=poll)
        return await worker.run(
            stop_when_empty=stop_when_empty, install_signal_handlers=install_signal_handlers
        )

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

    async def item_stats(self, *ids: str | int) -> list[ItemStats | None]:
        return await self._run(self._flows.item_stats_of(ids))

    async def stats(self) -> Stats:
        return await self._run(self._flows.stats())

    async def peek(self, limit: int = 20) -> list[RingEntry]:
        return await self._run(self._flows.peek(limit))

    async def dead(self, start: int = 0, limit: int = 100) -> list[DeadLetter]:
        return await self._run(self._flows.dead(start, limit))

    async def requeue_dead(self, *ids: str | int, count: int = MAX_BATCH) -> int:
        return await self._run(self._flows.requeue_dead(ids, count))

    async def workers(self, *, include_stale: bool = False) -> list[WorkerInfo]:
        return await self._run(registry.read(self.keys.workers, include_stale))

    async def report_worker(self, info: WorkerInfo) -> None:
        await self._run(registry.report(self.keys.workers, info))

    async def forget_worker(self, worker_id: str) -> bool:
        return await self._run(registry.forget(self.keys.workers, worker_id))

    def producer(self, *, max_batch: int = 500, max_delay: float = 0.05) -> AsyncProducer:
        """``async with aq.producer() as p: await p.push(job_id)``; the background flush is a
        task. See :class:`rotator.buffering.AsyncProducer`."""
        from rotator.buffering import AsyncProducer  # noqa: PLC0415 (built on this API)

        return AsyncProducer(self, max_batch=max_batch, max_delay=max_delay)

    def consumer(
        self, *, prefetch: int = 100, block: float = 1.0, stop_when_empty: bool = False
    ) -> AsyncConsumer:
        """``async with aq.consumer() as c: async for job in c: ...; await c.ack(job)``. See
        :class:`rotator.buffering.AsyncConsumer`."""
        from rotator.buffering import AsyncConsumer  # noqa: PLC0415 (built on this API)

        return AsyncConsumer(self, prefetch=prefetch, block=block, stop_when_empty=stop_when_empty)


class AsyncTopicGroup(GroupView, AsyncRotator):
    """The asyncio twin of :class:`rotator.TopicGroup`."""

    def __init__(self, client: AsyncClient, topic: TopicKeys, group: str, **options: Any) -> None:
        self.group = group
        self._topic = topic
        super().__init__(client, topic.name, **options)


class AsyncTopic(TopicView):
    """The asyncio twin of :class:`rotator.Topic`; see it for the semantics."""

    def __init__(
        self,
        client: AsyncClient,
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
        self._sender = async_sender(client, functions, self.retry_for)
        self._run = self._sender.run

    async def _call(self, keys: tuple[str, ...], *args: Any) -> Any:
        return await self._sender.perform(commands.raw(keys, args))

    async def exists(self) -> bool:
        return await self._run(self._flows.exists())

    async def groups(self) -> list[str]:
        return await self._run(self._flows.groups())

    async def subscribe(self, group: str, start: str = "latest") -> bool:
        return await self._run(self._flows.subscribe(group, start))

    async def unsubscribe(self, group: str) -> bool:
        return await self._run(self._flows.unsubscribe(group))

    def group(self, group: str, **options: Any) -> AsyncTopicGroup:
        validate_group_name(group)
        options.setdefault("retry_for", self.retry_for)
        return AsyncTopicGroup(self.client, self.keys, group, functions=self._functions, **options)

    async def publish(self, payload: bytes | str) -> str:
        return (await self._run(self._flows.publish_many([payload], MAX_PUBLISH)))[0]

    async def publish_many(
        self, payloads: Iterable[bytes | str], chunk: int = MAX_PUBLISH
    ) -> list[str]:
        return await self._run(self._flows.publish_many(payloads, chunk))

    async def replay(
        self, group: str, *, from_id: str | None = None, from_time: float | None = None
    ) -> int:
        return await self._run(self._flows.replay(group, from_id, from_time))

    async def trim(self) -> int:
        return await self._run(self._flows.trim())

    async def expired(self, group: str) -> int:
        return await self._run(self._flows.expired(group))

    async def stats(self) -> TopicStats:
        return await self._run(self._flows.stats())

    async def delete(self) -> None:
        await self._run(self._flows.delete())
