"""Waiting for persistence or replication after a write, and server settings that lose jobs.

The Lua module cannot wait for durability itself (WAIT and WAITAOF do not block inside a
script), so the client asks after the write: ``WAITAOF`` where the server has it (Redis 7.2+,
Valkey), ``WAIT`` for replicas otherwise. Both count only the writes of the connection they
arrive on, and have no key. So a durable module call and its wait go together, in one
pipeline on one connection (:func:`durable_flow`): a wait sent as a command of its own can
go out on another pooled connection of a client that threads or tasks share, and "confirm"
that connection's writes (none, say) at once; and a cluster client sends a keyless WAIT to
a node of its choosing (redis-py 8.1: its default node), on a connection that made none of
the writes. The flow yields node pipelines, so the sync and async senders (and the sharded
ones) all drive it.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Generator
from typing import Any, NamedTuple, TypeVar

from redis.exceptions import (
    AskError,
    ClusterDownError,
    ConnectionError,
    MovedError,
    ReadOnlyError,
    ResponseError,
    TimeoutError,
)

from rotator.commands import ClientCall, Flow, ModuleCall
from rotator.errors import DurabilityUnavailable, InvalidArgument, NotDurable
from rotator.models import Durability
from rotator.script import (
    AutoCall,
    FunctionCall,
    library_source,
    module_command,
    module_source,
    not_loaded,
    pipeline_reply,
)

log = logging.getLogger("rotator")

T = TypeVar("T")

_warned_no_waitaof = False

# Per client: which of its servers have WAITAOF, by node name ("" for a plain client's one
# server); learned once (see durable_flow), forgotten with the client.
_WAITAOF: weakref.WeakKeyDictionary[Any, dict[str, bool]] = weakref.WeakKeyDictionary()


def check_durability(durability: object, socket_timeout: float | None) -> Durability | None:
    """``durability`` for a client whose connections time out after ``socket_timeout``
    seconds: the wait goes in one pipeline with the write, so it must give up before its
    connection does (a timed-out pipeline may be sent again, write and all)."""
    if durability is None:
        return None
    if not isinstance(durability, Durability):
        raise InvalidArgument(f"durability must be a Durability, got {durability!r}")
    if socket_timeout is not None and durability.timeout >= socket_timeout:
        raise InvalidArgument(
            f"durability timeout {durability.timeout:g} s must be shorter than the "
            f"client's socket timeout {socket_timeout:g} s"
        )
    return durability


def waitaof_memo(client: Any) -> dict[str, bool]:
    """Whether ``client``'s servers have WAITAOF, by node name: one dict per client, so
    every queue on a client probes each server once."""
    memo = _WAITAOF.get(client)
    if memo is None:
        memo = _WAITAOF.setdefault(client, {})
    return memo


def wait_commands(durability: Durability, waitaof: bool) -> list[tuple[Any, ...]]:
    """The commands that wait for what ``durability`` asks, sent on the connection that made
    the writes; the last one's reply says whether it was had. With ``local_aof``:
    ``WAITAOF`` where the server has it (``waitaof``), which waits for the local fsync and
    for ``replicas`` replicas to fsync theirs. Otherwise (or on a server without WAITAOF)
    ``WAIT`` for ``replicas`` replicas to acknowledge the writes; nothing when there are no
    replicas to wait for.

    A WAITAOF that waits for replicas goes after a WAIT for them. A replica answers the
    master's request for its offsets as it reads the writes, before its AOF's fsync of
    them, and otherwise reports that fsync once a second: a WAITAOF alone took a second on
    Redis 8.2 and Valkey 8.1, appendfsync always on both. The WAIT's answer comes after the
    replica's fsync (with appendfsync always), so the WAITAOF's own request then finds it:
    under a millisecond (``python -m bench.durability``). The WAIT's answer is not read;
    the two share the timeout, the WAITAOF keeping three quarters of it (the local fsync of
    appendfsync everysec takes up to a second)."""
    timeout_ms = max(2, int(durability.timeout * 1000))
    if durability.local_aof:
        if waitaof:
            if not durability.replicas:
                return [("WAITAOF", 1, 0, timeout_ms)]
            nudge_ms = max(1, timeout_ms // 4)
            return [
                ("WAIT", durability.replicas, nudge_ms),
                ("WAITAOF", 1, durability.replicas, timeout_ms - nudge_ms),
            ]
        _warn_no_waitaof()
    if not durability.replicas:
        return []
    return [("WAIT", durability.replicas, timeout_ms)]


def check_waited(durability: Durability, command: tuple[Any, ...] | None, reply: Any) -> None:
    """Raises NotDurable unless ``reply`` (to ``command``, the last of :func:`wait_commands`;
    None when there was none; an error reply as an exception) confirms what ``durability``
    asks."""
    if isinstance(reply, Exception):
        raise NotDurable(str(reply)) from reply
    numlocal = 1 if durability.local_aof else 0
    if command is not None and command[0] == "WAITAOF":
        local, replicas = (int(n) for n in reply)
    else:
        # No WAITAOF (Redis before 7.2): replicas can be waited for; the local fsync cannot.
        local, replicas = numlocal, 0 if reply is None else int(reply)
    if local < numlocal or replicas < durability.replicas:
        raise NotDurable(
            f"write confirmed on {local} local AOF and {replicas} replicas within "
            f"{durability.timeout:g} s; asked for {numlocal} and {durability.replicas}"
        )


def no_waitaof(error: ResponseError) -> bool:
    """True when ``error`` says the server has no WAITAOF (Redis before 7.2)."""
    return "unknown command" in str(error).lower()


def aof_disabled(error: ResponseError) -> bool:
    """True when ``error`` is WAITAOF's refusal to wait for the local AOF of a server whose
    appendonly is off (Redis 7.2+, Valkey)."""
    return "appendonly is disabled" in str(error)


def local_aof_unavailable(name: str, error: ResponseError) -> DurabilityUnavailable:
    server = f"the server {name}" if name else "the server"
    return DurabilityUnavailable(
        f"durability asks for the local AOF (local_aof=True, the default), but {server} has "
        "appendonly off, so nothing was written: turn appendonly on, or pass "
        f"Durability(local_aof=False, replicas=N) to wait for N replicas only ({error})"
    )


def _warn_no_waitaof() -> None:
    global _warned_no_waitaof
    if not _warned_no_waitaof:
        _warned_no_waitaof = True
        log.warning(
            "this server has no WAITAOF (Redis < 7.2): local durability relies on its "
            "appendfsync setting; use 'appendfsync always' to lose nothing on a crash"
        )


# -- a durable call and its wait, on one connection --------------------------------------------


class NodeCall(NamedTuple):
    """Send ``commands`` in one pipeline, so on one connection, to ``node``: a cluster
    client's node (its redis-py ClusterNode), or None for a plain client's server. The
    reply is their replies in order, error replies as exceptions; a connection error is
    raised."""

    node: Any
    commands: list[tuple[Any, ...]]


class NewSlotMap(NamedTuple):
    """Refresh the cluster client's slot map: from ``moved`` (a MOVED reply), else by
    asking the cluster (after the node refused the call or could not be reached)."""

    moved: MovedError | None = None


NodeFlow = Generator[NodeCall | NewSlotMap, Any, T]


def durable_flow(
    call: ModuleCall[T],
    caller: Any,
    durability: Durability,
    waitaof: dict[str, bool],
    cluster: Any = None,
) -> NodeFlow[T]:
    """One durable module call: the call and its WAITAOF (or WAIT) in one pipeline on one
    connection, so the wait counts this call's writes (see :func:`wait_commands` for which
    wait). ``caller`` is the sender's module caller (the call goes as it would call),
    ``waitaof`` the client's :func:`waitaof_memo`, ``cluster`` the cluster client (None: a
    plain client).

    On a cluster the pair goes to the master that owns the call's slot, on that node's own
    connection, so the redirections the cluster client would follow are followed here:
    MOVED once (the slot map refreshed, the pair sent to the new owner), ASK once (ASKING
    and the pair on the node it names). TRYAGAIN, CLUSTERDOWN, READONLY, a second
    redirection and connection errors are raised (the slot map refreshed first where they
    say it is stale), for the caller to retry or not (a sharded queue's bounded retries
    decide as for any call). A not-loaded reply (NOSCRIPT, or FCALL's "function not
    found"; nothing ran) sends the pair again with EVAL of the source, after loading the
    library in FCALL mode, for the next calls. With ``local_aof``, whether the server has
    WAITAOF (Redis 7.2+, Valkey) is learned once per server with ``WAITAOF 1 0 1``, which
    returns within a millisecond, and which such a server refuses where its appendonly is
    off: then DurabilityUnavailable is raised, before anything is written (and the server is
    asked again at the next call, which finds appendonly turned on).

    Returns the call's decoded reply; raises NotDurable when the wait did not confirm
    what ``durability`` asks within its timeout: the write was applied, but is not
    confirmed (it is not sent again).
    """
    if isinstance(caller, AutoCall):
        caller = caller.current()  # as a pipelined call goes (EVALSHA until a mode is chosen)
    key = call.keys[0]
    node = None if cluster is None else cluster.get_node_from_key(key)
    command = tuple(module_command(caller, call.keys, call.args))
    asking = asked = moved = False
    try:
        for _ in range(4):  # at most: a MOVED and an ASK followed, a NOSCRIPT answered
            name = "" if node is None else str(node.name)
            if durability.local_aof and name not in waitaof:
                (probe,) = yield NodeCall(node, [("WAITAOF", 1, 0, 1)])
                if isinstance(probe, ResponseError) and aof_disabled(probe):
                    raise local_aof_unavailable(name, probe)
                waitaof[name] = not (isinstance(probe, ResponseError) and no_waitaof(probe))
            waits = wait_commands(durability, waitaof.get(name, False))
            sent = [("ASKING",)] * asking + [command, *waits]
            replies = yield NodeCall(node, sent)
            reply, waited = replies[asking], (replies[-1] if waits else None)
            if cluster is not None and type(reply) is AskError and not asked:
                target = cluster.get_node(host=reply.host, port=reply.port)
                if target is not None:
                    node, asking, asked = target, True, True
                    continue
            if cluster is not None and type(reply) is MovedError and not moved:
                yield NewSlotMap(reply)
                node, asking, moved = cluster.get_node_from_key(key), False, True
                continue
            if not_loaded(reply) and command[0] != "EVAL":
                if isinstance(caller, FunctionCall):  # load the library for the next calls
                    yield NodeCall(node, [("FUNCTION", "LOAD", "REPLACE", library_source())])
                command = ("EVAL", module_source(), *command[2:])
                continue
            break
    except (ConnectionError, TimeoutError):
        if cluster is not None:
            yield NewSlotMap()  # the node may be gone: its slots are served elsewhere soon
        raise
    if cluster is not None and isinstance(reply, MovedError | ReadOnlyError | ClusterDownError):
        # A slot moved again, a demoted master, or a cluster failing over.
        yield NewSlotMap(reply if isinstance(reply, MovedError) else None)
    decoded = call.decode(pipeline_reply(reply))
    if isinstance(waited, ResponseError) and no_waitaof(waited):
        waitaof[name] = False  # a server replaced by an older one: WAIT next time
    check_waited(durability, waits[-1] if waits else None, waited)
    return decoded


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
