"""The Lua module: its source, its SHA, and calling it with typed errors.

Two ways to call the same module. FCALL (``functions=True``): the module is loaded once as a
function library, which the server persists and replicates, and each call skips re-defining
the module's functions. EVALSHA (``functions=False``): redis-py's Script reloads the source
and retries once when the server answers NOSCRIPT (after SCRIPT FLUSH, a restart or a
failover). Either way a "not loaded" reply means nothing ran, so the one retry cannot apply a
command twice.

By FCALL, the commands that only read (:func:`reads_only`) go by FCALL_RO to the library's
read-only function (registered ``no-writes``): a server runs it out of memory under
``noeviction`` and on a read-only replica, where it refuses FCALL of a function that may
write, so ``stats`` and the other reads answer there as they do by EVALSHA.

The default (``functions=None``) is the faster mode the server allows: FCALL, unless the
server has no functions (Redis before 7) or the ACL refuses ``FCALL``, ``FCALL_RO`` or, when
the library is missing, ``FUNCTION LOAD``; then EVALSHA. It is chosen at the first call on a
client and remembered for that client (:func:`chosen_mode`). A refusal of FCALL itself means
nothing ran, so falling back cannot apply a command twice.
"""

from __future__ import annotations

import contextlib
import hashlib
import weakref
from collections.abc import Sequence
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from redis.cluster import RedisCluster
from redis.exceptions import (
    ClusterDownError,
    ConnectionError,
    NoPermissionError,
    NoScriptError,
    ReadOnlyError,
    RedisClusterException,
    ResponseError,
    SlotNotCoveredError,
    TimeoutError,
)

from rotator.errors import NO_FUNCTIONS, error_from_reply
from rotator.lane import RAW, AsyncLane, Lane, send_undecoded

_PACKAGED = ("lua", "rotator.lua")  # where the wheel carries the module
_SOURCE_TREE = Path(__file__).resolve().parent.parent / "lua" / "rotator.lua"


@cache
def module_path() -> Path:
    """Path of ``rotator.lua``: inside the installed package, or the source tree's ``lua/``."""
    packaged = resources.files("rotator").joinpath(*_PACKAGED)
    if packaged.is_file():
        return Path(str(packaged))
    return _SOURCE_TREE


@cache
def module_source() -> str:
    return module_path().read_text(encoding="utf-8")


def module_sha() -> str:
    """The SHA1 that ``SCRIPT LOAD`` returns for the module."""
    return hashlib.sha1(module_source().encode("utf-8")).hexdigest()


def function_name() -> str:
    """The library and function name: versioned, so two rotator versions can share a server."""
    return f"rotator_{module_sha()[:16]}"


# The commands the module's read-only function runs (its READS); durations only without counts
# to add, when it reads the histogram.
READ_COMMANDS = frozenset(
    (b"stats", b"peek", b"scan", b"dead", b"schedules", b"items", b"tstats", b"durations")
)


def reads_only(args: Sequence[Any]) -> bool:
    """True for a module call (its ARGV) that only reads: FCALL_RO's."""
    if not args:
        return False
    command = args[0]
    if isinstance(command, str):
        command = command.encode()
    return command in READ_COMMANDS and (command != b"durations" or len(args) == 1)


def library_source() -> str:
    """The module as a function library: a shebang naming it, and the name it registers."""
    name = function_name()
    return f"#!lua name={name}\nlocal FUNCTION_NAME = '{name}'\n{module_source()}"


class FunctionCall:
    """Calls the module with FCALL, loading the library when the server does not have it.
    On a plain ``redis.Redis``, through the fast lane (:mod:`rotator.lane`)."""

    LANE: type[Lane] = Lane

    def __init__(self, client: Any) -> None:
        self.client = client
        self.name = function_name()
        self.lane: Any = self.LANE.serving(client, "FCALL", self.name)

    @property
    def read_name(self) -> str:
        """The library's read-only function, registered beside the module's."""
        return f"{self.name}_ro"

    def command(self, args: Sequence[Any]) -> tuple[str, str]:
        """The verb and function that call the module with ``args``: FCALL_RO of the
        read-only function for a call that only reads, FCALL of the module otherwise."""
        return ("FCALL_RO", self.read_name) if reads_only(args) else ("FCALL", self.name)

    def load(self) -> None:
        self.client.function_load(library_source(), replace=True)

    def fcall(self, keys: tuple[str, ...], args: list[Any]) -> Any:
        verb, name = self.command(args)
        lane = self.lane  # (it serves FCALL of the module: a worker's loop, not the reads)
        if verb == "FCALL" and lane is not None and lane.ready():
            return lane.call(keys, args)
        return send_undecoded(self.client, verb, name, keys, args)

    def __call__(self, keys: tuple[str, ...], args: list[Any]) -> Any:
        for attempt in range(2):
            try:
                return self.fcall(keys, args)
            except ResponseError as error:
                if not _function_missing(error):
                    raise
            if attempt == 0:
                self.load()
        # Flushed again between the load and the retry: run the same module as a script.
        return send_undecoded(self.client, "EVAL", module_source(), keys, args)


class AsyncFunctionCall(FunctionCall):
    LANE = AsyncLane

    async def load(self) -> None:  # type: ignore[override]
        await self.client.function_load(library_source(), replace=True)

    async def fcall(self, keys: tuple[str, ...], args: list[Any]) -> Any:
        verb, name = self.command(args)
        lane = self.lane
        if verb == "FCALL" and lane is not None and await lane.ready():
            return await lane.call(keys, args)
        return await send_undecoded(self.client, verb, name, keys, args)

    async def __call__(self, keys: tuple[str, ...], args: list[Any]) -> Any:
        for attempt in range(2):
            try:
                return await self.fcall(keys, args)
            except ResponseError as error:
                if not _function_missing(error):
                    raise
            if attempt == 0:
                await self.load()
        return await send_undecoded(self.client, "EVAL", module_source(), keys, args)


class ModuleScript:
    """The module by EVALSHA, loaded again and sent once more when the server answers
    NOSCRIPT (nothing ran), its replies read undecoded (:data:`rotator.lane.RAW`); by the fast
    lane (:mod:`rotator.lane`) where the client has one. Any sync client, cluster too."""

    LANE: type[Lane] = Lane

    def __init__(self, client: Any) -> None:
        self.registered_client = client
        self.script = module_source()
        self.sha = module_sha()
        self.lane: Any = self.LANE.serving(client, "EVALSHA", self.sha)

    def evalsha(self, keys: tuple[str, ...], args: list[Any]) -> Any:
        lane = self.lane
        if lane is not None and lane.ready():
            return lane.call(keys, args)
        return send_undecoded(self.registered_client, "EVALSHA", self.sha, keys, args)

    def __call__(self, keys: tuple[str, ...] = (), args: list[Any] | None = None) -> Any:
        args = args or []
        try:
            return self.evalsha(keys, args)
        except NoScriptError:
            self.registered_client.script_load(self.script)
            return self.evalsha(keys, args)


class AsyncModuleScript(ModuleScript):
    """:class:`ModuleScript` on ``redis.asyncio`` (cluster too)."""

    LANE = AsyncLane

    async def evalsha(self, keys: tuple[str, ...], args: list[Any]) -> Any:
        lane = self.lane
        if lane is not None and await lane.ready():
            return await lane.call(keys, args)
        return await send_undecoded(self.registered_client, "EVALSHA", self.sha, keys, args)

    async def __call__(self, keys: tuple[str, ...] = (), args: list[Any] | None = None) -> Any:
        args = args or []
        try:
            return await self.evalsha(keys, args)
        except NoScriptError:
            await self.registered_client.script_load(self.script)
            return await self.evalsha(keys, args)


# Errors after which redis-py, routing a command itself, refreshes its slot map and tries again.
_CLUSTER_RETRIED = (ConnectionError, TimeoutError, ClusterDownError, SlotNotCoveredError)


def slot_master(client: Any, keys: tuple[str, ...]) -> Any:
    """The node of a cluster client's slot map that holds ``keys``' slot (a queue's keys
    share one), or None: no keys, or no slot map yet (the usual routing then makes one)."""
    if not keys:
        return None
    try:
        return client.get_node_from_key(keys[0])
    except (RedisClusterException, KeyError, IndexError):
        return None


class ClusterFunctionCall(FunctionCall):
    """FCALL on a Redis Cluster client, sent to the master of its keys' slot. Left to route
    an FCALL itself, redis-py asks a node for the command's keys first (COMMAND GETKEYS): a
    round trip more per call. It follows MOVED and ASK for a named node too; what it does
    not do for one is retry a lost connection, so where the client retries, the call goes
    again the usual way after such an error (as redis-py would have sent it again)."""

    def fcall(self, keys: tuple[str, ...], args: list[Any]) -> Any:
        node = slot_master(self.client, keys)
        if node is None:
            return super().fcall(keys, args)
        try:
            return self.client.execute_command(
                *self.command(args), len(keys), *keys, *args, target_nodes=node, **RAW
            )
        except _CLUSTER_RETRIED:
            if not self.client.retry.get_retries():
                raise
            return super().fcall(keys, args)


class AsyncClusterFunctionCall(AsyncFunctionCall):
    """:class:`ClusterFunctionCall` on ``redis.asyncio``."""

    async def fcall(self, keys: tuple[str, ...], args: list[Any]) -> Any:
        node = slot_master(self.client, keys)
        if node is None:
            return await super().fcall(keys, args)
        try:
            return await self.client.execute_command(
                *self.command(args), len(keys), *keys, *args, target_nodes=node, **RAW
            )
        except _CLUSTER_RETRIED:
            if not self.client.retry.get_retries():
                raise
            return await super().fcall(keys, args)


# The mode the default caller chose per client: "fcall" or "evalsha" (absent: not yet known).
_CHOSEN: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def chosen_mode(client: Any) -> str | None:
    """How the default caller calls the module on ``client``: "fcall", "evalsha", or None
    before its first call."""
    return _CHOSEN.get(client)


def _fcall_refused(error: ResponseError) -> bool:
    """The server cannot run the library for this client: it has no functions, or the ACL
    refuses FCALL, FCALL_RO (the reads') or FUNCTION LOAD (a refusal of a command the module
    calls is not this)."""
    text = str(error).lower()
    if isinstance(error, NoPermissionError):
        names = ("fcall", "fcall_ro", "function|load", "function")
        return any(f"'{name}'" in text for name in names)
    return NO_FUNCTIONS.search(text) is not None


class AutoCall:
    """``functions=None``: FCALL where the server and the ACL allow it, EVALSHA otherwise;
    chosen at the first call on the client, and kept for it."""

    FUNCTION_CALL: type[FunctionCall] = FunctionCall
    SCRIPT: type[ModuleScript] = ModuleScript

    def __init__(self, client: Any) -> None:
        self.client = client
        self.function = self.FUNCTION_CALL(client)
        self.script = self.SCRIPT(client)

    @property
    def mode(self) -> str | None:
        return _CHOSEN.get(self.client)

    def current(self) -> Any:
        """The caller a pipeline uses: FCALL once chosen, EVALSHA until then (it always runs;
        a wrong guess only costs speed)."""
        return self.function if self.mode == "fcall" else self.script

    def _as_script(self, error: ResponseError) -> bool:
        """After FCALL raised ``error``: True when nothing ran and the call goes as a script
        (noting the choice), False when the error is the command's own."""
        if isinstance(error, ReadOnlyError):
            # A read-only replica refuses FCALL of a library that may write before it runs;
            # a script runs there, and fails at its first write (this call only).
            return True
        refused = _fcall_refused(error)
        _CHOSEN[self.client] = "evalsha" if refused else "fcall"
        return refused

    def __call__(self, keys: tuple[str, ...], args: list[Any]) -> Any:
        if self.mode != "evalsha":
            try:
                reply = self.function(keys, args)
            except ResponseError as error:
                if not self._as_script(error):
                    raise
            else:
                _CHOSEN[self.client] = "fcall"
                return reply
        try:
            return self.script(keys=keys, args=args)
        except NoScriptError:
            return send_undecoded(self.client, "EVAL", module_source(), keys, args)


class ClusterAutoCall(AutoCall):
    FUNCTION_CALL = ClusterFunctionCall


class AsyncAutoCall(AutoCall):
    FUNCTION_CALL = AsyncFunctionCall
    SCRIPT = AsyncModuleScript

    async def __call__(self, keys: tuple[str, ...], args: list[Any]) -> Any:
        if self.mode != "evalsha":
            try:
                reply = await self.function(keys, args)
            except ResponseError as error:
                if not self._as_script(error):
                    raise
            else:
                _CHOSEN[self.client] = "fcall"
                return reply
        try:
            return await self.script(keys=keys, args=args)
        except NoScriptError:
            return await send_undecoded(self.client, "EVAL", module_source(), keys, args)


class AsyncClusterAutoCall(AsyncAutoCall):
    FUNCTION_CALL = AsyncClusterFunctionCall


def probe_mode(client: Any) -> str:
    """The mode the default caller chooses on ``client``, found (once per client) with a call
    the module refuses before it reads or writes anything: one without keys."""
    if client not in _CHOSEN:
        with contextlib.suppress(ResponseError):
            AutoCall(client)((), ["stats"])
    return _CHOSEN.get(client, "evalsha")


def module_caller(client: Any, functions: bool | None) -> Any:
    """What calls the module for ``client``: FCALL of the library (True), redis-py's Script
    (False), or the faster of the two that the server allows (None). On Redis Cluster an
    FCALL goes to the master of its keys' slot (:class:`ClusterFunctionCall`)."""
    cluster = isinstance(client, RedisCluster)
    if functions is None:
        return (ClusterAutoCall if cluster else AutoCall)(client)
    if functions:
        return (ClusterFunctionCall if cluster else FunctionCall)(client)
    return ModuleScript(client)


def async_module_caller(client: Any, functions: bool | None) -> Any:
    # Imported here, so that sync callers never load redis.asyncio.
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster  # noqa: PLC0415

    cluster = isinstance(client, AsyncRedisCluster)
    if functions is None:
        return (AsyncClusterAutoCall if cluster else AsyncAutoCall)(client)
    if functions:
        return (AsyncClusterFunctionCall if cluster else AsyncFunctionCall)(client)
    return AsyncModuleScript(client)


def _function_missing(error: ResponseError) -> bool:
    return "function not found" in str(error).lower()


def pipelined_caller(caller: Any) -> Any:
    """The caller whose command a pipeline sends for ``caller`` (an AutoCall's current one)."""
    return caller.current() if isinstance(caller, AutoCall) else caller


def module_command(caller: Any, keys: tuple[str, ...], args: list[Any]) -> list[Any]:
    """The command that calls the module as ``caller`` does, to send in a pipeline."""
    caller = pipelined_caller(caller)
    if isinstance(caller, FunctionCall):
        return [*caller.command(args), len(keys), *keys, *args]
    return ["EVALSHA", caller.sha, len(keys), *keys, *args]


def not_loaded(reply: object) -> bool:
    """True for a pipeline reply saying the script or library is not on the server (nothing
    ran: call again through ``run``, which loads it)."""
    return isinstance(reply, NoScriptError) or (
        isinstance(reply, ResponseError) and _function_missing(reply)
    )


def pipeline_reply(reply: object) -> Any:
    """A module reply taken from a pipeline: errors raised as ``run`` raises them."""
    if isinstance(reply, ResponseError):
        raise error_from_reply(reply) from reply
    if isinstance(reply, Exception):
        raise reply
    return reply


def run(script: Any, keys: tuple[str, ...], args: list[Any]) -> Any:
    """Runs the module through a redis-py Script (or FunctionCall), raising rotator's typed
    errors. redis-py's Script reloads once on NOSCRIPT; if the cache is flushed again before
    its retry, the source itself goes with EVAL, which no flush can defeat (a NOSCRIPT reply
    means nothing ran, so nothing runs twice)."""
    try:
        try:
            return script(keys=keys, args=args)
        except NoScriptError:
            return send_undecoded(script.registered_client, "EVAL", script.script, keys, args)
    except ResponseError as error:
        raise error_from_reply(error) from error


async def run_async(script: Any, keys: tuple[str, ...], args: list[Any]) -> Any:
    try:
        try:
            return await script(keys=keys, args=args)
        except NoScriptError:
            return await send_undecoded(script.registered_client, "EVAL", script.script, keys, args)
    except ResponseError as error:
        raise error_from_reply(error) from error
