"""AsyncRotator: the Rotator API on ``redis.asyncio``, sharing the pure helpers of
:mod:`rotator.protocol`. Each method is one or a few calls of the same Lua module."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import redis.asyncio as aredis
from redis.asyncio.cluster import RedisCluster

from rotator import protocol
from rotator.core import QueueRequests, blpop_wait, check_block, chunks
from rotator.defaults import (
    DEFAULT_BUDGET,
    DEFAULT_LEASE_TIMEOUT,
    DEFAULT_PREFIX,
    DEFAULT_PUSH_CHUNK,
    MAX_BATCH,
    MAX_COUNT,
)
from rotator.errors import InvalidArgument, LeaseLost
from rotator.keys import queue_keys
from rotator.models import DeadLetter, ItemStats, Job, NextReply, RingEntry, Stats
from rotator.protocol import JobRef
from rotator.script import (
    async_module_caller,
    module_command,
    not_loaded,
    pipeline_reply,
    run_async,
)
from rotator.worker import retry_delay

AsyncClient = aredis.Redis | RedisCluster
AsyncIdempotency = Callable[[str], bool | Awaitable[bool]]


class AsyncRotator(QueueRequests):
    """The asyncio twin of :class:`rotator.Rotator`; see it for the semantics.

    ``idempotency`` may be a plain function or a coroutine function.
    """

    _drop_payloads = True  # as Rotator._drop_payloads

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
        functions: bool = False,
        payloads: bool = False,
        item_stats: bool = False,
    ) -> None:
        self.client = client
        self.payloads = payloads
        self._item_stats = item_stats
        self._extended = payloads or item_stats
        self.name = name
        self.keys = queue_keys(name, prefix)
        self.timeout = timeout
        self.idempotency = idempotency
        self._lease_ms = protocol.seconds_to_ms(timeout, "timeout")
        self._max_deliveries = protocol.check_max_deliveries(max_deliveries)
        self._budget = protocol.check_budget(budget)
        self._script: Any = async_module_caller(client, functions)
        self._batches = protocol.Batches()

    @classmethod
    def from_url(
        cls, url: str, name: str, *, cluster: bool = False, **options: Any
    ) -> AsyncRotator:
        client: AsyncClient = RedisCluster.from_url(url) if cluster else aredis.Redis.from_url(url)
        return cls(client, name, **options)

    async def _call(self, *args: Any) -> Any:
        return await run_async(self._script, self.keys.all, list(args))

    async def _call_payloads(self, *args: Any) -> Any:
        keys = self.keys.with_items if self._item_stats else self.keys.with_payloads
        return await run_async(self._script, keys, list(args))

    async def push_payloads(
        self, items: Mapping[Any, bytes | str], chunk: int = DEFAULT_PUSH_CHUNK
    ) -> int:
        """As :meth:`rotator.Rotator.push_payloads`."""
        if not self.payloads:
            raise InvalidArgument("push_payloads needs an AsyncRotator made with payloads=True")
        pairs = [(protocol.encode_id(k), protocol.encode_payload(v)) for k, v in items.items()]
        size = protocol.whole(chunk, "chunk", 1, MAX_BATCH // 2)
        pushed = 0
        for start in range(0, len(pairs), size):
            flat = [part for pair in pairs[start : start + size] for part in pair]
            pushed += int(await self._call_payloads(b"pushp", *flat))
        return pushed

    async def _next_call(self, count: int, acks: list[bytes], wake_wait: float | None) -> NextReply:
        """As Rotator._next_call."""
        keys, args, decode = self._next_request(count, acks)
        if wake_wait is None:
            return decode(await run_async(self._script, keys, args))
        return decode(await self._after_wake(wake_wait, keys, args))

    async def _after_wake(self, wait: float, keys: tuple[str, ...], args: list[Any]) -> Any:
        """As Rotator._after_wake."""
        if not isinstance(self.client, aredis.Redis):
            await self.client.blpop([self.keys.wake], timeout=wait)
            return await run_async(self._script, keys, args)
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.blpop([self.keys.wake], timeout=wait)
            pipe.execute_command(*module_command(self._script, keys, args))
            woken, reply = await pipe.execute(raise_on_error=False)
        if isinstance(woken, Exception):
            raise woken
        if not_loaded(reply):
            return await run_async(self._script, keys, args)
        return pipeline_reply(reply)

    async def push(self, *ids: str | int) -> int:
        return await self.push_many(ids)

    async def push_many(self, ids: Iterable[str | int], chunk: int = DEFAULT_PUSH_CHUNK) -> int:
        raw = protocol.encode_ids(ids)
        size = protocol.whole(chunk, "chunk", 1, MAX_BATCH)
        total = 0
        for part in chunks(raw, size):
            if self._item_stats:
                total += int(await self._call_payloads(b"pushi", *part))
            else:
                total += int(await self._call(b"push", *part))
        return total

    async def next(
        self, count: int = 1, block: float | None = None, *, ack: Iterable[JobRef] = ()
    ) -> list[Job]:
        count = protocol.check_count(count)
        refs = list(ack)
        acks, packed, _ = self._pack(refs)
        waited = check_block(block)
        give_up = None if waited is None else time.monotonic() + waited
        wake_wait: float | None = None
        while True:
            reply = await self._next_call(count, acks, wake_wait)
            wake_wait = None
            if packed and reply.acked < len(acks):
                await self._ack_refs(refs, pack=False)  # a batch ack was refused
            self._batches.note(reply)
            jobs, acks = await self._screen(reply.jobs)
            packed = False
            if jobs:
                if acks:
                    await self.ack(*acks)
                return jobs
            if acks or not reply.idle:
                continue
            if give_up is None:
                return []
            remaining = give_up - time.monotonic()
            if remaining <= 0:
                return []
            wake_wait = blpop_wait(self.client, remaining, reply.wait_ms)

    async def _screen(self, jobs: list[Job]) -> tuple[list[Job], list[bytes]]:
        if self.idempotency is None:
            return jobs, []
        keep: list[Job] = []
        finished: list[bytes] = []
        for job in jobs:
            done = False
            if job.reclaimed:
                answer = self.idempotency(job.id)
                done = bool(await answer) if inspect.isawaitable(answer) else bool(answer)
            if done:
                finished.append(protocol.encode_token(job))
            else:
                keep.append(job)
        return keep, finished

    async def ack(self, *jobs: JobRef) -> int:
        return await self._ack_refs(jobs, pack=True)

    async def _ack_refs(self, refs: Sequence[JobRef], *, pack: bool) -> int:
        if pack:
            args, packed, named = self._pack(refs)
        else:
            args, packed, named = protocol.encode_tokens(refs), False, 0
        total = 0
        drop = self._extended and self._drop_payloads
        for part in chunks(args, MAX_BATCH):
            if drop:
                total += int(await self._call_payloads(b"ackp", *part))
            else:
                total += int(await self._call(b"ack", *part))
        if not packed:
            return total
        if total < len(args):
            return await self._ack_refs(refs, pack=False)  # a batch ack was refused
        return named

    async def nack(self, *jobs: JobRef, delay: float = 0.0) -> int:
        delay_ms = protocol.seconds_to_ms(delay, "delay", allow_zero=True)
        total = 0
        for part in chunks(protocol.encode_tokens(jobs), MAX_BATCH):
            total += sum(int(flag) for flag in await self._call(b"nack", delay_ms, *part))
        return total

    async def fail(self, *jobs: JobRef, error: str, delay: float = 0.0) -> int:
        """As :meth:`rotator.Rotator.fail`."""
        if not self._item_stats:
            return await self.nack(*jobs, delay=delay)
        delay_ms = protocol.seconds_to_ms(delay, "delay", allow_zero=True)
        message = protocol.encode_error(error)
        total = 0
        for part in chunks(protocol.encode_tokens(jobs), MAX_BATCH):
            flags = await self._call_payloads(b"nackp", delay_ms, message, *part)
            total += sum(int(flag) for flag in flags)
        return total

    async def item_stats(self, *ids: str | int) -> list[ItemStats | None]:
        """As :meth:`rotator.Rotator.item_stats`."""
        if not self._item_stats:
            raise InvalidArgument("item_stats needs an AsyncRotator made with item_stats=True")
        found: list[ItemStats | None] = []
        for part in chunks(protocol.encode_ids(ids), MAX_BATCH):
            raw = await self._call_payloads(b"items", *part)
            found += [protocol.decode_item_stats(value) for value in raw]
        return found

    async def extend(self, job: JobRef, seconds: float | None = None) -> float:
        (kept,), deadline = await self._extend([job], seconds)
        if not kept:
            raise LeaseLost(f"lease {protocol.encode_token(job).decode(errors='replace')} was lost")
        return deadline

    async def extend_many(self, jobs: Iterable[JobRef], seconds: float | None = None) -> list[bool]:
        return (await self._extend(list(jobs), seconds))[0]

    async def _extend(self, jobs: list[JobRef], seconds: float | None) -> tuple[list[bool], float]:
        lease_ms = self._lease_ms if seconds is None else protocol.seconds_to_ms(seconds, "seconds")
        tokens = protocol.encode_tokens(jobs)
        flags: list[bool] = []
        deadline_ms = 0
        for part in chunks(tokens, MAX_BATCH):
            reply = await self._call(b"extend", lease_ms, *part)
            deadline_ms = int(reply[0])
            flags.extend(int(flag) == 1 for flag in reply[1:])
        return flags, deadline_ms / 1000

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
        handler: Callable[[Job], Awaitable[Any]],
        *,
        concurrency: int = 1,
        stop_when_empty: bool = False,
        poll: float = 1.0,
    ) -> int:
        """Runs ``await handler(job)`` in ``concurrency`` tasks; returns jobs processed.

        Failures are nacked with exponential backoff. Cancel the task to stop: jobs in hand
        are given back.
        """
        protocol.whole(concurrency, "concurrency", 1, 10_000)
        processed = 0

        async def loop() -> None:
            nonlocal processed
            finished: list[Job] = []
            try:
                while True:
                    jobs = await self.next(1, block=poll, ack=finished)
                    finished = []
                    if not jobs:
                        if stop_when_empty and await self._drained():
                            return
                        continue
                    job = jobs[0]
                    try:
                        await self._run_with_heartbeat(handler, job)
                    except asyncio.CancelledError:
                        await self.nack(job)
                        raise
                    except Exception:
                        await self.nack(job, delay=retry_delay(job.deliveries))
                        continue
                    finished.append(job)
                    processed += 1
            finally:
                if finished:
                    await self.ack(*finished)

        await asyncio.gather(*(loop() for _ in range(concurrency)))
        return processed

    async def _run_with_heartbeat(self, handler: Callable[[Job], Awaitable[Any]], job: Job) -> None:
        task = asyncio.ensure_future(handler(job))
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=self.timeout / 2)
                if done:
                    task.result()
                    return
                await self.extend_many([job])
        finally:
            if not task.done():
                task.cancel()

    async def _drained(self) -> bool:
        stats = await self.stats()
        return stats.pending == 0 and stats.in_flight == 0 and stats.deferred == 0

    async def stats(self) -> Stats:
        return protocol.decode_stats(await self._call(b"stats"))

    async def peek(self, limit: int = 20) -> list[RingEntry]:
        return protocol.decode_peek(await self._call(b"peek", protocol.check_count(limit)))

    async def dead(self, start: int = 0, limit: int = 100) -> list[DeadLetter]:
        start = protocol.whole(start, "start", 0, 10**15)
        limit = protocol.whole(limit, "limit", 1, MAX_COUNT)
        raw = await self._call(b"dead", start, limit)
        return [protocol.decode_dead_letter(letter) for letter in raw]

    async def requeue_dead(self, *ids: str | int, count: int = MAX_BATCH) -> int:
        raw = protocol.encode_ids(ids)
        count = protocol.whole(count, "count", 1, MAX_BATCH)
        if len(raw) > MAX_BATCH:
            raise InvalidArgument(f"at most {MAX_BATCH} ids per call")
        return int(await self._call(b"requeue_dead", count, *raw))
