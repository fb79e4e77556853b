"""Senders: the only place a flow's requests meet a client. :class:`Sender` runs them on a
``redis.Redis`` (or ``RedisCluster``); its twin :class:`rotator.aio.AsyncSender` awaits them
on ``redis.asyncio``.
Everything else about an operation (its arguments, its calls, its retries and loops) is
written once, as a flow (see :mod:`rotator.commands` and :mod:`rotator.flows`).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from functools import cached_property
from typing import Any, TypeVar

import redis
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from rotator.commands import AfterWake, Ask, ClientCall, Flow, ModuleCall, Request, Together
from rotator.durability import (
    NewSlotMap,
    NodeCall,
    check_durability,
    durable_flow,
    waitaof_memo,
)
from rotator.lane import RAW
from rotator.models import Durability
from rotator.script import (
    module_caller,
    module_command,
    not_loaded,
    pipeline_reply,
    pipelined_caller,
    run,
)

T = TypeVar("T")
R = TypeVar("R")


def drive(flow: Generator[R, Any, T], perform: Callable[[R], Any]) -> T:
    """Drives ``flow`` to its end, each request it yields answered by ``perform`` (or the
    error that raised thrown in); its result, or the error it raised."""
    try:
        request = next(flow)
        while True:
            try:
                reply = perform(request)
            except Exception as error:
                request = flow.throw(error)
            else:
                request = flow.send(reply)
    except StopIteration as stop:
        result: T = stop.value
        return result


def node_pipeline(client: Any, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    """Runs :class:`rotator.durability.NodeCall` ``commands`` in one pipeline on a
    ``redis.Redis`` (so on one of its connections, in one round trip): their replies, error
    replies as exceptions (a connection error is raised)."""
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command, **RAW)
    return list(pipe.execute(raise_on_error=False))


def refresh_slot_map(cluster: Any, request: NewSlotMap) -> None:
    """Does what :class:`rotator.durability.NewSlotMap` asks of a sync ``RedisCluster``."""
    manager = cluster.nodes_manager
    try:
        if request.moved is not None:
            manager.move_slot(request.moved)
        else:
            manager.initialize()
    except (RedisError, RedisClusterException):
        pass  # the next try meets whatever is wrong, and raises or retries it


def socket_timeout(client: Any) -> float | None:
    """The socket timeout of ``client``'s connections (None: none), which bounds a BLPOP."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        return cluster_socket_timeout(client)
    limit = pool.connection_kwargs.get("socket_timeout")
    if limit is None and "socket_timeout" not in pool.connection_kwargs:
        limit = _default_socket_timeout(pool.connection_class, pool.connection_kwargs)
    return float(limit) if limit else None


# A connection class's own socket timeout, by class: redis-py 8 leaves a URL client's
# default out of the pool's kwargs, and making a connection to read it costs milliseconds
# (redis-py looks its own version up), so each class is asked once per process.
_DEFAULT_SOCKET_TIMEOUTS: dict[type, Any] = {}


def _default_socket_timeout(connection_class: type, kwargs: dict[str, Any]) -> Any:
    if connection_class not in _DEFAULT_SOCKET_TIMEOUTS:
        try:  # (made as the pool makes them; nothing connects here)
            limit = connection_class(**kwargs).socket_timeout
        except (AttributeError, TypeError):
            limit = None
        _DEFAULT_SOCKET_TIMEOUTS[connection_class] = limit
    return _DEFAULT_SOCKET_TIMEOUTS[connection_class]


def cluster_socket_timeout(client: Any) -> float | None:
    """The socket timeout a cluster client's connections have (None: none): a sync
    ``RedisCluster`` keeps them in its nodes manager, an asyncio one on itself."""
    manager = getattr(client, "nodes_manager", None)
    kwargs = getattr(manager, "connection_kwargs", None) or getattr(
        client, "connection_kwargs", None
    )
    limit = kwargs.get("socket_timeout") if isinstance(kwargs, dict) else None
    return float(limit) if limit else None


def blpop_command(wake: str, seconds: float) -> tuple[str, str, str]:
    """The BLPOP of a blocked claim, as a lane sends it before the call."""
    return ("BLPOP", wake, repr(seconds))


def wake_wait(seconds: float, socket_timeout: float | None) -> float:
    """Seconds to block on the wake list: within the socket timeout, never BLPOP's 0
    ("forever")."""
    if socket_timeout is not None:
        seconds = min(seconds, max(socket_timeout - 0.1, 0.01))
    return max(seconds, 0.001)


# In place of the replies of a pipeline that failed as a whole.
UNSENT = object()


def together_reply(sender: Any, call: ModuleCall[T], reply: object) -> T:
    """The decoded ``reply`` to ``call`` in a pipeline; an error (or no reply) makes the call
    again through ``sender.perform``, which raises, loads or retries as for one call."""
    if reply is UNSENT or isinstance(reply, Exception):
        result: T = sender.perform(call)
        return result
    return call.decode(reply)


class Sender:
    """Runs flows on a synchronous client. ``functions``: call the module with FCALL of the
    library (True), EVALSHA (False), or the faster one the server allows (None).
    ``durability``: each module call whose writes the caller relies on goes with a wait until
    they are persisted or replicated as it asks (see :meth:`durable_call`)."""

    def __init__(self, client: Any, functions: bool | None, durability: Durability | None) -> None:
        self.client = client
        self.script: Any = module_caller(client, functions)
        self.durability = (
            None if durability is None else check_durability(durability, self._socket_timeout)
        )
        self._pipelines = isinstance(client, redis.Redis)  # a cluster client: no pipelined wake
        self._cluster = client if isinstance(client, RedisCluster) else None
        # Which of the client's servers have WAITAOF (learned by durable_flow).
        self.waitaof: dict[str, bool] = {} if durability is None else waitaof_memo(client)

    @cached_property
    def _socket_timeout(self) -> float | None:
        """Asked on first use (a block or a durability check), not when the client is made:
        reading a URL client's default makes a connection object, which costs milliseconds."""
        return socket_timeout(self.client)

    def run(self, flow: Flow[T]) -> T:
        """Drives ``flow`` to its end; its result, or the error it raised."""
        return drive(flow, self.perform)

    def perform(self, request: Request) -> Any:
        if type(request) is ModuleCall:
            if request.durable and self.durability is not None:
                return self.durable_call(request, self.durability)
            return request.decode(run(self.script, request.keys, request.args))
        if type(request) is AfterWake:
            return self._after_wake(request)
        if type(request) is ClientCall:
            return getattr(self.client, request.method)(*request.args)
        if type(request) is Ask:
            return request.callback(request.job_id)
        if type(request) is Together:
            return self._together(request)
        raise TypeError(f"not a request: {request!r}")

    def _together(self, request: Together) -> list[Any]:
        """``request``'s calls in one pipeline; each that failed in it made on its own."""
        calls = request.calls
        if len(calls) < 2 or self.durability is not None:  # a wait goes with each call
            return [self.perform(call) for call in calls]
        pipe: Any = self.client.pipeline(transaction=False)
        for call in calls:
            pipe.execute_command(*module_command(self.script, call.keys, call.args), **RAW)
        try:
            replies = pipe.execute(raise_on_error=False)
        except Exception:  # e.g. a node lost: which calls ran is unknown, and none matters
            replies = [UNSENT] * len(calls)
        return [
            together_reply(self, call, reply) for call, reply in zip(calls, replies, strict=True)
        ]

    def durable_call(self, call: ModuleCall[T], durability: Durability) -> T:
        """``call`` and a wait for its writes to reach what ``durability`` asks, in one
        pipeline on one connection (:func:`rotator.durability.durable_flow`): the server
        counts the writes of the connection that asks. On a cluster client, a connection of
        the slot's master's own client."""
        flow = durable_flow(call, self.script, durability, self.waitaof, self._cluster)
        return drive(flow, self._on_node)

    def _on_node(self, request: NodeCall | NewSlotMap) -> Any:
        if isinstance(request, NodeCall):
            node = request.node
            client = self.client if node is None else self.client.get_redis_connection(node)
            return node_pipeline(client, request.commands)
        refresh_slot_map(self.client, request)
        return None

    def _after_wake(self, request: AfterWake[Any]) -> Any:
        """Blocks on the wake list, then calls the module, in one round trip: the server runs
        the pipelined call as soon as BLPOP returns (woken by a push, or timed out)."""
        wait = wake_wait(request.seconds, self._socket_timeout)
        call = request.call
        if not self._pipelines or (call.durable and self.durability is not None):
            # (a durable call goes with its own wait: after the BLPOP, not pipelined with it)
            self.client.blpop([request.wake], timeout=wait)
            return self.perform(call)
        lane = getattr(pipelined_caller(self.script), "lane", None)
        replies = None
        if lane is not None and lane.ready():
            replies = lane.call_after(blpop_command(request.wake, wait), call.keys, call.args)
        if replies is None:
            pipe: Any = self.client.pipeline(transaction=False)
            pipe.blpop([request.wake], timeout=wait)
            pipe.execute_command(*module_command(self.script, call.keys, call.args), **RAW)
            replies = pipe.execute(raise_on_error=False)
        woken, reply = replies
        if isinstance(woken, Exception):
            raise woken
        if not_loaded(reply):
            return self.perform(call)
        return call.decode(pipeline_reply(reply))
