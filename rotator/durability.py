"""Waiting for persistence or replication after a write, and server settings that lose jobs.

The Lua module cannot wait for durability itself (WAIT and WAITAOF do not block inside a
script), so the client asks after the write: ``WAITAOF`` where the server has it (Redis 7.2+,
Valkey), ``WAIT`` for replicas otherwise. Both are flows (see :mod:`rotator.commands`), so the
sync and async APIs share them.
"""

from __future__ import annotations

import logging
from typing import Any

from redis.exceptions import ResponseError

from rotator.commands import ClientCall, Flow
from rotator.errors import NotDurable
from rotator.models import Durability

log = logging.getLogger("rotator")

_warned_no_waitaof = False


def wait_command(durability: Durability, waitaof: bool) -> tuple[Any, ...] | None:
    """The command that waits for what ``durability`` asks, sent on the connection that made
    the writes: ``WAITAOF`` where the server has it (``waitaof``), else ``WAIT`` for the
    replicas, or None when there is nothing a server without WAITAOF can wait for."""
    if waitaof:
        return waitaof_command(durability)
    if durability.local_aof:
        _warn_no_waitaof()
    if not durability.replicas:
        return None
    return ("WAIT", durability.replicas, max(1, int(durability.timeout * 1000)))


def waitaof_command(durability: Durability) -> tuple[Any, ...]:
    numlocal = 1 if durability.local_aof else 0
    return ("WAITAOF", numlocal, durability.replicas, max(1, int(durability.timeout * 1000)))


def check_waited(durability: Durability, waitaof: bool, reply: Any) -> None:
    """Raises NotDurable unless ``reply`` (of :func:`wait_command`'s command; None when there
    was none; an error reply as an exception) confirms what ``durability`` asks."""
    if isinstance(reply, Exception):
        raise NotDurable(str(reply)) from reply
    numlocal = 1 if durability.local_aof else 0
    if waitaof:
        local, replicas = (int(n) for n in reply)
    else:
        # Redis before 7.2: replicas can be waited for; the local fsync cannot.
        local, replicas = numlocal, 0 if reply is None else int(reply)
    if local < numlocal or replicas < durability.replicas:
        raise NotDurable(
            f"write confirmed on {local} local AOF and {replicas} replicas within "
            f"{durability.timeout:g} s; asked for {numlocal} and {durability.replicas}"
        )


def no_waitaof(error: ResponseError) -> bool:
    """True when ``error`` says the server has no WAITAOF (Redis before 7.2)."""
    return "unknown command" in str(error).lower()


def _warn_no_waitaof() -> None:
    global _warned_no_waitaof
    if not _warned_no_waitaof:
        _warned_no_waitaof = True
        log.warning(
            "this server has no WAITAOF (Redis < 7.2): local durability relies on its "
            "appendfsync setting; use 'appendfsync always' to lose nothing on a crash"
        )


def wait_durable(durability: Durability) -> Flow[None]:
    """Blocks until the connection's earlier writes reach what ``durability`` asks for."""
    waitaof = True
    try:
        reply = yield ClientCall("execute_command", waitaof_command(durability))
    except ResponseError as error:
        if not no_waitaof(error):
            raise NotDurable(str(error)) from error
        waitaof = False
        command = wait_command(durability, waitaof)
        reply = None if command is None else (yield ClientCall("execute_command", command))
    check_waited(durability, waitaof, reply)


def server_warnings() -> Flow[list[str]]:
    """Settings of the server that can lose queued jobs, in words an operator can act on."""
    warnings = []
    memory: Any = yield ClientCall("info", ("memory",))
    policy = str(memory.get("maxmemory_policy", "noeviction"))
    if policy != "noeviction":
        warnings.append(
            f"maxmemory-policy is {policy}: the server may evict a queue's keys and lose jobs; "
            "set it to noeviction"
        )
    persistence: Any = yield ClientCall("info", ("persistence",))
    if not int(persistence.get("aof_enabled", 0)):
        warnings.append(
            "appendonly is off: a server crash loses everything since the last snapshot; "
            "set appendonly yes"
        )
    return warnings
