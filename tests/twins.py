"""Sync scenarios through the async API: :class:`Blocking` drives an async twin (an
AsyncRotator) from plain code, each awaited method run to its end on a private event loop in
a thread of its own (so calls from several threads, such as a push from a timer while a
consumer blocks, run at once as tasks). Fixtures hand it out in place of a Rotator, so one
scenario checks both APIs."""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import redis.asyncio as aredis

from rotator.aio import AsyncRotator

T = TypeVar("T")


class Blocking:
    """An async twin whose awaitable methods block until done; everything else passes
    through unchanged (attributes such as ``keys``, ``name``, ``timeout``)."""

    def __init__(self, make: Callable[[aredis.Redis], AsyncRotator], url: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._client = aredis.Redis.from_url(url)
        self.twin = make(self._client)

    def _wait(self, awaitable: Awaitable[T]) -> T:
        async def run() -> T:
            return await awaitable

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result()

    def __getattr__(self, name: str) -> Any:
        member = getattr(self.twin, name)
        if name == "claim":
            return self._claim
        if inspect.iscoroutinefunction(member):
            return lambda *args, **kwargs: self._wait(member(*args, **kwargs))
        return member

    @contextmanager
    def _claim(self, block: float | None = None) -> Iterator[Any]:
        manager = self.twin.claim(block)
        job = self._wait(manager.__aenter__())
        try:
            yield job
        except BaseException as error:
            if not self._wait(manager.__aexit__(type(error), error, error.__traceback__)):
                raise
        else:
            self._wait(manager.__aexit__(None, None, None))

    def close(self) -> None:
        self._wait(self._client.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
