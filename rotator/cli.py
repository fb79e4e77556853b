"""The ``rotator`` command: parse, call the API, print. Nothing else lives here.

Without ``--url`` (before the subcommand or after it) or ``ROTATOR_URL`` every command uses the
private embedded server. Exit status: 0 when the command did what was asked; 1 when it failed
or did only part of it; 2 for a bad argument. Errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import re
import shlex
import stat
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn, cast

import click
import redis
from click.core import ParameterSource
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from rotator import protocol
from rotator.core import Rotator
from rotator.defaults import (
    DEFAULT_DRAIN_BATCH,
    DEFAULT_DRAIN_MAX_DELIVERIES,
    DEFAULT_LEASE_TIMEOUT,
    DEFAULT_PUSH_CHUNK,
    DEFAULT_SPARK_MASTER,
    DEFAULT_SPARK_PUSH_BATCH,
    DEFAULT_TOPIC_RETENTION,
    DEFAULT_WORK_MAX_DELIVERIES,
    DISTRIBUTION,
    MAX_BATCH,
    MAX_COUNT,
    MAX_DELIVERIES_LIMIT,
    MAX_LEASE_SECONDS,
    MAX_RETENTION_COUNT,
    MAX_RETENTION_SECONDS,
    MAX_SCHEDULE_SECONDS,
)
from rotator.demo import run_demo
from rotator.discovery import ShardedQueue, find
from rotator.errors import RotatorError
from rotator.keys import queue_keys, topic_keys, validate_group_name
from rotator.models import (
    COUNTER_FIELDS,
    DeadLetter,
    Durations,
    Job,
    Stats,
    TopicStats,
    WorkSummary,
)
from rotator.registry import HELD_SHOWN, PRUNE_AFTER, STALE_AFTER, WorkerInfo
from rotator.retries import bounded_options
from rotator.script import function_name, module_path, module_sha, probe_mode
from rotator.server import EmbeddedServer
from rotator.sharded import MAX_SHARDS, ShardedRotator, cluster_client
from rotator.shell import CommandHandler, Stopper, missing_program
from rotator.topic import Retention, Topic, TopicGroup
from rotator.urls import check_url, client_from_url, connection_problem
from rotator.worker import Worker

EXIT_ERROR = 1
URL_KEY = "rotator.url"  # where --url (root or subcommand) or ROTATOR_URL is kept in ctx.meta
RETRY_KEY = "rotator.retry_for"  # where --retry-for (or ROTATOR_RETRY_FOR) is kept
RETRY_HELP = (
    "Send a queue or topic command again after a failover, a restart or a lost reply, for "
    "at most this long (Rotator's and Topic's retry_for; a plain push or a publish then goes "
    "under a marker, so it lands once).  "
    "[default: $ROTATOR_RETRY_FOR, else 0: off; a sharded queue's: 10]"
)
URL_HELP = (
    "Server: redis://HOST:PORT/DB, rediss://... (TLS), unix:///PATH, or "
    "redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE (the master Sentinels name).  "
    "[default: $ROTATOR_URL, else the embedded server]"
)


class CliError(click.ClickException):
    """A failure worth one line on stderr."""

    def show(self, file: Any = None) -> None:
        click.echo(f"rotator: error: {self.format_message()}", err=True)


def fail(message: str) -> NoReturn:
    raise CliError(message)


def remember_url(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """Checks a --url (or ROTATOR_URL) and keeps it for the command; the last one given wins,
    so ``rotator --url A push --url B`` uses B."""
    if value is None:
        return
    from_env = ctx.get_parameter_source(param.name or "url") is ParameterSource.ENVIRONMENT
    hint = "ROTATOR_URL" if from_env else None
    try:
        check_url(value)
    except ValueError as error:
        raise click.BadParameter(f"{value!r}: {error}", ctx, param, hint) from error
    ctx.meta[URL_KEY] = value


def remember_retry_for(ctx: click.Context, param: click.Parameter, value: float | None) -> None:
    """Keeps --retry-for (or ROTATOR_RETRY_FOR) for the command's queues (see retry_for)."""
    ctx.meta[RETRY_KEY] = value or 0.0


def url_param(envvar: str | None = None) -> click.Option:
    return click.Option(
        ["--url"],
        metavar="URL",
        envvar=envvar,
        expose_value=False,
        callback=remember_url,
        help=URL_HELP,
    )


def server_url(ctx: click.Context) -> str | None:
    url: str | None = ctx.meta.get(URL_KEY)
    return url


def where(ctx: click.Context) -> str:
    return server_url(ctx) or f"the embedded server ({EmbeddedServer().url})"


class ServerCommand(click.Command):
    """A command that talks to a server: it takes --url after its name too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params.append(url_param())


class RotatorGroup(click.Group):
    """One line on stderr for every error, usage errors included; never a traceback."""

    command_class: type[click.Command] | None = ServerCommand
    group_class = type  # subgroups are RotatorGroups too

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            returned = super().main(args, prog_name, complete_var, False, **extra)
        except click.UsageError as error:
            command = error.ctx.command_path if error.ctx is not None else "rotator"
            click.echo(f"rotator: error: {error.format_message()} (see {command} -h)", err=True)
            sys.exit(error.exit_code)
        except click.ClickException as error:
            error.show()
            sys.exit(error.exit_code)
        except click.Abort:
            click.echo("rotator: error: aborted", err=True)
            sys.exit(EXIT_ERROR)
        sys.exit(returned if isinstance(returned, int) else 0)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except redis.ConnectionError as error:
            raise CliError(f"cannot reach {where(ctx)}: {connection_problem(error)}") from error
        except (RotatorError, redis.RedisError) as error:
            raise CliError(str(error)) from error


# click 8.5 made ParamType generic (its value and the input it converts); an older click,
# which the package allows, cannot subscript it: the subscripted types are for mypy only.
if TYPE_CHECKING:
    SecondsType = click.ParamType[float, Any]
    MomentType = click.ParamType[datetime, Any]
    RateType = click.ParamType[tuple[int, float] | None, Any]
else:
    SecondsType = MomentType = RateType = click.ParamType


class Seconds(SecondsType):
    """A finite number of seconds in ``low..high`` (``low`` itself only with ``zero``)."""

    name = "SECONDS"

    def __init__(self, high: float = MAX_LEASE_SECONDS, *, zero: bool = False) -> None:
        self.high = high
        self.zero = zero

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        low_ok = seconds >= 0 if self.zero else seconds > 0
        if not (low_ok and seconds <= self.high):  # NaN fails both
            span = "from 0 to" if self.zero else "above 0 and at most"
            self.fail(f"{value!r} is not {span} {self.high:g} seconds", param, ctx)
        return seconds


class Moment(MomentType):
    """A moment: ISO 8601 with a time zone (``2026-12-01T09:00:00Z``) or unix seconds."""

    name = "TIME"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, datetime):
            return value
        try:
            return datetime.fromtimestamp(float(value)).astimezone()
        except (TypeError, ValueError, OverflowError, OSError):
            pass
        try:
            moment = datetime.fromisoformat(str(value))
        except ValueError:
            self.fail(f"{value!r} is not an ISO 8601 time or unix seconds", param, ctx)
        if moment.tzinfo is None:
            self.fail(f"{value!r} has no time zone (end it in Z or +hh:mm)", param, ctx)
        return moment


def emit(ctx: click.Context, data: Any, text: str) -> None:
    """Prints ``data`` as JSON under --json, else the human ``text`` (if any)."""
    if ctx.params.get("json"):
        click.echo(json.dumps(data, sort_keys=True))
    elif text:
        click.echo(text)


def lines(rows: Iterable[str]) -> str:
    return "\n".join(rows)


def retry_for(ctx: click.Context) -> dict[str, float]:
    """The queue options --retry-for gives: ``{"retry_for": S}``, or none."""
    seconds: float = ctx.meta.get(RETRY_KEY, 0.0)
    return {"retry_for": seconds} if seconds else {}


def open_client(ctx: click.Context) -> redis.Redis:
    url = server_url(ctx)
    if url:
        # (with --retry-for, redis-py's own retries off and socket timeouts set, as from_url)
        return client_from_url(url, **bounded_options({}, Retry) if retry_for(ctx) else {})
    embedded = EmbeddedServer()
    embedded.start()
    return embedded.client()


def open_queue(
    ctx: click.Context, name: str, *, must_exist: bool = True, **options: Any
) -> Rotator:
    queue_keys(name)  # a bad name fails before any connection is made
    rotator = Rotator(open_client(ctx), name, **{**retry_for(ctx), **options})
    if must_exist and not rotator.exists():
        fail(f"unknown queue {name!r} on {where(ctx)}")
    return rotator


json_option = click.option("--json", "json", is_flag=True, help="Print JSON.")
count_option = click.option(
    "--count",
    type=click.IntRange(1, MAX_COUNT),
    default=1,
    show_default=True,
    help="Jobs to lease.",
)
lease_option = click.option(
    "--timeout",
    type=Seconds(),
    default=DEFAULT_LEASE_TIMEOUT,
    show_default=True,
    help="Lease: seconds a job is held before another consumer may take it.",
)
block_option = click.option(
    "--block",
    type=Seconds(zero=True),
    default=None,
    help="Seconds to wait for a job when there is none (woken by the next push).",
)
delay_option = click.option(
    "--delay",
    type=Seconds(zero=True),
    default=0.0,
    show_default=True,
    help="Seconds before the job is delivered again.",
)


@click.group(
    cls=RotatorGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="Exit status: 0 done, 1 failed or done in part, 2 bad arguments. "
    "Every command takes -h.",
)
@click.option(
    "--url",
    metavar="URL",
    envvar="ROTATOR_URL",
    expose_value=False,
    callback=remember_url,
    help=URL_HELP,
)
@click.option(
    "--retry-for",
    type=Seconds(3600, zero=True),
    envvar="ROTATOR_RETRY_FOR",
    expose_value=False,
    callback=remember_retry_for,
    help=RETRY_HELP,
)
@click.version_option(package_name=DISTRIBUTION)
def main() -> None:
    """rotator: a reliable job queue for Redis and Valkey.

    \b
    Example:
      rotator push orders order-1 order-2
      rotator work orders -- ./ship.sh {}
    """


# -- queues -----------------------------------------------------------------------------------


def read_ids(values: Sequence[str]) -> Iterator[str]:
    for value in values:
        if value == "-":
            for line in sys.stdin:
                if line := line.rstrip("\r\n"):
                    yield line
        else:
            yield value


def stdin_file_bytes() -> int | None:
    """Bytes left to read on stdin when it is a regular file (``< ids.txt``), else None."""
    try:
        fd = sys.stdin.fileno()
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        return max(info.st_size - os.lseek(fd, 0, os.SEEK_CUR), 0)
    except (OSError, ValueError):  # no descriptor (a test's stdin), or not seekable
        return None


class PushMeter:
    """What a push from stdin shows on a terminal: a bar over the bytes of a stdin file, or a
    running count of ids pushed when the length is unknown (a pipe). Silent elsewhere."""

    def __init__(self, ids: Sequence[str]) -> None:
        self.shown = "-" in ids and sys.stderr.isatty()
        size = stdin_file_bytes() if self.shown else None
        self.bar: Any = None
        if size:
            self.bar = click.progressbar(length=size, label="pushing", file=sys.stderr)
            self.bar.render_progress()
        self.size = size or 0
        self.read = 0

    def line(self, job_id: str) -> None:
        if self.bar is not None:
            self.read += len(job_id.encode()) + 1

    def pushed(self, total: int) -> None:
        if not self.shown:
            return
        if self.bar is None:
            click.echo(f"\rpushed {total}", nl=False, err=True)
            return
        self.bar.update(min(self.read, self.size) - self.bar.pos)

    def finish(self, total: int) -> None:
        if not self.shown:
            return
        if self.bar is None:
            click.echo(f"\rpushed {total}", err=True)
            return
        self.bar.update(self.size - self.bar.pos)
        self.bar.render_finish()


shards_option = click.option(
    "--shards",
    type=click.IntRange(1, MAX_SHARDS),
    default=None,
    help="QUEUE is a sharded queue of this many shards on the Redis Cluster at --url "
    "(the count is stored with the queue: another is refused).",
)


def open_sharded(
    ctx: click.Context, name: str, shards: int, *, must_exist: bool = True, **options: Any
) -> Rotator:
    """A sharded queue (rotator.sharded), seen through the Rotator methods the commands
    that take --shards call: ShardedRotator has each of them (the commands whose operation
    it lacks refuse --shards: see refuse_shards)."""
    queue_keys(name)  # a bad name fails before any connection is made
    with cluster_errors(ctx):
        url = cluster_url(ctx, "--shards")
        options = {**retry_for(ctx), **options}
        sharded = ShardedRotator(cluster_client(url), name, shards=shards, **options)
        if must_exist and not sharded.exists():
            fail(f"unknown queue {name!r} on {where(ctx)}")
    return cast("Rotator", sharded)


def open_either(
    ctx: click.Context, name: str, shards: int | None, *, must_exist: bool = True, **options: Any
) -> Rotator:
    """QUEUE as a plain queue, or as a sharded queue of ``shards`` shards (--shards)."""
    if shards is None:
        return open_queue(ctx, name, must_exist=must_exist, **options)
    return open_sharded(ctx, name, shards, must_exist=must_exist, **options)


def refuse_shards(ctx: click.Context, shards: int | None, what: str, method: str) -> None:
    """--shards on a command whose operation ShardedRotator does not offer: a usage error
    saying so, before anything is sent."""
    if shards is not None:
        raise click.UsageError(
            f"--shards: sharded queues do not offer {what} (ShardedRotator has no {method})", ctx
        )


@main.command()
@click.argument("queue")
@click.argument("ids", nargs=-1, required=True)
@shards_option
@click.option(
    "--delay",
    type=Seconds(MAX_SCHEDULE_SECONDS, zero=True),
    help="Deliver no sooner than this many seconds from now (server clock).",
)
@click.option("--at", "at", type=Moment(), help="Deliver no sooner than this time.")
@click.option(
    "--unique",
    is_flag=True,
    help="Skip ids the queue holds; refused unless it tracks ids (rotator track-ids).",
)
@click.option(
    "--priority",
    type=click.IntRange(0, 9),
    default=0,
    show_default=True,
    help="0 (most urgent) to 9: every job of a more urgent level goes first.",
)
@json_option
@click.pass_context
def push(
    ctx: click.Context,
    queue: str,
    ids: tuple[str, ...],
    shards: int | None,
    delay: float | None,
    at: datetime | None,
    unique: bool,
    priority: int,
    json: bool,
) -> None:
    """Push job IDS to QUEUE; prints how many. `-` reads one id per line from stdin.

    Every 1000 ids go in one atomic call; a bad id stops the push before its batch is sent.
    With --delay or --at the jobs are scheduled: kept apart until due, then queued (an id
    scheduled again moves to its new time). A queue that tracks ids holds each id once:
    ids it holds are skipped, and not counted; --unique makes that a requirement.

    \b
    Examples:
      rotator push orders order-1 order-2
      seq 1 100000 | rotator push orders -
      rotator push orders report-7 --delay 30
      rotator push orders newsletter --at 2026-12-01T09:00:00Z
      rotator push orders order-1 --unique
      rotator push orders nightly-export --priority 5
      rotator --url redis://node-1:7000 push orders order-1 --shards 12
    """
    if delay is not None and at is not None:
        raise click.UsageError("give --delay or --at, not both")
    q = open_either(ctx, queue, shards, must_exist=False)
    meter = PushMeter(ids)
    total = 0
    batch: list[str] = []
    for job_id in read_ids(ids):
        protocol.encode_id(job_id)  # refuse a bad line before sending its batch
        batch.append(job_id)
        meter.line(job_id)
        if len(batch) == DEFAULT_PUSH_CHUNK:
            total += q.push_many(batch, delay=delay, at=at, unique=unique, priority=priority)
            batch = []
            meter.pushed(total)
    if batch:
        total += q.push_many(batch, delay=delay, at=at, unique=unique, priority=priority)
    meter.finish(total)
    emit(ctx, {"pushed": total}, str(total))


class Rate(RateType):
    """A rate limit: ``JOBS/PERIOD`` with PERIOD ``s``, ``m``, ``h`` or seconds (``5s``), or
    ``off``."""

    name = "RATE"
    _FORM = re.compile(r"(\d+)/(\d*\.?\d*)(s|m|h)")
    _UNIT: ClassVar[dict[str, float]] = {"s": 1.0, "m": 60.0, "h": 3600.0}

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value == "off":
            return None
        found = self._FORM.fullmatch(str(value))
        if not found:
            self.fail(f"{value!r} is not JOBS/PERIOD (100/s, 5/m, 10/30s) or off", param, ctx)
        jobs, count, unit = found.groups()
        per = float(count or 1) * self._UNIT[unit]
        if int(jobs) < 1 or not 0 < per <= MAX_LEASE_SECONDS:
            self.fail(f"{value!r}: at least 1 job per a period of at most a day", param, ctx)
        return int(jobs), per


@main.command()
@click.argument("queue")
@click.argument("rate", type=Rate())
@shards_option
@json_option
@click.pass_context
def limit(
    ctx: click.Context, queue: str, rate: tuple[int, float] | None, shards: int | None, json: bool
) -> None:
    """Hand out at most RATE jobs of QUEUE (100/s, 5/m, 10/30s), across every consumer, or
    lift the limit (off).

    \b
    Examples:
      rotator limit orders 100/s
      rotator limit orders off
    """
    refuse_shards(ctx, shards, "rate limits", "set_rate_limit")
    q = open_queue(ctx, queue, must_exist=False)
    if rate is None:
        q.set_rate_limit(None)
        emit(ctx, {"rate_limit": None}, "no limit")
        return
    jobs, per = rate
    q.set_rate_limit(jobs, per)
    emit(ctx, {"rate_limit": {"jobs": jobs, "per": per}}, f"at most {jobs} per {per:g} s")


@main.command()
@click.argument("queue")
@shards_option
@json_option
@click.pass_context
def pause(ctx: click.Context, queue: str, shards: int | None, json: bool) -> None:
    """Stop QUEUE handing out jobs until `rotator resume`, for every consumer.

    Pushes, acks and leases already out go on; blocked consumers stay blocked.

    \b
    Example:
      rotator pause orders
    """
    changed = open_either(ctx, queue, shards, must_exist=False).pause()
    emit(ctx, {"paused": True, "changed": changed}, "paused" if changed else "already paused")


@main.command()
@click.argument("queue")
@shards_option
@json_option
@click.pass_context
def resume(ctx: click.Context, queue: str, shards: int | None, json: bool) -> None:
    """Let a paused QUEUE hand out jobs again, waking blocked consumers.

    \b
    Example:
      rotator resume orders
    """
    changed = open_either(ctx, queue, shards, must_exist=False).resume()
    emit(ctx, {"paused": False, "changed": changed}, "resumed" if changed else "not paused")


@main.command(name="track-ids")
@click.argument("queue")
@click.argument("state", type=click.Choice(["on", "off"]))
@shards_option
@json_option
@click.pass_context
def track_ids(ctx: click.Context, queue: str, state: str, shards: int | None, json: bool) -> None:
    """Make QUEUE keep an index of its ids (on), which unique pushes and cancel need, or
    drop it (off). On only while the queue holds no job.

    \b
    Examples:
      rotator track-ids emails on
      rotator track-ids emails off
    """
    q = open_either(ctx, queue, shards, must_exist=False)
    settings = q.configure(track_ids=state == "on")
    emit(ctx, {"track_ids": settings.track_ids}, "on" if settings.track_ids else "off")


@main.command()
@click.argument("queue")
@click.argument("ids", nargs=-1, required=True)
@shards_option
@json_option
@click.pass_context
def cancel(
    ctx: click.Context, queue: str, ids: tuple[str, ...], shards: int | None, json: bool
) -> None:
    """Cancel jobs of QUEUE by id: scheduled, waiting or in flight, none is delivered again
    (an in-flight job's ack is refused). Prints how many were found. Needs a queue that
    tracks ids (rotator track-ids). `-` reads one id per line from stdin.

    \b
    Example:
      rotator cancel emails mail-7 mail-8
    """
    found = open_either(ctx, queue, shards, must_exist=False).cancel(*read_ids(ids))
    emit(ctx, {"cancelled": found}, str(found))


def payload_text(payload: bytes | None) -> str | None:
    return None if payload is None else payload.decode("utf-8", "backslashreplace")


def job_dict(job: Job, payloads: bool = False) -> dict[str, Any]:
    data = {
        "id": job.id,
        "token": job.token,
        "deliveries": job.deliveries,
        "reclaimed": job.reclaimed,
        "deadline_ms": job.deadline_ms,
    }
    if payloads:
        data["payload"] = payload_text(job.payload)
    return data


def job_line(job: Job, payloads: bool) -> str:
    if not payloads:
        return f"{job.id}\t{job.token}"
    # One line per job whatever the payload holds: escapes as in Python's repr.
    shown = (payload_text(job.payload) or "").encode("unicode_escape").decode("ascii")
    return f"{job.id}\t{job.token}\t{shown}"


def lease_jobs(
    ctx: click.Context, q: Rotator, count: int, block: float | None, payloads: bool = False
) -> None:
    jobs = q.next(count, block)
    data = [job_dict(job, payloads) for job in jobs]
    emit(ctx, data, lines(job_line(job, payloads) for job in jobs))


@main.command(name="next")
@click.argument("queue")
@count_option
@lease_option
@block_option
@shards_option
@json_option
@click.pass_context
def next_(
    ctx: click.Context,
    queue: str,
    count: int,
    timeout: float,
    block: float | None,
    shards: int | None,
    json: bool,
) -> None:
    """Lease jobs of QUEUE; prints one `ID<TAB>TOKEN` line per job (none: prints nothing).

    Ack each job with its token before the lease runs out, or it is delivered again. With
    --block, waits for a job, even on a queue nobody has pushed to yet.

    \b
    Examples:
      rotator next orders --count 10 --timeout 60
      rotator next orders --block 30 --json
    """
    q = open_either(ctx, queue, shards, must_exist=block is None, timeout=timeout)
    lease_jobs(ctx, q, count, block)


def settle(ctx: click.Context, done: int, tokens: Sequence[str], key: str) -> None:
    emit(ctx, {key: done}, str(done))
    if done < len(tokens):
        fail(f"{len(tokens) - done} of {len(tokens)} tokens refused: their leases were lost")


@main.command()
@click.argument("queue")
@click.argument("tokens", nargs=-1, required=True)
@shards_option
@json_option
@click.pass_context
def ack(
    ctx: click.Context, queue: str, tokens: tuple[str, ...], shards: int | None, json: bool
) -> None:
    """Complete deliveries of QUEUE by token; prints how many were accepted.

    Exits 1 when a token was refused (its lease was re-issued, nacked or dead-lettered).

    \b
    Example:
      rotator ack orders 'order-1*1732233600000.1.2'
    """
    settle(ctx, open_either(ctx, queue, shards).ack(*tokens), tokens, "acked")


@main.command()
@click.argument("queue")
@click.argument("tokens", nargs=-1, required=True)
@delay_option
@shards_option
@json_option
@click.pass_context
def nack(
    ctx: click.Context,
    queue: str,
    tokens: tuple[str, ...],
    delay: float,
    shards: int | None,
    json: bool,
) -> None:
    """Give deliveries of QUEUE back, to be delivered again after --delay seconds.

    \b
    Example:
      rotator nack orders 'order-2*1732233600000.1.3' --delay 5
    """
    q = open_either(ctx, queue, shards)
    settle(ctx, q.nack(*tokens, delay=delay), tokens, "nacked")


@main.command()
@click.argument("queue")
@click.argument("tokens", nargs=-1, required=True)
@click.option("--error", default="", help="Why, kept in the dead letter (at most 4096 bytes).")
@shards_option
@json_option
@click.pass_context
def bury(
    ctx: click.Context,
    queue: str,
    tokens: tuple[str, ...],
    error: str,
    shards: int | None,
    json: bool,
) -> None:
    """Send deliveries of QUEUE to the dead letters now, keeping --error in each letter.

    \b
    Example:
      rotator bury orders 'order-2*1732233600000.1.3' --error 'card declined'
    """
    q = open_either(ctx, queue, shards)
    settle(ctx, q.bury(*tokens, error=error), tokens, "buried")


def stats_table(title: str, values: dict[str, Any]) -> str:
    rows = [title]
    for key, value in values.items():
        shown = "-" if value is None else (f"{value:.3f} s" if isinstance(value, float) else value)
        rows.append(f"  {key:<20} {shown}")
    return "\n".join(rows)


@main.command()
@click.argument("queue")
@click.option("--watch", is_flag=True, help="Refresh every --interval seconds until Ctrl-C.")
@click.option(
    "--interval",
    type=Seconds(),
    default=1.0,
    show_default=True,
    help="Seconds between refreshes with --watch.",
)
@shards_option
@json_option
@click.pass_context
def stats(
    ctx: click.Context, queue: str, watch: bool, interval: float, shards: int | None, json: bool
) -> None:
    """Counts of QUEUE, in jobs (length = pending + in_flight + done + deferred + overdue).

    \b
    pending     pushed, never leased
    in_flight   leased, its lease not run out
    done        acked; its element goes at the next walk that reaches it
    deferred    given back (nacked), waiting for its delay
    dead        in the dead letters (see `rotator dead`)
    overdue     lease run out, not yet reclaimed by a consumer (counted from
                the oldest leases, at most 1000: "1000+" when there may be more)
    oldest_pending_age  seconds since the oldest pending job was pushed
    scheduled   pushed for later (--delay/--at), not yet queued (a due one
                is, at the next claim); not in length
    paused      handing out nothing until `rotator resume`
    schedules   recurring schedules (`rotator schedule list`)
    rate_limit  jobs per period handed out at most (`rotator limit`)
    prioritized of pending, those pushed with --priority 1..9
    pushed, delivered, completed, retried, reclaimed, dead_lettered, cancelled
                counts since the queue was made; --watch shows each one's rate
                beside it (per second, over the last interval)
    durations   processing times the worker loops reported: p50/p95/p99

    \b
    Examples:
      rotator stats orders
      rotator stats orders --watch --interval 5
      rotator --url redis://node-1:7000 stats orders --shards 12   (all shards added up)
    """
    q = open_either(ctx, queue, shards)
    before: tuple[float, dict[str, Any]] | None = None
    while True:
        q_stats = q.stats()
        values = q_stats.as_dict()
        now = time.monotonic()
        if watch and not json:
            click.clear()
        shown = dict(values)
        if shown.pop("overdue_capped"):
            shown["overdue"] = f"{values['overdue']}+"
        limit = shown["rate_limit"]
        shown["rate_limit"] = "-" if limit is None else f"{limit['jobs']}/{limit['per']:g}s"
        shown["durations"] = durations_text(q_stats.durations)
        if before is not None:
            data = {**values, "rates": rates(before[1], values, now - before[0])}
            for name, rate in data["rates"].items():
                shown[name] = f"{values[name]}  ({rate:,.1f}/s)"
        else:
            data = values
        emit(ctx, data, stats_table(f"queue {queue}", shown))
        if not watch:
            return
        before = (now, values)
        try:
            time.sleep(interval)
        except KeyboardInterrupt:
            return


def durations_text(durations: Durations | None) -> str:
    """``p50 <= 4 ms  p95 <= 64 ms  p99 <= 128 ms  (1,024 jobs)``, or ``-`` with none."""
    if durations is None or not durations.total:
        return "-"
    parts = []
    for name in ("p50", "p95", "p99"):
        bound = getattr(durations, name)
        parts.append(f"{name} <= {bound * 1000:g} ms" if bound != math.inf else f"{name} > 4.7 h")
    return "  ".join(parts) + f"  ({durations.total:,} jobs)"


def rates(before: dict[str, Any], after: dict[str, Any], seconds: float) -> dict[str, float]:
    """Per second, each count since the queue was made, between two reads ``seconds`` apart
    (a queue deleted and made again in between counts from 0: its rate is not shown)."""
    found = {}
    for name in COUNTER_FIELDS:
        old, new = before.get(name), after.get(name)
        if old is not None and new is not None and new >= old and seconds > 0:
            found[name] = (new - old) / seconds
    return found


limit_option = click.option(
    "--limit",
    type=click.IntRange(1, MAX_COUNT),
    default=20,
    show_default=True,
    help="Most elements to show.",
)


@main.command()
@click.argument("queue")
@limit_option
@shards_option
@json_option
@click.pass_context
def peek(ctx: click.Context, queue: str, limit: int, shards: int | None, json: bool) -> None:
    """Show the elements of QUEUE next in line, with their state, changing nothing.

    \b
    Example:
      rotator peek orders --limit 50
    """
    refuse_shards(ctx, shards, "peek", "peek")
    entries = open_queue(ctx, queue).peek(limit)
    now_ms = int(time.time() * 1000)

    rows = []
    for entry in entries:
        when = f"{(entry.time_ms - now_ms) / 1000:+.1f} s" if entry.time_ms else ""
        rows.append(f"{entry.state:<9} {when:>10}  {entry.element}")
    data = [{"element": e.element, "state": e.state, "time_ms": e.time_ms} for e in entries]
    emit(ctx, data, lines(rows))


def dead_letters(
    ctx: click.Context, q: Rotator, ids: tuple[str, ...], requeue: bool, limit: int
) -> None:
    if requeue:
        moved = q.requeue_dead(*ids)
        emit(ctx, {"requeued": moved}, str(moved))
        return
    if ids:
        fail("IDS are only used with --requeue")
    letters = q.dead(0, limit)
    data = [
        {
            "id": d.id,
            "reason": d.reason,
            "deliveries": d.deliveries,
            "died_ms": d.died_ms,
            "error": d.error,
        }
        for d in letters
    ]
    emit(ctx, data, lines(dead_letter_line(d) for d in letters))


def dead_letter_line(letter: DeadLetter) -> str:
    """`ID<TAB>REASON<TAB>DELIVERIES`, then the error of a failed job on the same line."""
    line = f"{letter.id}\t{letter.reason}\t{letter.deliveries}"
    return line if letter.error is None else f"{line}\t{' '.join(letter.error.split())}"


@main.command()
@click.argument("queue")
@click.argument("ids", nargs=-1)
@click.option("--requeue", is_flag=True, help="Move the letters (all, or those of IDS) back.")
@click.option(
    "--limit",
    type=click.IntRange(1, MAX_COUNT),
    default=100,
    show_default=True,
    help="Most letters to list.",
)
@shards_option
@json_option
@click.pass_context
def dead(
    ctx: click.Context,
    queue: str,
    ids: tuple[str, ...],
    requeue: bool,
    limit: int,
    shards: int | None,
    json: bool,
) -> None:
    """List the dead letters of QUEUE (`ID<TAB>REASON<TAB>DELIVERIES[<TAB>ERROR]`), or requeue them.

    REASON is max_deliveries (its lease ran out, or it was nacked, once too often), failed
    (a worker's last delivery failed: ERROR is what it said) or corrupt.

    \b
    Examples:
      rotator dead orders
      rotator dead orders --requeue order-7
    """
    dead_letters(ctx, open_either(ctx, queue, shards), ids, requeue, limit)


def counts_line(values: dict[str, Any]) -> str:
    """``name value`` pairs of a stats dict on one line (what is set)."""
    shown = []
    for key, value in values.items():
        if value is None or value is False:
            continue
        shown.append(f"{key} {value:.3f}s" if isinstance(value, float) else f"{key} {value}")
    return "  ".join(shown)


cluster_option = click.option(
    "--cluster",
    is_flag=True,
    help="--url names a node of a Redis Cluster: read every primary (needs --url).",
)


def cluster_url(ctx: click.Context, flag: str = "--cluster") -> str:
    """--url, a node of the Redis Cluster that ``flag`` asks for."""
    url = server_url(ctx)
    if url is None:
        raise click.UsageError(
            f"{flag} needs --url (or ROTATOR_URL): the embedded server is not a cluster", ctx
        )
    return url


@contextmanager
def cluster_errors(ctx: click.Context) -> Iterator[None]:
    """A RedisClusterException is no RedisError: one line for it too, never a traceback."""
    try:
        yield
    except RedisClusterException as error:
        fail(f"Redis Cluster at {where(ctx)}: {error}")


def open_cluster(ctx: click.Context) -> RedisCluster:
    """A cluster client seeded by --url: any node will do, the client learns the others
    from the slot map (as ``Rotator.from_url(url, name, cluster=True)``)."""
    url = cluster_url(ctx)
    with cluster_errors(ctx):
        return cluster_client(url)


def refuse_cluster_node(ctx: click.Context, client: redis.Redis) -> None:
    """Without --cluster, a cluster node's SCAN would list its own queues alone: refused,
    saying what to add, rather than showing part of the cluster as if it were all."""
    try:
        enabled = client.info("cluster").get("cluster_enabled")
    except redis.ResponseError:  # INFO not allowed to this user (an ACL): nothing to tell
        return
    if enabled:
        raise click.UsageError(
            f"{where(ctx)} is a node of a Redis Cluster: add --cluster to read every primary",
            ctx,
        )


def open_discovery_client(ctx: click.Context, cluster: bool) -> redis.Redis | RedisCluster:
    if cluster:
        return open_cluster(ctx)
    client = open_client(ctx)
    refuse_cluster_node(ctx, client)
    return client


def read_all(
    client: redis.Redis | RedisCluster, prefix: str
) -> tuple[dict[str, Stats | RotatorError], dict[str, TopicStats], dict[str, ShardedQueue]]:
    """Every queue's and topic's stats, found by SCAN (on each primary of a cluster), queues
    sorted by name, and the sharded queues found, by name. A sharded queue's stats are its
    shards' added up (ShardedRotator.stats), under its logical name."""
    found = find(client, prefix=prefix)
    # A queue whose keys someone broke (a key of another type) is listed with its error.
    queue_stats: dict[str, Stats | RotatorError] = {}
    for name in found.queues:
        try:
            queue_stats[name] = Rotator(client, name, prefix=prefix).stats()
        except RotatorError as error:
            queue_stats[name] = error
    sharded = {queue.name: queue for queue in found.sharded}
    cluster = cast("RedisCluster", client)  # a ShardedRotator reads any client
    for queue in found.sharded:
        try:
            queue_stats[queue.name] = ShardedRotator(
                cluster, queue.name, shards=queue.shards, prefix=prefix
            ).stats()
        except RotatorError as error:
            queue_stats[queue.name] = error
    topic_stats = {name: Topic(client, name, prefix=prefix).stats() for name in found.topics}
    return dict(sorted(queue_stats.items())), topic_stats, sharded


@main.command()
@click.option("--prefix", default="rotator", show_default=True, help="Key prefix of the queues.")
@cluster_option
@json_option
@click.pass_context
def queues(ctx: click.Context, prefix: str, cluster: bool, json: bool) -> None:
    """List every queue and topic on the server (or every primary of a cluster), with their
    counts.

    Found with SCAN (never KEYS), in bounded steps, on each primary of a cluster: a queue is
    listed from its first push, a topic from its first subscribe or publish, until they are
    deleted. A sharded queue (--shards) is one line, "sharded NAME N shards", with its
    shards' counts added up; its shard queues are not listed on their own.

    \b
    Examples:
      rotator queues --url redis://localhost:6379/0
      rotator queues --cluster --url redis://node-1:7000
    """
    client = open_discovery_client(ctx, cluster)
    with cluster_errors(ctx):
        queue_stats, topic_stats, sharded = read_all(client, prefix)

    def kind(name: str) -> dict[str, Any]:
        queue = sharded.get(name)
        if queue is None:
            return {"kind": "queue"}
        return {"kind": "sharded", "shards": queue.shards, "shard_queues": list(queue.shard_names)}

    data = {
        "queues": {
            name: {
                **kind(name),
                **({"error": str(s)} if isinstance(s, RotatorError) else s.as_dict()),
            }
            for name, s in queue_stats.items()
        },
        "topics": {
            name: {
                "retained": s.retained,
                "bytes": s.bytes,
                "groups": {group: g.as_dict() for group, g in s.groups.items()},
            }
            for name, s in topic_stats.items()
        },
    }
    rows = [
        (
            f"sharded  {name}  {sharded[name].shards} shards  "
            if name in sharded
            else f"queue  {name}  "
        )
        + (f"error: {s}" if isinstance(s, RotatorError) else counts_line(s.as_dict()))
        for name, s in queue_stats.items()
    ]
    for name, t in topic_stats.items():
        rows.append(f"topic  {name}  retained {t.retained}  bytes {t.bytes}")
        rows.extend(f"  group {g}  {counts_line(s.as_dict())}" for g, s in t.groups.items())
    emit(ctx, data, lines(rows) if rows else f"no queues or topics on {where(ctx)}")


def confirm(question: str, yes: bool) -> None:
    """Asks on the terminal (or reads stdin) unless --yes; anything but yes fails."""
    if yes:
        return
    try:
        agreed = click.confirm(question, err=True)
    except click.Abort:
        fail("nothing deleted: no answer (--yes deletes without asking)")
    if not agreed:
        fail("nothing deleted")


def brief(stats: Stats) -> str:
    return f"{stats.pending} pending, {stats.in_flight} in flight, {stats.dead} dead"


@main.command()
@click.argument("queue")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@shards_option
@json_option
@click.pass_context
def delete(ctx: click.Context, queue: str, yes: bool, shards: int | None, json: bool) -> None:
    """Delete QUEUE and everything in it: pending, leased and dead jobs, payloads.

    Asks first, unless --yes. Workers holding its jobs will find their leases gone.

    \b
    Examples:
      rotator delete orders
      rotator delete orders --yes
    """
    q = open_either(ctx, queue, shards)
    confirm(f"Delete queue {queue!r} ({brief(q.stats())}) on {where(ctx)}?", yes)
    deleted = q.delete()
    emit(ctx, {"deleted": deleted}, f"deleted {queue}")


# -- rotator work: a shell command per job ------------------------------------------------------


@contextmanager
def log_lines(verbose: bool) -> Iterator[None]:
    """rotator's log records as `rotator: ...` lines on stderr while a command runs."""
    logger = logging.getLogger("rotator")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("rotator: %(message)s"))
    saved = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if verbose else logging.WARNING)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


def summary_dict(summary: WorkSummary) -> dict[str, int]:
    return {
        "completed": summary.completed,
        "retried": summary.retried,
        "dead": summary.dead,
        "failed_deliveries": summary.failed,
        "leases_lost": summary.leases_lost,
        "cancelled": summary.cancelled,
    }


def summary_line(summary: WorkSummary) -> str:
    line = f"completed {summary.completed}, retried {summary.retried}, dead {summary.dead}"
    if summary.leases_lost:
        line += f", leases lost {summary.leases_lost}"
    if summary.cancelled:
        line += f" ({summary.cancelled} cancelled)"
    return line


def run_commands(
    ctx: click.Context,
    q: Rotator,
    what: str,
    command: tuple[str, ...],
    *,
    concurrency: int,
    until_empty: bool,
    verbose: bool,
    dead_hint: str,
    payload_stdin: bool = False,
) -> None:
    if command[0].startswith("-"):
        raise click.UsageError(f"no such option: {command[0]} (the command goes after --)", ctx)
    if (program := missing_program(command)) is not None:
        fail(f"cannot run {program!r}: not found or not executable")
    handler = CommandHandler(command, payload_stdin=payload_stdin)
    worker = Worker(q, handler, concurrency=concurrency)
    stopper = Stopper(worker.stop, handler)
    limit = q.max_deliveries
    pending = q.stats().pending  # also: the server answers and the keys are the queue's
    click.echo(
        f"rotator: working on {what} ({pending} pending) at {where(ctx)}: "
        f"{shlex.join(command)}; concurrency "
        f"{concurrency}, lease {q.timeout:g} s, "
        f"{f'at most {limit} deliveries' if limit else 'no delivery limit'}"
        f"{', until empty' if until_empty else ''}. Ctrl-C finishes the running jobs and stops",
        err=True,
    )
    with log_lines(verbose):
        stopper.install()
        try:
            summary = worker.run(stop_when_empty=until_empty, install_signal_handlers=False)
        finally:
            stopper.restore()
    emit(ctx, summary_dict(summary), summary_line(summary))
    if summary.dead:
        fail(f"{summary.dead} job(s) went to the dead letters: {dead_hint}")


def work_options(command: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option(
            "--concurrency",
            type=click.IntRange(1, 1024),
            default=1,
            show_default=True,
            help="Commands run at once.",
        ),
        lease_option,
        click.option(
            "--max-deliveries",
            type=click.IntRange(0, MAX_DELIVERIES_LIMIT),
            default=DEFAULT_WORK_MAX_DELIVERIES,
            show_default=True,
            help="Deliveries before a failing job goes to the dead letters (0: no limit).",
        ),
        click.option("--until-empty", is_flag=True, help="Stop when nothing is left to do."),
        click.option("-v", "--verbose", is_flag=True, help="One line per job completed."),
        json_option,
    ]
    for option in reversed(options):
        command = option(command)
    return command


def doc(*parts: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Sets a command's help from shared parts (click reads it from the docstring)."""

    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        function.__doc__ = "\n\n".join(parts)
        return function

    return decorate


WORK_HELP = """Exit status 0 acks the job; any other status gives it back, to be retried after 1, 2,
4 ... seconds until --max-deliveries, when it goes to the dead letters instead. The command
runs in a process group of its own, with the job in $ROTATOR_JOB_ID and $ROTATOR_DELIVERIES.

Ctrl-C or SIGTERM: no new jobs; the running ones finish and are acked, then the worker
exits. A second Ctrl-C sends SIGTERM to the running commands (their jobs are given back), a
third kills them. Prints the jobs completed, retried and dead; exits 1 when a job went to
the dead letters. -v adds a line per job completed."""


@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("queue")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@work_options
@shards_option
@click.pass_context
@doc(
    "Run COMMAND once per job of QUEUE: `{}` in it becomes the job id (with no `{}`, the id "
    "is its last argument). Put `--` before COMMAND. Its stdin is /dev/null.",
    WORK_HELP,
    "\b\nExamples:\n  rotator work orders -- ./ship.sh {}\n"
    "  rotator work orders --concurrency 4 --until-empty -v -- sh -c 'curl -fsS \"$API/{}\"'",
)
def work(
    ctx: click.Context,
    queue: str,
    command: tuple[str, ...],
    concurrency: int,
    timeout: float,
    max_deliveries: int,
    until_empty: bool,
    verbose: bool,
    json: bool,
    shards: int | None,
) -> None:
    options: dict[str, Any] = {"timeout": timeout, "max_deliveries": max_deliveries or None}
    q = open_either(ctx, queue, shards, must_exist=False, **options)
    run_commands(
        ctx,
        q,
        f"queue {queue}",
        command,
        concurrency=concurrency,
        until_empty=until_empty,
        verbose=verbose,
        dead_hint=f"rotator dead {queue}",
    )


# -- rotator workers: who holds what (rotator.registry) -----------------------------------------


def span(seconds: float) -> str:
    """A duration as a person reads it: 42 s, 3 min 5 s, 2 h 10 min, 3 d 4 h."""
    whole = max(int(seconds), 0)  # another machine's clock may be ahead of ours
    if whole < 60:
        return f"{whole} s"
    minutes, rest = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {rest} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    return f"{hours // 24} d {hours % 24} h"


WORKER_COLUMNS = (
    "WORKER", "HOST", "PID", "UP", "SEEN", "HOLDING", "COMPLETED", "RETRIED", "DEAD", "JOBS",
)  # fmt: skip


def one_line(job_id: str) -> str:
    """An id as it is, unless it would break the line (escaped as in Python's repr)."""
    return job_id if job_id.isprintable() else job_id.encode("unicode_escape").decode("ascii")


def worker_row(info: WorkerInfo, now: float) -> tuple[str, ...]:
    seen = f"{span(now - info.seen)} ago" + (" (stale)" if info.stale else "")
    jobs = " ".join(one_line(job.id) for job in info.held)
    if info.holding > len(info.held):
        jobs = f"{jobs} +{info.holding - len(info.held)} more".lstrip()
    return (
        info.id, info.host, str(info.pid), span(now - info.started), seen, str(info.holding),
        str(info.completed), str(info.retried), str(info.dead), jobs,
    )  # fmt: skip


def workers_table(found: list[WorkerInfo], now: float) -> str:
    """Aligned columns; the last one (the job ids) is left ragged."""
    rows = [WORKER_COLUMNS, *(worker_row(info, now) for info in found)]
    widths = [max(len(cell) for cell in column) for column in zip(*rows, strict=True)]
    widths[-1] = 0
    return lines(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def show_workers(ctx: click.Context, q: Rotator, what: str, show_all: bool) -> None:
    everyone = q.workers(include_stale=True)
    found = everyone if show_all else [info for info in everyone if not info.stale]
    if found:
        text = workers_table(found, time.time())
    else:
        hidden = len(everyone) - len(found)
        text = f"no workers on {what}" + (f" ({hidden} stale: --all shows them)" if hidden else "")
    emit(ctx, [info.as_dict() for info in found], text)


WORKERS_HELP = f"""Each worker loop (`rotator work`, `Rotator.work`, ...) reports on its
heartbeat, every 1 to 5 s: the jobs it holds (the first {HELD_SHOWN} named) and the jobs it
completed, retried and sent to the dead letters. Times are the workers' clocks. A worker not
seen for {STALE_AFTER:g} s has most likely died: it is left out (--all shows it, marked stale),
and this command deletes its entry once it is {PRUNE_AFTER / 3600:g} h old. A worker that stops
cleanly removes its entry."""


@main.command()
@click.argument("queue")
@click.option("--all", "show_all", is_flag=True, help="Include stale workers (likely gone).")
@shards_option
@json_option
@click.pass_context
@doc(
    "List the workers working on QUEUE: who holds which jobs.",
    WORKERS_HELP,
    "\b\nExamples:\n  rotator workers orders\n  rotator workers orders --all --json",
)
def workers(ctx: click.Context, queue: str, show_all: bool, shards: int | None, json: bool) -> None:
    q = open_either(ctx, queue, shards, must_exist=False)
    show_workers(ctx, q, f"queue {queue}", show_all)


# -- scripts, demo, the embedded server ----------------------------------------------------------


@main.command(cls=click.Command)
@json_option
@click.pass_context
def scripts(ctx: click.Context, json: bool) -> None:
    """The Lua module's SHA and path, how to load it with redis-cli, and its function library.

    With --url (or ROTATOR_URL) it also says how clients call the module on that server
    (mode): FCALL of the library where the server has functions and the ACL allows FCALL and
    FCALL_RO (and FUNCTION LOAD while the library is missing), EVALSHA otherwise. By FCALL,
    the calls that only read (stats, peek...) go by FCALL_RO to the library's read-only
    function (`reads`), which a server runs out of memory and on a read-only replica.
    Without a URL it connects to nothing.

    \b
    Examples:
      rotator scripts --json
      rotator --url redis://localhost:6379 scripts
    """
    path = str(module_path())
    # -x: the script from stdin (it is longer than one argv string may be, 128 KB on Linux)
    load = f"redis-cli -x SCRIPT LOAD < {shlex.quote(path)}"
    library = function_name()
    data = {"sha": module_sha(), "path": path, "load": load, "library": library}
    data["reads"] = f"{library}_ro"
    lines = [f"sha      {data['sha']}", f"path     {path}", f"load     {load}"]
    lines += [f"library  {library}", f"reads    {data['reads']}"]
    url = server_url(ctx)
    if url:
        data["mode"] = probe_mode(client_from_url(url))
        lines.append(f"mode     {data['mode']}")
    emit(ctx, data, "\n".join(lines))


@main.command()
@click.option(
    "--jobs",
    type=click.IntRange(1, 10_000_000),
    default=20_000,
    show_default=True,
    help="Jobs to push and complete.",
)
@click.option(
    "--workers",
    type=click.IntRange(2, 64),
    default=4,
    show_default=True,
    help="Worker processes; one of them is killed.",
)
@json_option
@click.pass_context
def demo(ctx: click.Context, jobs: int, workers: int, json: bool) -> None:
    """Push jobs, run workers, SIGKILL one mid-job, and show that nothing was lost.

    Without --url it starts the embedded server, and leaves it running.

    \b
    Example:
      rotator demo --jobs 2000 --workers 3
    """
    url = server_url(ctx)
    embedded = EmbeddedServer()
    show = sys.stderr.isatty() and not json

    def progress(done: int, total: int) -> None:
        if show:
            click.echo(f"\rcompleted {done}/{total}", nl=False, err=True)

    result = run_demo(url or embedded.start().url, jobs=jobs, workers=workers, progress=progress)
    if show:
        click.echo(err=True)
    rows = [
        ("pushed", result.pushed),
        ("completed", result.completed),
        ("workers killed (SIGKILL)", result.killed_workers),
        ("reclaimed after the crash", result.reclaimed),
        ("duplicates prevented", result.duplicates_prevented),
        ("duplicates processed", result.duplicates_processed),
        ("lost", result.lost),
        ("seconds", result.seconds),
        ("jobs/s", result.jobs_per_s),
    ]
    emit(ctx, result.as_dict(), lines(f"{name:<27} {value}" for name, value in rows))
    if url is None:
        status = embedded.status()
        click.echo(
            f"rotator: left running: the embedded server (pid {status.pid}, data in "
            f"{status.data_dir}); `rotator server stop` stops it",
            err=True,
        )
    if result.lost:
        fail(f"{result.lost} jobs lost")


class LocalGroup(RotatorGroup):
    """Commands on this machine only: no --url."""

    command_class = click.Command


@main.group(cls=LocalGroup)
def server() -> None:
    """Manage the embedded server (used when no --url is given).

    \b
    Example:
      rotator server status
    """


def status_dict(status: Any) -> dict[str, Any]:
    return {
        "running": status.running,
        "url": status.url,
        "pid": status.pid,
        "version": status.version,
        "data_dir": status.data_dir,
    }


def show_status(ctx: click.Context, status: Any) -> None:
    data = status_dict(status)
    emit(ctx, data, lines(f"{k:<9} {v}" for k, v in data.items()))


@server.command("start")
@json_option
@click.pass_context
def server_start(ctx: click.Context, json: bool) -> None:
    """Start the embedded server (harmless when it already runs).

    \b
    Example:
      ROTATOR_HOME=/srv/rotator rotator server start
    """
    show_status(ctx, EmbeddedServer().start())


@server.command("stop")
@json_option
@click.pass_context
def server_stop(ctx: click.Context, json: bool) -> None:
    """Stop the embedded server; its data stays for the next start (exit 0 if not running).

    \b
    Example:
      rotator server stop
    """
    stopped = EmbeddedServer().stop()
    emit(ctx, {"stopped": stopped}, "stopped" if stopped else "not running")


@server.command("status")
@json_option
@click.pass_context
def server_status(ctx: click.Context, json: bool) -> None:
    """Socket URL, pid, version and data directory of the embedded server; exits 1 when it
    is not running.

    \b
    Example:
      rotator server status --json
    """
    status = EmbeddedServer().status()
    show_status(ctx, status)
    if not status.running:
        sys.exit(EXIT_ERROR)


# -- rotator spark: the optional PySpark pipeline ----------------------------------------------
# rotator.spark is imported inside these commands, so `rotator --help` and every other command
# work without PySpark installed.


def spark_api() -> Any:
    """The rotator.spark module, or a one-line error saying how to install it."""
    try:
        return importlib.import_module("rotator.spark")
    except ImportError as error:
        fail(str(error))


@contextmanager
def spark_failures(api: Any) -> Iterator[None]:
    """A failed Spark job as one line, not a JVM stack trace."""
    try:
        yield
    except api.SparkFailure as error:
        fail(f"Spark: {api.describe_failure(error)}")


def spark_conf(pairs: tuple[str, ...]) -> dict[str, str]:
    conf: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            fail(f"--conf takes KEY=VALUE, got {pair!r}")
        conf[key] = value
    return conf


def spark_url(ctx: click.Context, shards: int | None = None) -> str:
    """The server the executors connect to: --url, else the embedded server's socket; a
    sharded queue (--shards) needs --url, a node of its Redis Cluster."""
    if shards is not None:
        return cluster_url(ctx, "--shards")
    return server_url(ctx) or EmbeddedServer().start().url


def spark_options(command: Callable[..., Any]) -> Callable[..., Any]:
    command = click.option(
        "--conf", multiple=True, metavar="KEY=VALUE", help="A Spark setting (repeatable)."
    )(command)
    return click.option(
        "--master", default=DEFAULT_SPARK_MASTER, show_default=True, help="Spark master URL."
    )(command)


@main.group(name="spark")
def spark_group() -> None:
    """Push ids from datasets and drain queues with Spark (pip install 'rotator-queue[spark]').

    \b
    Example:
      rotator spark push orders --input orders.parquet
    """


@spark_group.command("push")
@click.argument("queue")
@click.option("--input", "path", required=True, help="Dataset: a file or directory Spark reads.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["parquet", "csv", "json", "text"]),
    default="parquet",
    show_default=True,
    help="csv needs a header line; json is one object per line; text is one id per line.",
)
@click.option("--column", help="Column of job ids.  [default: id; value for text]")
@click.option(
    "--batch-size",
    type=click.IntRange(1, MAX_BATCH),
    default=DEFAULT_SPARK_PUSH_BATCH,
    show_default=True,
    help="Ids per atomic push.",
)
@click.option("--distinct", is_flag=True, help="Push each distinct id once.")
@shards_option
@spark_options
@json_option
@click.pass_context
def spark_push(
    ctx: click.Context,
    queue: str,
    path: str,
    fmt: str,
    column: str | None,
    batch_size: int,
    distinct: bool,
    shards: int | None,
    master: str,
    conf: tuple[str, ...],
    json: bool,
) -> None:
    """Push the ids of a dataset, every partition from its executor; prints how many.

    A dataset with an invalid id pushes nothing. A retried Spark task does not push its ids
    twice. With --shards, each id goes to its shard of the sharded queue, and each chunk of
    --batch-size holds one shard's ids.

    \b
    Examples:
      rotator spark push orders --input orders.parquet
      rotator spark push orders --input ids.txt --format text --master spark://host:7077
      rotator --url redis://node-1:7000 spark push orders --input orders.parquet --shards 12
    """
    api = spark_api()
    queue_keys(queue)
    url = spark_url(ctx, shards)
    with spark_failures(api), cluster_errors(ctx), api.session(master, spark_conf(conf)) as spark:
        df = api.read_dataset(spark, path, fmt)
        column = column or ("value" if fmt == "text" else "id")
        pushed = api.push_dataframe(
            df,
            queue,
            url=url,
            column=column,
            batch_size=batch_size,
            distinct=distinct,
            shards=shards,
        )
    emit(ctx, {"pushed": pushed}, str(pushed))


@spark_group.command("drain")
@click.argument("queue")
@click.option(
    "--handler",
    "handler_ref",
    required=True,
    metavar="MODULE:FUNCTION",
    help="Called with each job (a rotator.Job); raising retries the job later.",
)
@click.option("--output", required=True, help="Where to write the results, as Parquet.")
@click.option(
    "--parallelism",
    type=click.IntRange(1, 100_000),
    help="Spark tasks draining at once.  [default: cores]",
)
@click.option(
    "--idempotency",
    "idempotency_ref",
    metavar="MODULE:FUNCTION",
    help="Asked (with the job id) about reclaimed jobs: true means already done, skip it.",
)
@lease_option
@click.option(
    "--max-deliveries",
    type=click.IntRange(1, MAX_DELIVERIES_LIMIT),
    default=DEFAULT_DRAIN_MAX_DELIVERIES,
    show_default=True,
    help="Dead-letter a job after this many deliveries.",
)
@click.option(
    "--batch",
    type=click.IntRange(1, MAX_COUNT),
    default=DEFAULT_DRAIN_BATCH,
    show_default=True,
    help="Jobs per claim.",
)
@click.option("--overwrite", is_flag=True, help="Replace --output if it exists.")
@shards_option
@spark_options
@json_option
@click.pass_context
def spark_drain(
    ctx: click.Context,
    queue: str,
    handler_ref: str,
    output: str,
    parallelism: int | None,
    idempotency_ref: str | None,
    timeout: float,
    max_deliveries: int,
    batch: int,
    overwrite: bool,
    shards: int | None,
    master: str,
    conf: tuple[str, ...],
    json: bool,
) -> None:
    """Run a handler for every job in Spark tasks until the queue is empty; write one row per
    delivery (id, status, deliveries, reclaimed, seconds, worker, error) to --output.

    The handler's module is shipped to the executors with it; what it imports must be
    installed there. With --shards, every task claims from each shard of the sharded queue.

    \b
    Examples:
      rotator spark drain orders --handler handlers:ship --output results.parquet
      rotator spark drain orders --shards 12 --handler handlers:ship --output results.parquet
    """
    api = spark_api()
    queue_keys(queue)
    handler = api.load_callable(handler_ref)
    idempotency = api.load_callable(idempotency_ref) if idempotency_ref else None
    url = spark_url(ctx, shards)
    with spark_failures(api), cluster_errors(ctx), api.session(master, spark_conf(conf)) as spark:
        if not overwrite and api.output_exists(spark, output):
            fail(f"{output} exists: use --overwrite to replace it")  # before any job runs
        began = time.monotonic()
        results = api.drain(
            spark,
            queue,
            handler,
            url=url,
            parallelism=parallelism,
            idempotency=idempotency,
            timeout=timeout,
            max_deliveries=max_deliveries,
            batch=batch,
            shards=shards,
        )
        results.write.mode("overwrite").parquet(output)
        counts = dict(results.groupBy("status").count().collect())
    data = {
        "rows": sum(counts.values()),
        **{status: counts.get(status, 0) for status in ("completed", "failed", "skipped")},
        "seconds": round(time.monotonic() - began, 3),
        "output": output,
    }
    emit(ctx, data, lines(f"{key:<10} {value}" for key, value in data.items()))


# -- topics: `rotator topic ...` (rotator.topic) ---------------------------------------------


def open_topic(
    ctx: click.Context,
    name: str,
    count: int | None = None,
    age: float | None = None,
    *,
    must_exist: bool = True,
) -> Topic:
    topic_keys(name)  # a bad name fails before any connection is made
    retention = Retention(count=count or None, age=age) if (count or age) else None
    seconds = retry_for(ctx).get("retry_for", 0.0)
    topic = Topic(open_client(ctx), name, retention=retention, retry_for=seconds)
    if must_exist and not topic.exists():
        fail(f"unknown topic {name!r} on {where(ctx)}")
    return topic


def require_group(t: Topic, group: str) -> None:
    if group not in t.groups():
        fail(f"topic {t.name!r} has no group {group!r} (rotator topic subscribe {t.name} {group})")


def open_group(ctx: click.Context, topic: str, group: str, **options: Any) -> TopicGroup:
    validate_group_name(group)
    t = open_topic(ctx, topic)
    require_group(t, group)
    return t.group(group, **options)


@main.group(name="schedule")
def schedule_group() -> None:
    """Recurring jobs: each tick of a schedule pushes one job `<JOB_ID>@<tick ms>`.

    \b
    Examples:
      rotator schedule add reports nightly --cron '0 2 * * *' --tz Europe/Paris
      rotator schedule add reports heartbeat --every 60
      rotator schedule list reports
      rotator schedule rm reports nightly
    """


@schedule_group.command("add")
@click.argument("queue")
@click.argument("name")
@click.option("--every", type=Seconds(MAX_SCHEDULE_SECONDS), help="A tick every SECONDS.")
@click.option("--cron", help="A tick at each time of this cron expression (5 or 6 fields).")
@click.option("--tz", help="The cron expression's time zone.  [default: UTC]")
@click.option("--job-id", help="The id the ticks' jobs start with.  [default: NAME]")
@shards_option
@json_option
@click.pass_context
def schedule_add(
    ctx: click.Context,
    queue: str,
    name: str,
    every: float | None,
    cron: str | None,
    tz: str | None,
    job_id: str | None,
    shards: int | None,
    json: bool,
) -> None:
    """Add (or replace) the schedule NAME on QUEUE; adding it again as it is changes nothing.

    Each tick makes one job, however many workers run; ticks missed while nothing ran make
    one catch-up job. Worker loops keep a cron schedule's due times topped up.

    \b
    Examples:
      rotator schedule add reports nightly --cron '0 2 * * *' --tz Europe/Paris
      rotator schedule add reports heartbeat --every 60 --job-id hb
    """
    refuse_shards(ctx, shards, "schedules", "schedule")
    if (every is None) == (cron is None):
        raise click.UsageError("give --every or --cron, one of them")
    changed = open_queue(ctx, queue, must_exist=False).schedule(
        name, every=every, cron=cron, tz=tz, job_id=job_id
    )
    emit(ctx, {"changed": changed}, f"{'scheduled' if changed else 'unchanged'} {name}")


def moment_text(unix: float | None) -> str:
    if unix is None:
        return "-"
    return datetime.fromtimestamp(unix).astimezone().isoformat(timespec="seconds")


@schedule_group.command("list")
@click.argument("queue")
@shards_option
@json_option
@click.pass_context
def schedule_list(ctx: click.Context, queue: str, shards: int | None, json: bool) -> None:
    """The schedules of QUEUE: NAME  SPEC  NEXT  LAST  JOB_ID (times in local time).

    \b
    Example:
      rotator schedule list reports
    """
    refuse_shards(ctx, shards, "schedules", "schedules")
    found = open_queue(ctx, queue, must_exist=False).schedules()
    rows = [
        "  ".join(
            (
                item.name,
                item.spec + (f" ({item.tz})" if item.tz else ""),
                moment_text(item.next_due) if item.next_due else "ran out (run a worker)",
                moment_text(item.last_run),
                item.job_id,
            )
        )
        for item in found
    ]
    emit(ctx, [item.as_dict() for item in found], lines(rows))


@schedule_group.command("rm")
@click.argument("queue")
@click.argument("name")
@shards_option
@json_option
@click.pass_context
def schedule_rm(ctx: click.Context, queue: str, name: str, shards: int | None, json: bool) -> None:
    """Remove the schedule NAME from QUEUE (jobs it pushed stay).

    \b
    Example:
      rotator schedule rm reports nightly
    """
    refuse_shards(ctx, shards, "schedules", "unschedule")
    if not open_queue(ctx, queue, must_exist=False).unschedule(name):
        fail(f"no schedule {name!r} on queue {queue!r}")
    emit(ctx, {"removed": True}, f"removed {name}")


@main.group(name="topic")
def topic_group() -> None:
    """Topics: every message reaches every subscribed group (see rotator.topic).

    \b
    Example:
      rotator topic subscribe news mail
      rotator topic publish news 'hello'
      rotator topic work news mail -- sh -c 'cat >> mail.log'
    """


@topic_group.command("publish")
@click.argument("topic")
@click.argument("payloads", nargs=-1, required=True)
@click.option(
    "--retention",
    "count",
    type=click.IntRange(0, MAX_RETENTION_COUNT),
    default=DEFAULT_TOPIC_RETENTION,
    show_default=True,
    help="Messages the topic keeps (0: no count limit).",
)
@click.option(
    "--max-age",
    type=Seconds(MAX_RETENTION_SECONDS),
    help="Seconds a message is kept.  [default: no limit]",
)
@json_option
@click.pass_context
def topic_publish(
    ctx: click.Context,
    topic: str,
    payloads: tuple[str, ...],
    count: int,
    max_age: float | None,
    json: bool,
) -> None:
    """Publish messages (use - to read one per line from stdin); prints their ids.

    \b
    Examples:
      rotator topic publish news 'hello' 'world'
      tail -f events.log | rotator topic publish news -
    """
    if count == 0 and max_age is None:
        raise click.UsageError("--retention 0 needs --max-age: a topic must keep a bound", ctx)
    t = open_topic(ctx, topic, count, max_age, must_exist=False)
    ids = t.publish_many(list(read_ids(payloads)))
    emit(ctx, {"ids": ids}, lines(ids))


@topic_group.command("subscribe")
@click.argument("topic")
@click.argument("group")
@click.option(
    "--start", default="latest", show_default=True, help="latest, earliest, or a message id."
)
@json_option
@click.pass_context
def topic_subscribe(ctx: click.Context, topic: str, group: str, start: str, json: bool) -> None:
    """Register consumer GROUP on TOPIC (a no-op when it exists).

    \b
    Example:
      rotator topic subscribe news mail --start earliest
    """
    validate_group_name(group)
    added = open_topic(ctx, topic, must_exist=False).subscribe(group, start=start)
    emit(ctx, {"added": added}, f"{'subscribed' if added else 'already subscribed'} {group}")


@topic_group.command("unsubscribe")
@click.argument("topic")
@click.argument("group")
@json_option
@click.pass_context
def topic_unsubscribe(ctx: click.Context, topic: str, group: str, json: bool) -> None:
    """Forget consumer GROUP and delete its ring; exits 1 when there is no such group.

    \b
    Example:
      rotator topic unsubscribe news mail
    """
    validate_group_name(group)
    removed = open_topic(ctx, topic).unsubscribe(group)
    emit(ctx, {"removed": removed}, f"unsubscribed {group}" if removed else "")
    if not removed:
        fail(f"topic {topic!r} has no group {group!r}")


@topic_group.command("groups")
@click.argument("topic")
@json_option
@click.pass_context
def topic_groups(ctx: click.Context, topic: str, json: bool) -> None:
    """List the registered groups of TOPIC.

    \b
    Example:
      rotator topic groups news
    """
    names = open_topic(ctx, topic).groups()
    emit(ctx, {"groups": names}, lines(names))


@topic_group.command("replay")
@click.argument("topic")
@click.argument("group")
@click.option("--from-id", help="Replay from this message id (inclusive).")
@click.option(
    "--from-time", type=Seconds(1e13, zero=True), help="Replay from this unix time in seconds."
)
@json_option
@click.pass_context
def topic_replay(
    ctx: click.Context,
    topic: str,
    group: str,
    from_id: str | None,
    from_time: float | None,
    json: bool,
) -> None:
    """Deliver the retained messages from a point on to GROUP again.

    \b
    Examples:
      rotator topic replay news mail --from-id 1732233600000-42
      rotator topic replay news mail --from-time "$(date -d yesterday +%s)"
    """
    if (from_id is None) == (from_time is None):
        raise click.UsageError("give exactly one of --from-id and --from-time", ctx)
    validate_group_name(group)
    t = open_topic(ctx, topic)
    require_group(t, group)
    pushed = t.replay(group, from_id=from_id, from_time=from_time)
    emit(ctx, {"replayed": pushed}, f"replayed {pushed}")


@topic_group.command("stats")
@click.argument("topic")
@json_option
@click.pass_context
def topic_stats(ctx: click.Context, topic: str, json: bool) -> None:
    """Retained messages and bytes of TOPIC, and each group's backlog and oldest pending age.

    \b
    Example:
      rotator topic stats news --json
    """
    stats = open_topic(ctx, topic).stats()
    data = {
        "retained": stats.retained,
        "bytes": stats.bytes,
        "last_seq": stats.last_seq,
        "groups": {name: s.as_dict() for name, s in stats.groups.items()},
    }
    rows = [f"retained   {stats.retained}", f"bytes      {stats.bytes}"]
    for name, s in stats.groups.items():
        age = "-" if s.oldest_pending_age is None else f"{s.oldest_pending_age:.3f}s"
        rows.append(f"group {name}: backlog {s.pending} in_flight {s.in_flight} oldest {age}")
    emit(ctx, data, lines(rows))


@topic_group.command("next")
@click.argument("topic")
@click.argument("group")
@count_option
@lease_option
@block_option
@json_option
@click.pass_context
def topic_next(
    ctx: click.Context,
    topic: str,
    group: str,
    count: int,
    timeout: float,
    block: float | None,
    json: bool,
) -> None:
    """Lease messages for GROUP; prints `ID<TAB>TOKEN<TAB>PAYLOAD` per message.

    The payload is shown escaped (a newline as \\n); --json gives it as text. Ack with
    `rotator topic ack TOPIC GROUP TOKEN`.

    \b
    Example:
      rotator topic next news mail --count 10 --block 30
    """
    lease_jobs(ctx, open_group(ctx, topic, group, timeout=timeout), count, block, payloads=True)


@topic_group.command("ack")
@click.argument("topic")
@click.argument("group")
@click.argument("tokens", nargs=-1, required=True)
@json_option
@click.pass_context
def topic_ack(
    ctx: click.Context, topic: str, group: str, tokens: tuple[str, ...], json: bool
) -> None:
    """Complete GROUP's deliveries by token; exits 1 when one was refused.

    \b
    Example:
      rotator topic ack news mail '1732233600000-1*1732233630000.1.100001'
    """
    settle(ctx, open_group(ctx, topic, group).ack(*tokens), tokens, "acked")


@topic_group.command("nack")
@click.argument("topic")
@click.argument("group")
@click.argument("tokens", nargs=-1, required=True)
@delay_option
@json_option
@click.pass_context
def topic_nack(
    ctx: click.Context,
    topic: str,
    group: str,
    tokens: tuple[str, ...],
    delay: float,
    json: bool,
) -> None:
    """Give GROUP's deliveries back, to be delivered again after --delay seconds.

    \b
    Example:
      rotator topic nack news mail '1732233600000-1*1732233630000.1.100001' --delay 10
    """
    settle(ctx, open_group(ctx, topic, group).nack(*tokens, delay=delay), tokens, "nacked")


@topic_group.command("work", context_settings={"ignore_unknown_options": True})
@click.argument("topic")
@click.argument("group")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@work_options
@click.pass_context
@doc(
    "Run COMMAND once per message GROUP receives from TOPIC: `{}` in it becomes the message "
    "id (with no `{}`, the id is its last argument), and its stdin is the message's payload. "
    "Put `--` before COMMAND.",
    WORK_HELP,
    "\b\nExample:\n  rotator topic work news mail -- sh -c 'cat > inbox/{}.msg'",
)
def topic_work(
    ctx: click.Context,
    topic: str,
    group: str,
    command: tuple[str, ...],
    concurrency: int,
    timeout: float,
    max_deliveries: int,
    until_empty: bool,
    verbose: bool,
    json: bool,
) -> None:
    g = open_group(ctx, topic, group, timeout=timeout, max_deliveries=max_deliveries or None)
    run_commands(
        ctx,
        g,
        f"topic {topic}, group {group}",
        command,
        concurrency=concurrency,
        until_empty=until_empty,
        verbose=verbose,
        dead_hint=f"rotator topic stats {topic}",
        payload_stdin=True,
    )


@topic_group.command("workers")
@click.argument("topic")
@click.argument("group")
@click.option("--all", "show_all", is_flag=True, help="Include stale workers (likely gone).")
@json_option
@click.pass_context
@doc(
    "List the workers working for GROUP of TOPIC: who holds which messages.",
    WORKERS_HELP,
    "\b\nExample:\n  rotator topic workers news mail",
)
def topic_workers(ctx: click.Context, topic: str, group: str, show_all: bool, json: bool) -> None:
    show_workers(ctx, open_group(ctx, topic, group), f"topic {topic}, group {group}", show_all)


# -- dashboard --------------------------------------------------------------------------------

# The package's __init__ only (its defaults): the app and its extra load when the command runs.
from rotator.dashboard import DEFAULT_HOST, DEFAULT_PORT  # noqa: E402

DASHBOARD_HELP = """Pages only read, and so does /metrics. Requeueing or deleting dead letters,
pausing and resuming need a token: set ROTATOR_DASHBOARD_TOKEN to a secret before starting
(without it, actions are off), and type it into the page. Actions are POSTs that must come
from the dashboard's own page.

Queues and topics are found with SCAN (never KEYS), every 10 s, on each primary with
--cluster; counts are read every second by one poll shared by every open page, and pushed to
the pages as server-sent events. Scripts and styles ship inside the package (no CDN)."""


@main.command()
@click.option(
    "--host",
    default=DEFAULT_HOST,
    show_default=True,
    help="Address to listen on; anything but loopback lets other machines read the pages.",
)
@click.option(
    "--port", type=click.IntRange(1, 65535), default=DEFAULT_PORT, show_default=True, help="Port."
)
@click.option("--prefix", default="rotator", show_default=True, help="Key prefix of the queues.")
@cluster_option
@click.pass_context
@doc(
    "Serve a web dashboard of every queue and topic on the server, live, with Prometheus "
    "metrics at /metrics and a health check at /healthz.",
    DASHBOARD_HELP,
    "\b\nExample:\n  ROTATOR_DASHBOARD_TOKEN=$(openssl rand -hex 16) rotator dashboard --port 8765",
)
def dashboard(ctx: click.Context, host: str, port: int, prefix: str, cluster: bool) -> None:
    try:
        from rotator.dashboard.app import serve  # noqa: PLC0415 (the dashboard extra)
        from rotator.dashboard.security import (  # noqa: PLC0415
            SHORT_TOKEN,
            TOKEN_ENV,
            is_loopback,
            token_from_env,
        )
    except ImportError as error:
        fail(
            f"the dashboard needs its extra ({error.name} is missing): "
            f"pip install '{DISTRIBUTION}[dashboard]'"
        )
    if cluster:
        url = cluster_url(ctx)
        open_cluster(ctx).close()  # an unreachable cluster fails here, in one line
    else:
        url = server_url(ctx) or EmbeddedServer().start().url
        with client_from_url(url) as probe:
            probe.ping()  # an unreachable server fails here, in one line
            refuse_cluster_node(ctx, probe)
    token = token_from_env(os.environ)
    if token is None:
        actions = f"actions off (set {TOKEN_ENV} to allow requeue, delete, pause and resume)"
    else:
        actions = f"actions on, with the token in {TOKEN_ENV}"
        if len(token) < SHORT_TOKEN:
            click.echo(
                f"rotator: warning: {TOKEN_ENV} is short: use 16 characters or more", err=True
            )
    if not is_loopback(host):
        click.echo(
            f"rotator: warning: listening on {host}: whoever reaches the port can read every "
            "queue's pages and /metrics",
            err=True,
        )

    def ready(address: str) -> None:
        click.echo(
            f"rotator: dashboard of {where(ctx)}{' (Redis Cluster)' if cluster else ''} "
            f"at {address} ({actions}); metrics at {address}metrics. Ctrl-C stops it",
            err=True,
        )

    serve(url, host=host, port=port, token=token, prefix=prefix, cluster=cluster, on_ready=ready)
