"""Clients from URLs, for every entry point that takes one (``Rotator.from_url``, the CLI's
``--url``, the dashboard, Spark): redis-py's own schemes, and a master found through Redis
Sentinel.

    redis://HOST:PORT/DB, rediss://HOST:PORT/DB (TLS), unix:///PATH   redis-py's from_url
    redis+sentinel://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]...]/SERVICE[/DB]

Each HOST of a Sentinel URL is a Sentinel (port 26379 unless given), SERVICE the name they
monitor (``sentinel monitor SERVICE ...``), DB the database (0). USER and PASSWORD are the
master's (and its replicas'); a Sentinel that asks a password of its own needs a client built
by hand (``redis.sentinel.Sentinel(..., sentinel_kwargs=...).master_for(...)``) given to
``Rotator``. The client asks the Sentinels where the master is when it connects, and again
after a connection error or a READONLY reply (a demoted master's), so a failover is followed
without a restart; calls in flight at that moment raise or retry as redis-py's retries decide,
and the worker loops retry them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import redis
import redis.asyncio as aredis
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.connection import parse_url
from redis.sentinel import MasterNotFoundError, Sentinel

from rotator.errors import InvalidArgument

SENTINEL_SCHEME = "redis+sentinel://"
SCHEMES = ("redis://", "rediss://", "unix://", SENTINEL_SCHEME)
SENTINEL_PORT = 26379
# How long asking one Sentinel may take (s): one that is down or cut off is passed over for the
# next within this, where redis-py's default is to wait on it unbounded.
SENTINEL_TIMEOUT = 1.0
SENTINEL_OPTIONS = {"socket_connect_timeout": SENTINEL_TIMEOUT, "socket_timeout": SENTINEL_TIMEOUT}


@dataclass(frozen=True)
class SentinelURL:
    """What a ``redis+sentinel://`` URL says."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None


def check_url(url: str) -> None:
    """Raises ValueError, saying what is wrong, for a URL no client here can be made from."""
    if not url.startswith(SCHEMES):
        raise ValueError(f"no scheme: use {', '.join(SCHEMES)} (e.g. redis://localhost:6379/0)")
    if url.startswith(SENTINEL_SCHEME):
        parse_sentinel_url(url)
    else:
        parse_url(url)  # type: ignore[no-untyped-call]


def check_not_sentinel(url: str, what: str) -> None:
    """InvalidArgument for a Sentinel URL where ``what`` (a Redis Cluster) needs a node's URL."""
    if url.startswith(SENTINEL_SCHEME):
        raise InvalidArgument(
            f"{what} is named by one of its nodes (redis://HOST:PORT); {SENTINEL_SCHEME} names "
            "a master watched by Sentinels"
        )


def connection_problem(error: redis.ConnectionError) -> str:
    """A connection error in one line: a Sentinel client's MasterNotFoundError lists each
    Sentinel's client at length after its first words, which are the news."""
    if isinstance(error, MasterNotFoundError):
        head = str(error).split(" : ", 1)[0]
        return f"{head}: no Sentinel of the URL answered with one"
    return str(error)


def parse_sentinel_url(url: str) -> SentinelURL:
    """The parts of a ``redis+sentinel://`` URL; ValueError for one that is not well formed."""
    if not url.startswith(SENTINEL_SCHEME):
        raise ValueError(f"a Sentinel URL starts with {SENTINEL_SCHEME}")
    rest = url[len(SENTINEL_SCHEME) :]
    if "?" in rest or "#" in rest:
        raise ValueError("a Sentinel URL takes no query or fragment (build the client by hand)")
    netloc, _, path = rest.partition("/")
    credentials, _, hosts = netloc.rpartition("@")
    username = password = None
    if credentials:
        user, colon, secret = credentials.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    sentinels = tuple(_host_and_port(part) for part in hosts.split(","))
    parts = path.split("/") if path else []
    if not parts or not parts[0] or len(parts) > 2:
        raise ValueError("a Sentinel URL ends with /SERVICE or /SERVICE/DB (the monitored name)")
    db = 0
    if len(parts) == 2 and parts[1]:
        if not parts[1].isdigit() or len(parts[1]) > 4:
            raise ValueError(f"the database must be a whole number, got {parts[1]!r}")
        db = int(parts[1])
    return SentinelURL(sentinels, unquote(parts[0]), db, username, password)


def _host_and_port(text: str) -> tuple[str, int]:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port``: one Sentinel's address."""
    host, port = text, ""
    if text.startswith("["):
        host, bracket, port = text[1:].partition("]")
        if not bracket or (port and not port.startswith(":")):
            raise ValueError(f"a Sentinel address {text!r} is not [IPV6] or [IPV6]:PORT")
        port = port[1:]
    elif ":" in text:
        host, _, port = text.partition(":")
    if not host:
        raise ValueError(f"a Sentinel address {text!r} has no host")
    if port and not (port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"a Sentinel address {text!r} has a port that is not 1..65535")
    return host, int(port) if port else SENTINEL_PORT


def _master_options(parsed: SentinelURL, options: dict[str, Any]) -> dict[str, Any]:
    return {"db": parsed.db, "username": parsed.username, "password": parsed.password, **options}


def client_from_url(url: str, **options: Any) -> redis.Redis:
    """A client for ``url``; ``options`` go to the client (``redis.Redis.from_url``'s, or for
    a Sentinel URL the master's connections')."""
    if not url.startswith(SENTINEL_SCHEME):
        return redis.Redis.from_url(url, **options)
    parsed = parse_sentinel_url(url)
    sentinel = Sentinel(list(parsed.sentinels), sentinel_kwargs=SENTINEL_OPTIONS)  # type: ignore[no-untyped-call]
    client: redis.Redis = sentinel.master_for(parsed.service, **_master_options(parsed, options))  # type: ignore[no-untyped-call]
    return client


def async_client_from_url(url: str, **options: Any) -> aredis.Redis:
    """As :func:`client_from_url`, a ``redis.asyncio`` client."""
    if not url.startswith(SENTINEL_SCHEME):
        return aredis.Redis.from_url(url, **options)
    parsed = parse_sentinel_url(url)
    sentinel = AsyncSentinel(list(parsed.sentinels), sentinel_kwargs=SENTINEL_OPTIONS)  # type: ignore[no-untyped-call]
    client: aredis.Redis = sentinel.master_for(parsed.service, **_master_options(parsed, options))
    return client
