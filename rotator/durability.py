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


def wait_durable(durability: Durability) -> Flow[None]:
    """Blocks until the connection's earlier writes reach what ``durability`` asks for."""
    global _warned_no_waitaof
    timeout_ms = max(1, int(durability.timeout * 1000))
    numlocal = 1 if durability.local_aof else 0
    try:
        reply = yield ClientCall(
            "execute_command", ("WAITAOF", numlocal, durability.replicas, timeout_ms)
        )
        local, replicas = (int(n) for n in reply)
    except ResponseError as error:
        if "unknown command" not in str(error).lower():
            raise NotDurable(str(error)) from error
        # Redis before 7.2: replicas can still be waited for; the local fsync cannot.
        if durability.local_aof and not _warned_no_waitaof:
            _warned_no_waitaof = True
            log.warning(
                "this server has no WAITAOF (Redis < 7.2): local durability relies on its "
                "appendfsync setting; use 'appendfsync always' to lose nothing on a crash"
            )
        local = numlocal
        replicas = 0
        if durability.replicas:
            waited = yield ClientCall("execute_command", ("WAIT", durability.replicas, timeout_ms))
            replicas = int(waited)
    if local < numlocal or replicas < durability.replicas:
        raise NotDurable(
            f"write confirmed on {local} local AOF and {replicas} replicas within "
            f"{durability.timeout:g} s; asked for {numlocal} and {durability.replicas}"
        )


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
