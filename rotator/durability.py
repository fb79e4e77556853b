"""Waiting for persistence or replication after a write, and server settings that lose jobs.

The Lua module cannot wait for durability itself (WAIT and WAITAOF do not block inside a
script), so the client asks after the write: ``WAITAOF`` where the server has it (Redis 7.2+,
Valkey), ``WAIT`` for replicas otherwise.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from rotator.errors import InvalidArgument, RotatorError

log = logging.getLogger("rotator")


class NotDurable(RotatorError):
    """The write was applied, but not confirmed persisted/replicated within the timeout."""


@dataclass(frozen=True, slots=True)
class Durability:
    """What a push, ack or nack must reach before the call returns.

    ``local_aof``: fsynced to the server's own append-only file (needs ``appendonly yes``).
    ``replicas``: acknowledged by (with ``local_aof``, fsynced on) this many replicas.
    """

    local_aof: bool = True
    replicas: int = 0
    timeout: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int):
            raise InvalidArgument(f"replicas must be a whole number, got {self.replicas!r}")
        if self.replicas < 0 or not (self.local_aof or self.replicas):
            raise InvalidArgument("ask for local_aof, or for at least one replica")
        if not math.isfinite(self.timeout) or self.timeout <= 0:
            raise InvalidArgument(f"timeout must be positive and finite, got {self.timeout!r}")


_warned_no_waitaof: set[int] = set()


def wait_durable(client: Any, durability: Durability) -> None:
    """Blocks until the connection's earlier writes reach what ``durability`` asks for."""
    timeout_ms = max(1, int(durability.timeout * 1000))
    numlocal = 1 if durability.local_aof else 0
    try:
        local, replicas = (
            int(n)
            for n in client.execute_command("WAITAOF", numlocal, durability.replicas, timeout_ms)
        )
    except ResponseError as error:
        if "unknown command" not in str(error).lower():
            raise NotDurable(str(error)) from error
        # Redis before 7.2: replicas can still be waited for; the local fsync cannot.
        if durability.local_aof and id(client) not in _warned_no_waitaof:
            _warned_no_waitaof.add(id(client))
            log.warning(
                "this server has no WAITAOF (Redis < 7.2): local durability relies on its "
                "appendfsync setting; use 'appendfsync always' to lose nothing on a crash"
            )
        local = numlocal
        replicas = (
            int(client.execute_command("WAIT", durability.replicas, timeout_ms))
            if (durability.replicas)
            else 0
        )
    if local < numlocal or replicas < durability.replicas:
        raise NotDurable(
            f"write confirmed on {local} local AOF and {replicas} replicas within "
            f"{durability.timeout:g} s; asked for {numlocal} and {durability.replicas}"
        )


def server_warnings(client: Any) -> list[str]:
    """Settings of the server that can lose queued jobs, in words an operator can act on."""
    warnings = []
    memory = client.info("memory")
    policy = str(memory.get("maxmemory_policy", "noeviction"))
    if policy != "noeviction":
        warnings.append(
            f"maxmemory-policy is {policy}: the server may evict a queue's keys and lose jobs; "
            "set it to noeviction"
        )
    persistence = client.info("persistence")
    if not int(persistence.get("aof_enabled", 0)):
        warnings.append(
            "appendonly is off: a server crash loses everything since the last snapshot; "
            "set appendonly yes"
        )
    return warnings
