"""The Lua module: its source, its SHA, and calling it with typed errors.

Calls go through EVALSHA; redis-py's Script reloads the source and retries once when the
server answers NOSCRIPT (after SCRIPT FLUSH, a restart or a failover), and a NOSCRIPT reply
means nothing ran, so the retry cannot apply a command twice.
"""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from redis.exceptions import ResponseError

from rotator.errors import error_from_reply

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


def run(script: Any, keys: tuple[str, ...], args: list[Any]) -> Any:
    """Runs the module through a redis-py Script, raising rotator's typed errors."""
    try:
        return script(keys=keys, args=args)
    except ResponseError as error:
        raise error_from_reply(error) from error


async def run_async(script: Any, keys: tuple[str, ...], args: list[Any]) -> Any:
    try:
        return await script(keys=keys, args=args)
    except ResponseError as error:
        raise error_from_reply(error) from error
