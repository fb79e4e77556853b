"""The dashboard: a Starlette app over one server or one Redis Cluster, and :func:`serve` to
run it on uvicorn.

With ``cluster=True`` the URL names any node of a cluster: the app reads through cluster
clients, discovery scans every primary (see :mod:`rotator.discovery`) and each queue is read
on the node holding its slot. Nothing here reads server-wide information (INFO, DBSIZE), so
no part of a page depends on which node answers.

Routes (every page and stream only reads):

- ``GET /``, ``/queues/{name}``, ``/topics/{name}``: the pages, rendered on the server from
  a fresh reading (Jinja2, autoescaped), then kept live by the page's script;
- ``GET /events``, ``/events/queues/{name}``: server-sent events from the shared poll loop
  (:mod:`rotator.dashboard.hub`): each event is a JSON snapshot with the page's live parts
  already rendered (escaped on the server) and a chart point;
- ``GET /api/overview``, ``/api/queues/{name}``: the same data as JSON;
- ``POST /actions/{pause|resume|requeue|delete}``: the actions, with the token and a
  same-origin check (:mod:`rotator.dashboard.security`); on a sharded queue each acts on
  every shard;
- ``GET /metrics`` (Prometheus text format, :mod:`rotator.dashboard.metrics`), ``/healthz``.

A sharded queue is one queue here, under its logical name: one overview row with its shards'
counts added up, a page with a table of its shards, one set of series in /metrics. Its reads
and actions go through :class:`rotator.sharded_aio.AsyncShardedRotator` (/metrics: the sync
ShardedRotator).

Scripts and styles are served from the package (``static/``): the page loads nothing from
another site, and its Content-Security-Policy says so.
"""

from __future__ import annotations

import contextlib
import math
import re
import signal
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import jinja2
import redis
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rotator import __version__
from rotator.aio import AsyncRotator
from rotator.dashboard import DEFAULT_HOST, DEFAULT_PORT
from rotator.dashboard.hub import (
    DISCOVER_EVERY,
    OVERVIEW,
    POLL_INTERVAL,
    Hub,
    queue_key,
    topic_key,
)
from rotator.dashboard.metrics import QueueCollector
from rotator.dashboard.security import (
    LOOPBACK_HOSTS,
    TOKEN_ENV,
    Refused,
    allowed_hosts,
    check_action,
    read_form,
)
from rotator.dashboard.snapshot import (
    COUNTERS,
    UNREACHABLE,
    Reader,
    Reading,
    backlog,
    detail_json,
    element_id,
    queue_row_json,
    rates,
    topic_json,
)
from rotator.defaults import DEFAULT_PREFIX
from rotator.errors import InvalidQueueName, RotatorError
from rotator.retries import DEFAULT_RETRY_FOR
from rotator.sharded_aio import AsyncShardedRotator
from rotator.urls import async_client_from_url, client_from_url

HERE = Path(__file__).resolve().parent
# Seconds a client waits to connect to the server, and for a reply.
CONNECT_TIMEOUT = 5.0
REPLY_TIMEOUT = 10.0
CLIENT_OPTIONS: dict[str, Any] = {
    "socket_connect_timeout": CONNECT_TIMEOUT,
    "socket_timeout": REPLY_TIMEOUT,
}
ACTIONS = ("pause", "resume", "requeue", "delete")
# What an action answers, the only text a page shows from its URL (?done=...), so a link
# cannot make the page say something else.
DONE = re.compile(
    r"paused|resumed|was paused already|was not paused|(requeued|deleted) \d+ dead letters?"
)
SECURITY_HEADERS = (
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
)


class SecurityHeaders:
    """Adds the headers above to every response (a plain ASGI middleware, so event streams
    are passed through as they are written)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


class EventStream(StreamingResponse):
    """Server-sent events from an async generator, which is closed however the response
    ends (the page going away included), so the poll loop knows one listener fewer."""

    body_iterator: AsyncGenerator[str, None]

    def __init__(self, events: AsyncGenerator[str, None]) -> None:
        super().__init__(
            events,
            media_type="text/event-stream",
            headers={"cache-control": "no-store", "x-accel-buffering": "no"},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except ClientDisconnect:
            pass
        finally:
            await self.body_iterator.aclose()


async def sse(snapshots: AsyncGenerator[str, None]) -> AsyncGenerator[str, None]:
    try:
        yield "retry: 2000\n\n"
        async for data in snapshots:
            yield f"event: snapshot\ndata: {data}\n\n"
    finally:
        await snapshots.aclose()


# -- how values are shown ----------------------------------------------------------------------


def redacted(url: str) -> str:
    """The server URL without its password, to show on the page."""
    parts = urlsplit(url)
    # (by the text: a Sentinel URL's netloc lists several hosts, which urlsplit cannot parse)
    credentials, at, hosts = parts.netloc.rpartition("@")
    if not at or ":" not in credentials:
        return url
    user = credentials.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{hosts}"))


def show_count(value: Any) -> str:
    if value is None:
        return "—"
    return f"{value:,}"


def show_rate(value: float | None) -> str:
    """Jobs per second, to about three significant digits."""
    if value is None:
        return "—"
    if value == 0:
        return "0"
    size = abs(value)
    if size >= 100:
        return f"{value:,.0f}"
    if size >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def show_span(seconds: float | None) -> str:
    """A duration as a person reads it: 850 ms, 42 s, 3 min 5 s, 2 h 10 min, 3 d 4 h."""
    if seconds is None or math.isnan(seconds):
        return "—"
    seconds = abs(seconds)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f}".removesuffix(".0") + " s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def show_when(ms: int | None, now: float) -> str:
    """A moment relative to now: "in 3.0 s", "2 min ago"."""
    if not ms:
        return "—"
    delta = ms / 1000 - now
    return f"in {show_span(delta)}" if delta >= 0 else f"{show_span(delta)} ago"


def show_when_s(seconds: float | None, now: float) -> str:
    return "—" if seconds is None else show_when(round(seconds * 1000), now)


def show_limit(limit: Mapping[str, Any] | None) -> str:
    """A rate limit as ``40 / s``, ``5 / min``, ``10 per 30 s``; "none" without one."""
    if not limit:
        return "none"
    jobs, per = show_count(limit["jobs"]), float(limit["per"])
    units = {1.0: "s", 60.0: "min", 3600.0: "h", 86_400.0: "day"}
    return f"{jobs} / {units[per]}" if per in units else f"{jobs} per {show_span(per)}"


def show_bytes(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return f"{size} B"


def show_moment(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def queue_path(name: str) -> str:
    return "/queues/" + quote(name, safe="")


def topic_path(name: str) -> str:
    return "/topics/" + quote(name, safe="")


def events_path(kind: str, name: str) -> str:
    return f"/events/{kind}/" + quote(name, safe="")


def make_templates() -> Jinja2Templates:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every template, whatever its name: ids and payloads are escaped
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        num=show_count,
        rate=show_rate,
        span=show_span,
        bytes=show_bytes,
        limit=show_limit,
        moment=show_moment,
    )
    env.globals.update(
        queue_path=queue_path,
        topic_path=topic_path,
        events_path=events_path,
        when=show_when,
        when_s=show_when_s,
        counters=COUNTERS,
        version=__version__,
    )
    return Jinja2Templates(env=env)


# -- the app -----------------------------------------------------------------------------------


class Dashboard:
    """The app's state: the server's clients, the shared poll loop, the token."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None,
        prefix: str,
        interval: float,
        discover_every: float,
        cluster: bool = False,
    ) -> None:
        self.url = url
        self.cluster = cluster
        self.token = token
        self.prefix = prefix
        self.interval = interval
        self.discover_every = discover_every
        self.templates = make_templates()
        self.fragments: Any = self.templates.get_template("_fragments.html").module
        self.server = redacted(url)
        self.client: Any = None
        self.reader: Reader | None = None
        self.hub: Hub | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.sync_client: redis.Redis | RedisCluster | None = None

    def connect_sync(self) -> redis.Redis | RedisCluster:
        """The client /metrics reads with (in a worker thread), made at the first scrape: a
        cluster client connects when it is made, and an unreachable cluster must make a
        scrape say ``rotator_up 0``, not stop the app from starting."""
        if self.cluster:
            self.sync_client = RedisCluster.from_url(self.url, **CLIENT_OPTIONS)
        else:
            self.sync_client = client_from_url(self.url, **CLIENT_OPTIONS)
        return self.sync_client

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        # The asyncio cluster client connects at its first command, so it is made here.
        if self.cluster:
            self.client = AsyncRedisCluster.from_url(self.url, **CLIENT_OPTIONS)
        else:
            self.client = async_client_from_url(self.url, **CLIENT_OPTIONS)
        self.reader = Reader(self.client, prefix=self.prefix)
        self.hub = Hub(
            self.reader,
            interval=self.interval,
            discover_every=self.discover_every,
            render=self.render,
        )
        collector = QueueCollector(self.connect_sync, prefix=self.prefix)
        self.registry.register(collector)
        try:
            yield
        finally:
            self.registry.unregister(collector)
            await self.hub.close()
            await self.client.aclose()
            if self.sync_client is not None:
                self.sync_client.close()

    # -- rendering -----------------------------------------------------------------------

    def common(self, request: Request, page: str, title: str) -> dict[str, Any]:
        return {
            "page": page,
            "title": title,
            "server": self.server,
            "cluster": self.cluster,
            "actions_on": self.token is not None,
            "token_env": TOKEN_ENV,
            "interval": self.interval,
            "discover_every": self.discover_every,
            "prefix": self.prefix,
            "now": time.time(),
            "done": done if DONE.fullmatch(done := request.query_params.get("done", "")) else "",
        }

    def render(self, snapshot: dict[str, Any]) -> dict[str, str]:
        """The live parts of a page for this snapshot, rendered (and escaped) once for every
        page that shows it."""
        now = snapshot.get("at") or time.time()
        f = self.fragments
        kind = snapshot.get("kind")
        if kind == "overview":
            if "totals" not in snapshot:
                return {}
            return {
                "summary": str(f.overview_summary(snapshot)),
                "queues": str(f.queue_rows(snapshot.get("queues", []), now)),
                "topics": str(f.topic_rows(snapshot.get("topics", []))),
            }
        if kind == "topic":
            if "groups" not in snapshot:
                return {}
            return {
                "topic-summary": str(f.topic_summary(snapshot)),
                "groups": str(f.group_rows(snapshot)),
            }
        if "stats" not in snapshot:
            return {}
        actions = self.token is not None
        if snapshot.get("shards") is not None:
            return {
                "state": str(f.queue_state(snapshot["stats"])),
                "cards": str(f.queue_cards(snapshot["stats"])),
                "rates": str(f.queue_rates(snapshot, now)),
                "shards": str(f.shard_rows(snapshot["shards"])),
                "dead": str(f.dead_rows(snapshot["name"], snapshot["dead"], actions, now)),
                "dead-count": str(f.dead_count(snapshot)),
            }
        return {
            "state": str(f.queue_state(snapshot["stats"])),
            "cards": str(f.queue_cards(snapshot["stats"])),
            "rates": str(f.queue_rates(snapshot, now)),
            "peek": str(f.peek_rows(snapshot["peek"], now)),
            "dead": str(f.dead_rows(snapshot["name"], snapshot["dead"], actions, now)),
            "dead-count": str(f.dead_count(snapshot)),
            "schedules": str(f.schedule_rows(snapshot["schedules"], now)),
            "limits": str(f.queue_limits(snapshot["stats"])),
        }

    def page(
        self, request: Request, template: str, context: dict[str, Any], status: int = 200
    ) -> Response:
        return self.templates.TemplateResponse(request, template, context, status_code=status)

    async def unreachable(self, request: Request, error: Exception) -> Response:
        """A page or API call that could not read the server: 503, saying why."""
        message = f"cannot read the server: {error}"
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": message}, 503)
        context = self.common(request, "error", "Server unreachable")
        return self.page(request, "error.html", {**context, "message": message}, 503)

    def not_found(self, request: Request, message: str) -> Response:
        context = self.common(request, "error", "Not found")
        return self.page(request, "error.html", {**context, "message": message}, 404)

    @property
    def ready_reader(self) -> Reader:
        assert self.reader is not None, "the app's lifespan has not started"
        return self.reader

    # -- pages ---------------------------------------------------------------------------

    async def overview_page(self, request: Request) -> Response:
        snapshot = await self.overview_snapshot()
        context = self.common(request, "overview", "Overview")
        context["snapshot"] = snapshot
        context["html"] = self.render(snapshot)
        return self.page(request, "overview.html", context)

    async def overview_snapshot(self) -> dict[str, Any]:
        reader = self.ready_reader
        overview = await reader.overview(await reader.discover())
        rows = []
        totals = {"backlog": 0, "in_flight": 0, "dead": 0, "pending": 0}
        for name, stats in overview.queues.items():
            shards = overview.shards.get(name)
            if isinstance(stats, RotatorError):
                rows.append(queue_row_json(name, stats, {}, shards))
            else:
                found = rates(None, Reading(overview.at, stats))
                rows.append(queue_row_json(name, stats, found, shards))
                totals["backlog"] += backlog(stats)
                totals["in_flight"] += stats.in_flight
                totals["dead"] += stats.dead
                totals["pending"] += stats.pending
        return {
            "kind": "overview",
            "at": overview.at,
            "error": None,
            "discovered_at": overview.at,
            "queues": rows,
            "topics": [topic_json(name, s) for name, s in overview.topics.items()],
            "totals": {**totals, "rates": dict.fromkeys((*COUNTERS, "backlog"))},
        }

    def queue_name(self, request: Request) -> str:
        name: str = request.path_params["name"]
        self.ready_reader.queue(name)  # InvalidQueueName for a name rotator never makes
        return name

    async def queue_page(self, request: Request) -> Response:
        try:
            name = self.queue_name(request)
        except InvalidQueueName:
            return self.not_found(request, "not a queue name rotator makes")
        snapshot = await self.queue_snapshot(name)
        if not snapshot["exists"]:
            return self.not_found(request, f"no queue {name!r} on this server")
        context = self.common(request, "queue", name)
        context.update(name=name, snapshot=snapshot, html=self.render(snapshot))
        return self.page(request, "queue.html", context)

    async def queue_snapshot(self, name: str) -> dict[str, Any]:
        detail = await self.ready_reader.detail(name)
        return {
            "kind": "queue",
            "error": None,
            **detail_json(detail, rates(None, Reading(detail.at, detail.stats))),
        }

    async def topic_page(self, request: Request) -> Response:
        name: str = request.path_params["name"]
        try:
            topic = self.ready_reader.topic(name)
        except InvalidQueueName:
            return self.not_found(request, "not a topic name rotator makes")
        if not await topic.exists():
            return self.not_found(request, f"no topic {name!r} on this server")
        snapshot = topic_json(name, await topic.stats())
        context = self.common(request, "topic", name)
        context.update(name=name, topic=snapshot)
        return self.page(request, "topic.html", context)

    # -- live data -----------------------------------------------------------------------

    async def overview_events(self, request: Request) -> Response:
        assert self.hub is not None
        return EventStream(sse(self.hub.listen(OVERVIEW)))

    async def queue_events(self, request: Request) -> Response:
        assert self.hub is not None
        try:
            name = self.queue_name(request)
        except InvalidQueueName:
            return Response("not a queue name rotator makes", 404)
        return EventStream(sse(self.hub.listen(queue_key(name))))

    async def topic_events(self, request: Request) -> Response:
        assert self.hub is not None
        name: str = request.path_params["name"]
        try:
            self.ready_reader.topic(name)
        except InvalidQueueName:
            return Response("not a topic name rotator makes", 404)
        return EventStream(sse(self.hub.listen(topic_key(name))))

    async def overview_api(self, request: Request) -> Response:
        return JSONResponse(await self.overview_snapshot())

    async def queue_api(self, request: Request) -> Response:
        try:
            name = self.queue_name(request)
        except InvalidQueueName:
            return JSONResponse({"error": "not a queue name rotator makes"}, 404)
        snapshot = await self.queue_snapshot(name)
        if not snapshot["exists"]:
            return JSONResponse({"error": f"no queue {name!r}"}, 404)
        return JSONResponse(snapshot)

    # -- actions -------------------------------------------------------------------------

    async def action(self, request: Request) -> Response:
        verb = request.path_params["action"]
        name = ""
        try:
            if verb not in ACTIONS:
                raise Refused(404, f"no action {verb!r}")
            form = await read_form(request)
            check_action(request, form, self.token)
            name = first(form, "queue")
            try:
                queue = self.ready_reader.queue(name)
            except InvalidQueueName as error:
                raise Refused(400, str(error)) from error
            # A sharded queue exists while its layout is stored (its own keys hold no ring).
            shards = await self.ready_reader.stored_shards(name)
            if shards is None and not await queue.exists():
                raise Refused(404, f"no queue {name!r}")
            message = await self.act(verb, name, form, shards)
        except Refused as refused:
            return self.answer(request, refused.status, refused.message, name)
        except RotatorError as error:
            return self.answer(request, 400, str(error), name)
        return self.answer(request, 200, message, name)

    async def act(
        self, verb: str, name: str, form: Mapping[str, list[str]], shards: int | None = None
    ) -> str:
        """The action on queue ``name``; on a sharded queue (``shards``), on every shard
        through AsyncShardedRotator (each shard's part atomic, not all at once), retrying
        cluster errors for its default time."""
        reader = self.ready_reader
        queue: AsyncRotator | AsyncShardedRotator = (
            reader.queue(name)
            if shards is None
            else reader.sharded(name, shards, retry_for=DEFAULT_RETRY_FOR)
        )
        if verb == "pause":
            return "paused" if await queue.pause() else "was paused already"
        if verb == "resume":
            return "resumed" if await queue.resume() else "was not paused"
        if verb == "requeue":
            ids = form.get("id", [])
            if form.get("all"):
                moved = await queue.requeue_dead()
            elif ids:
                moved = await queue.requeue_dead(*ids)
            else:
                raise Refused(400, "name the dead letters to requeue (id), or all")
            return f"requeued {moved} dead letter{'' if moved == 1 else 's'}"
        letters = form.get("letter", [])
        if not letters:
            raise Refused(400, "name the dead letters to delete (letter)")
        # No module command deletes one letter: LREM of its exact text removes it (one
        # atomic command; the dead count is the list's length, so stats stay right).
        removed = 0
        for letter in letters:
            if isinstance(queue, AsyncShardedRotator):
                removed += await delete_sharded_letter(queue, letter)
            else:
                raw = letter.encode("utf-8", "surrogateescape")
                removed += int(await self.client.lrem(queue.keys.dead, 1, raw))
        return f"deleted {removed} dead letter{'' if removed == 1 else 's'}"

    def answer(self, request: Request, status: int, message: str, name: str) -> Response:
        """JSON for the page's script; for a plain form, back to the queue's page (or an
        error page)."""
        if "application/json" in request.headers.get("accept", ""):
            return JSONResponse({"ok": status < 400, "message": message}, status)
        if status < 400 and name:
            return RedirectResponse(f"{queue_path(name)}?done={quote(message)}", 303)
        context = self.common(request, "error", "Refused")
        return self.page(request, "error.html", {**context, "message": message}, status)

    # -- operations ----------------------------------------------------------------------

    async def metrics(self, request: Request) -> Response:
        body = await run_in_threadpool(generate_latest, self.registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    async def ping(self) -> None:
        """PING the server, or every primary of a cluster: a cluster client's own PING asks one
        node, and a primary that does not answer leaves its queues unread."""
        if self.cluster:
            await self.client.ping(target_nodes=AsyncRedisCluster.PRIMARIES)
        else:
            await self.client.ping()

    async def healthz(self, request: Request) -> Response:
        try:
            await self.ping()
        except UNREACHABLE as error:
            return JSONResponse({"ok": False, "error": f"cannot reach the server: {error}"}, 503)
        return JSONResponse({"ok": True})


async def delete_sharded_letter(q: AsyncShardedRotator, letter: str) -> int:
    """LREM of one dead letter's exact text from the shard its job id names (the letter ends
    with its element, which starts with the id), else from the first other shard that holds
    it; 1 when one was removed."""
    raw = letter.encode("utf-8", "surrogateescape")
    job_id = element_id(letter.split("*", 3)[-1])
    try:
        home = q.shard_of(job_id)
    except RotatorError:  # no job id in it (a corrupt element): look everywhere
        home = 0
    for k in (home, *(k for k in range(q.shards) if k != home)):
        if int(await q.client.lrem(q.shard(k).keys.dead, 1, raw)):
            return 1
    return 0


def first(form: Mapping[str, list[str]], field: str) -> str:
    values = form.get(field)
    if not values or not values[0]:
        raise Refused(400, f"the form has no {field}")
    return values[0]


def create_app(
    url: str,
    *,
    token: str | None = None,
    prefix: str = DEFAULT_PREFIX,
    interval: float = POLL_INTERVAL,
    discover_every: float = DISCOVER_EVERY,
    hosts: Sequence[str] = LOOPBACK_HOSTS,
    cluster: bool = False,
) -> Starlette:
    """The dashboard of the server at ``url``. ``token``: what actions need (None: actions
    off). ``hosts``: the Host header values answered (``["*"]``: any). ``cluster``: ``url``
    names a node of a Redis Cluster, and the dashboard shows every primary's queues."""
    board = Dashboard(
        url,
        token=token,
        prefix=prefix,
        interval=interval,
        discover_every=discover_every,
        cluster=cluster,
    )
    routes = [
        Route("/", board.overview_page),
        Route("/queues/{name:path}", board.queue_page),
        Route("/topics/{name:path}", board.topic_page),
        Route("/events", board.overview_events),
        Route("/events/queues/{name:path}", board.queue_events),
        Route("/events/topics/{name:path}", board.topic_events),
        Route("/api/overview", board.overview_api),
        Route("/api/queues/{name:path}", board.queue_api),
        Route("/actions/{action}", board.action, methods=["POST"]),
        Route("/metrics", board.metrics),
        Route("/healthz", board.healthz),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    middleware = [
        Middleware(SecurityHeaders),
        Middleware(TrustedHostMiddleware, allowed_hosts=list(hosts)),
    ]
    app = Starlette(
        routes=routes,
        middleware=middleware,
        lifespan=board.lifespan,
        exception_handlers=dict.fromkeys(UNREACHABLE, board.unreachable),
    )
    app.state.dashboard = board
    return app


def serve(
    url: str,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    token: str | None = None,
    prefix: str = DEFAULT_PREFIX,
    cluster: bool = False,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Runs the dashboard on uvicorn until SIGINT/SIGTERM."""
    import uvicorn  # noqa: PLC0415 (only the command needs the server)

    app = create_app(url, token=token, prefix=prefix, hosts=allowed_hosts(host), cluster=cluster)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=2,  # open event streams do not hold up Ctrl-C
    )
    server = uvicorn.Server(config)
    if on_ready is not None:
        shown = f"[{host}]" if ":" in host else host
        on_ready(f"http://{shown}:{port}/")
    # uvicorn stops gracefully on SIGINT/SIGTERM, then raises the signal again for the
    # handler it found: with this one, a stop asked for is a clean return (exit status 0).
    asked = (signal.SIGINT, signal.SIGTERM)
    main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, stop_asked) for sig in asked} if main else {}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def stop_asked(sig: int, frame: Any) -> None:
    """What a stop signal does once uvicorn has stopped: nothing more."""
