"""A small fault-injecting TCP relay in front of a Redis/Valkey server.

It runs an asyncio loop in a thread of the test process. Each client connection gets its own
upstream connection; requests are framed (RESP arrays of bulk strings, which is all redis-py
sends), so a fault hits one whole command:

* ``drop_after``  (probability per request): forward the request, wait until its reply starts
  to arrive, then close both sides without relaying it: the command ran, the reply is lost.
* ``drop_before`` (probability per request): close both sides instead of forwarding it: the
  command never ran.
* ``blackhole``: relay nothing in either direction but keep the sockets open, so clients
  wait for their ``socket_timeout``. A connection that saw the blackhole stays silent (its
  stream may hold half a request), new connections relay again once it is lifted.

``on_request(name, connection_id)`` is called (in the proxy's thread) before each request is
forwarded, so a test can act at an exact point of a client's conversation.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

HOST = "127.0.0.1"
REPLY_WAIT = 10.0  # seconds a doomed request waits for its reply before the drop anyway
# Commands whose first argument is a subcommand worth naming ("SCRIPT LOAD", "CLIENT PAUSE").
_CONTAINERS = {b"SCRIPT", b"CLIENT", b"CONFIG", b"DEBUG", b"FUNCTION"}


@dataclass(frozen=True, slots=True)
class Mode:
    drop_after: float = 0.0
    drop_before: float = 0.0
    blackhole: bool = False


PASS = Mode()


class FramingError(Exception):
    """The client sent something that is not a RESP array of bulk strings."""


class RequestFramer:
    """Splits a client's byte stream into whole requests: ``(raw bytes, command name)``."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[bytes, str]]:
        self._buf += data
        requests = []
        while (request := self._next()) is not None:
            requests.append(request)
        return requests

    def _next(self) -> tuple[bytes, str] | None:
        buf = self._buf
        if not buf:
            return None
        if buf[:1] != b"*":
            raise FramingError(f"expected a RESP array, got {bytes(buf[:20])!r}")
        end = buf.find(b"\r\n")
        if end < 0:
            return None
        count = int(buf[1:end])
        pos = end + 2
        head: list[bytes] = []
        for _ in range(count):
            end = buf.find(b"\r\n", pos)
            if end < 0:
                return None
            if buf[pos : pos + 1] != b"$":
                raise FramingError(f"expected a bulk string, got {bytes(buf[pos : pos + 20])!r}")
            start = end + 2
            stop = start + int(buf[pos + 1 : end])
            if len(buf) < stop + 2:
                return None
            if len(head) < 2:
                head.append(bytes(buf[start:stop]).upper())
            pos = stop + 2
        raw = bytes(buf[:pos])
        del buf[:pos]
        name = head[0] if head else b""
        if name in _CONTAINERS and len(head) > 1:
            name += b" " + head[1]
        return raw, name.decode("ascii", "replace")


class _Connection:
    def __init__(self) -> None:
        self.doomed = False
        self.reply_seen = asyncio.Event()
        self.blackholed = False


class FaultProxy:
    """Relays 127.0.0.1:<port> to the server, injecting the faults of the current mode."""

    def __init__(
        self,
        upstream_port: int,
        *,
        seed: int,
        upstream_host: str = HOST,
        on_request: Callable[[str, int], None] | None = None,
    ) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.mode = PASS
        self.on_request = on_request
        self.stats: Counter[str] = Counter()
        self.port = 0
        self._rng = random.Random(seed)
        self._ids = itertools.count(1)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="faultproxy")
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> int:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        self.port = future.result(timeout=10)
        return self.port

    def set_mode(self, mode: Mode) -> None:
        self.mode = mode  # one attribute store: the relay reads it per request

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    async def _listen(self) -> int:
        self._server = await asyncio.start_server(self._serve, HOST, 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        conn_id = next(self._ids)
        self.stats["connections"] += 1
        swriter: asyncio.StreamWriter | None = None
        try:
            sreader, swriter = await asyncio.open_connection(*self.upstream)
            state = _Connection()
            up = asyncio.ensure_future(self._up(conn_id, creader, swriter, state))
            down = asyncio.ensure_future(self._down(sreader, cwriter, state))
            try:
                await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pump in (up, down):
                    pump.cancel()
                await asyncio.gather(up, down, return_exceptions=True)
        except OSError:
            self.stats["relay_errors"] += 1
        except asyncio.CancelledError:
            pass  # the proxy is stopping: end quietly (asyncio logs a cancelled handler)
        finally:
            for writer in (cwriter, swriter):
                if writer is not None:
                    with contextlib.suppress(Exception):
                        writer.close()
            self._tasks.discard(task)

    async def _up(
        self,
        conn_id: int,
        creader: asyncio.StreamReader,
        swriter: asyncio.StreamWriter,
        state: _Connection,
    ) -> None:
        framer = RequestFramer()
        while data := await creader.read(65536):
            if state.blackholed or self.mode.blackhole:
                state.blackholed = True
                self.stats["blackholed_reads"] += 1
                continue
            out = bytearray()
            try:
                requests = framer.feed(data)
            except FramingError:
                self.stats["framing_errors"] += 1
                return
            for raw, name in requests:
                self.stats["requests"] += 1
                if self.on_request is not None:
                    self.on_request(name, conn_id)
                mode = self.mode
                roll = self._rng.random()
                if roll < mode.drop_before:
                    self.stats["dropped_before"] += 1
                    self.stats[f"dropped_before:{name}"] += 1
                    swriter.write(out)
                    await swriter.drain()
                    return  # the caller closes both sides; this request never left
                out += raw
                if roll < mode.drop_before + mode.drop_after:
                    self.stats["dropped_after"] += 1
                    self.stats[f"dropped_after:{name}"] += 1
                    state.doomed = True
                    swriter.write(out)
                    await swriter.drain()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(state.reply_seen.wait(), REPLY_WAIT)
                    return  # the reply was read and thrown away: executed, reply lost
            if out:
                swriter.write(out)
                await swriter.drain()

    async def _down(
        self, sreader: asyncio.StreamReader, cwriter: asyncio.StreamWriter, state: _Connection
    ) -> None:
        while data := await sreader.read(65536):
            if state.doomed:
                self.stats["replies_dropped"] += 1
                state.reply_seen.set()
                return
            if state.blackholed or self.mode.blackhole:
                state.blackholed = True
                continue
            cwriter.write(data)
            await cwriter.drain()
