"""The fast lane: a module call sent on a pooled connection of a ``redis.Redis`` the way its
own ``execute_command`` sends it, less the per-command work a module call does not need.

redis-py 8's ``execute_command`` records every command for its observability hooks, checks
for one special command, and packs all the arguments afresh; a one-job call spends about a
sixth of its client CPU there (about 12 µs of 46 here). The lane keeps what matters to a
caller: a connection taken from the client's pool and given back (so pool limits, fork
safety and stale-socket checks hold), the connection's own retry policy (the same
``call_with_retry``, which drops the connection after an error it retries, as redis-py 6 and
later do), and the same reply parsing and error classes. What it adds is packing: the
command's constant head (``FCALL <name> <numkeys> <keys>``) is packed once per key list, and
only the arguments that change are packed per call. A blocked claim's ``BLPOP`` and the call
after it go in one write the same way (:meth:`Lane.call_after`): about 13 µs less client CPU
a wake than redis-py's pipeline.

A client the lane cannot serve as redis-py would (a single-connection client, one whose
``execute_command`` was replaced or wrapped, as tracing tools do, redis-py's observability
turned on, or no hiredis) gets no lane: its calls go through ``execute_command`` as before.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Sequence
from typing import Any

import redis
from redis.client import NEVER_DECODE
from redis.exceptions import ResponseError

pack_command: Any
try:
    from hiredis import pack_command
except ImportError:  # (redis[hiredis] is a dependency; a bare redis install has no lane)
    pack_command = None

try:
    from redis.observability.recorder import is_enabled as _observed
except ImportError:  # redis-py before 8 records nothing

    def _observed() -> bool:
        return False


@functools.cache
def _async_recorder() -> Any:
    """redis-py's asyncio ``is_enabled`` of its observability, or None before redis-py 8,
    which records nothing (imported on first use: sync callers never load redis.asyncio)."""
    try:
        from redis.asyncio.observability.recorder import is_enabled  # noqa: PLC0415
    except ImportError:
        return None
    return is_enabled


# False: every call goes through redis-py's execute_command (for clients made after; the
# benchmark measures both ways with it).
ENABLED = True

# Module replies are read as bytes whatever a client's decode_responses says: rotator decodes
# them itself (rotator.protocol), and a payload that is not UTF-8 must reach it as it is (a
# decoding parser would raise on it, and the claim that delivered it would fail every time).
RAW: dict[str, Any] = {NEVER_DECODE: True}

# Heads packed per key list; a client's queues are few, but a bound keeps a process that
# names a new queue per call from growing without end.
MAX_HEADS = 1024


def send_undecoded(
    client: Any, verb: str, name: str, keys: Sequence[Any], args: Sequence[Any]
) -> Any:
    """``<verb> <name> <numkeys> <keys...> <args...>`` by the client's own
    ``execute_command``, its reply read undecoded (:data:`RAW`): the path of a client without
    a lane, sync or asyncio (then awaited by the caller)."""
    return client.execute_command(verb, name, len(keys), *keys, *args, **RAW)


def _unwrapped(client: Any, module: str) -> bool:
    """True when ``client``'s class sends commands with redis-py's own ``execute_command``
    (defined in ``module``): a replaced or wrapped one (a tracer's) must see every call, so it
    keeps them all."""
    method = getattr(type(client), "execute_command", None)
    return (
        type(method) is types.FunctionType
        and method.__module__ == module
        and not hasattr(method, "__wrapped__")
    )


class Lane:
    """Sends ``<verb> <name> <numkeys> <keys...> <args...>`` on ``client``'s pool."""

    def __init__(self, client: Any, verb: str, name: str) -> None:
        self.client: Any = client  # (redis-py's methods are untyped)
        self.verb, self.name = verb, name
        self._heads: dict[tuple[Any, ...], tuple[int, bytes]] = {}

    @classmethod
    def serving(cls, client: Any, verb: str, name: str) -> Lane | None:
        """A lane for ``client``, or None where it must keep redis-py's own path."""
        if (
            not ENABLED
            or pack_command is None
            or not isinstance(client, redis.Redis)
            or getattr(client, "connection", None) is not None  # single_connection_client
            or not _unwrapped(client, "redis.client")
        ):
            return None
        return cls(client, verb, name)

    def ready(self) -> bool:
        """False while redis-py's observability records commands: it must see these too."""
        return not _observed()

    def _head(self, keys: tuple[Any, ...]) -> tuple[int, bytes]:
        """The packed head for ``keys``: its argument count, and its bytes after the count."""
        head = self._heads.get(keys)
        if head is None:
            packed: bytes = pack_command((self.verb, self.name, len(keys), *keys))
            head = (3 + len(keys), packed[packed.index(b"\r\n") + 2 :])
            if len(self._heads) >= MAX_HEADS:
                self._heads.clear()
            self._heads[keys] = head
        return head

    def pack(self, keys: tuple[Any, ...], args: Sequence[Any]) -> bytes:
        """The whole command, as ``execute_command`` would pack it (hiredis's packer)."""
        count, head = self._head(keys)
        if not args:
            return b"*%d\r\n%b" % (count, head)
        tail: bytes = pack_command(tuple(args))
        return b"*%d\r\n%b%b" % (count + len(args), head, tail[tail.index(b"\r\n") + 2 :])

    def packed(self, keys: Sequence[Any], args: Sequence[Any]) -> bytes | None:
        """:meth:`pack`, or None for an argument the packer refuses (which then goes by
        redis-py's own path, to get its DataError)."""
        try:
            return self.pack(keys if type(keys) is tuple else tuple(keys), args)
        except TypeError:
            return None

    def call(self, keys: tuple[Any, ...], args: Sequence[Any]) -> Any:
        """Sends the command and returns its reply; raises what ``execute_command`` raises."""
        command = self.packed(keys, args)
        if command is None:
            return send_undecoded(self.client, self.verb, self.name, keys, args)
        pool = self.client.connection_pool
        conn = pool.get_connection()
        try:
            return conn.retry.call_with_retry(
                lambda: self._send(conn, command), lambda _error: conn.disconnect()
            )
        finally:
            pool.release(conn)

    @staticmethod
    def _send(conn: Any, command: bytes) -> Any:
        conn.send_packed_command([command])
        return conn.read_response(disable_decoding=True)

    def call_after(
        self, first: tuple[Any, ...], keys: tuple[Any, ...], args: Sequence[Any]
    ) -> list[Any] | None:
        """``first`` (a command: a blocked claim's BLPOP) and then the module call, in one write
        on one pooled connection, so the server runs the call as soon as ``first`` returns:
        both replies, an error reply as its exception, as a pipeline with
        ``raise_on_error=False`` gives them. None when an argument must go by redis-py's
        path."""
        command = self.packed(keys, args)
        if command is None:
            return None
        before: bytes = pack_command(first)
        pool = self.client.connection_pool
        conn = pool.get_connection()
        try:
            return conn.retry.call_with_retry(  # type: ignore[no-any-return]
                lambda: self._send_after(conn, before, command), lambda _error: conn.disconnect()
            )
        finally:
            pool.release(conn)

    @staticmethod
    def _send_after(conn: Any, before: bytes, command: bytes) -> list[Any]:
        conn.send_packed_command([before, command])
        replies = []
        for _ in range(2):  # (both read, whatever the first was: the connection stays in step)
            try:
                replies.append(conn.read_response(disable_decoding=True))
            except ResponseError as error:
                replies.append(error)
        return replies


class AsyncLane(Lane):
    """The lane of a ``redis.asyncio.Redis``: the same, awaited (as its ``execute_command``
    awaits the pool, the retries and the reply)."""

    @classmethod
    def serving(cls, client: Any, verb: str, name: str) -> AsyncLane | None:
        # (imported here, so that sync callers never load redis.asyncio)
        from redis.asyncio import Redis as AsyncRedis  # noqa: PLC0415

        if (
            not ENABLED
            or pack_command is None
            or not isinstance(client, AsyncRedis)
            or client.single_connection_client
            or not _unwrapped(client, "redis.asyncio.client")
        ):
            return None
        return cls(client, verb, name)

    async def ready(self) -> bool:  # type: ignore[override]
        recorder = _async_recorder()
        return recorder is None or not await recorder()

    async def call(self, keys: tuple[Any, ...], args: Sequence[Any]) -> Any:
        command = self.packed(keys, args)
        if command is None:
            return await send_undecoded(self.client, self.verb, self.name, keys, args)
        pool = self.client.connection_pool
        conn = await pool.get_connection()
        try:
            return await conn.retry.call_with_retry(
                lambda: self._send_async(conn, command), lambda _error: conn.disconnect()
            )
        finally:
            await pool.release(conn)

    @staticmethod
    async def _send_async(conn: Any, command: bytes) -> Any:
        await conn.send_packed_command([command])
        return await conn.read_response(disable_decoding=True)

    async def call_after(  # type: ignore[override]
        self, first: tuple[Any, ...], keys: tuple[Any, ...], args: Sequence[Any]
    ) -> list[Any] | None:
        command = self.packed(keys, args)
        if command is None:
            return None
        before: bytes = pack_command(first)
        pool = self.client.connection_pool
        conn = await pool.get_connection()
        try:
            return await conn.retry.call_with_retry(  # type: ignore[no-any-return]
                lambda: self._send_after_async(conn, before, command),
                lambda _error: conn.disconnect(),
            )
        finally:
            await pool.release(conn)

    @staticmethod
    async def _send_after_async(conn: Any, before: bytes, command: bytes) -> list[Any]:
        await conn.send_packed_command([before, command])
        replies = []
        for _ in range(2):
            try:
                replies.append(await conn.read_response(disable_decoding=True))
            except ResponseError as error:
                replies.append(error)
        return replies
