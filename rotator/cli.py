"""The ``rotator`` command: parse, call the API, print. Nothing else lives here.

Without ``--url`` (or ``ROTATOR_URL``) every command uses the private embedded server. Errors
are one line on stderr and a non-zero exit code, never a traceback.
"""

from __future__ import annotations

import importlib
import json
import logging
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

import click
import redis

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
    DISTRIBUTION,
)
from rotator.demo import run_demo
from rotator.errors import RotatorError
from rotator.keys import queue_keys, topic_keys
from rotator.models import Job
from rotator.script import module_path, module_sha
from rotator.server import EmbeddedServer
from rotator.topic import Retention, Topic
from rotator.worker import Worker

EXIT_ERROR = 1


class CliError(click.ClickException):
    """A failure worth one line on stderr."""

    def show(self, file: Any = None) -> None:
        click.echo(f"rotator: error: {self.format_message()}", err=True)


class RotatorGroup(click.Group):
    """Turns every expected failure into a CliError, so users never see a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        url = ctx.params.get("url") or "the embedded server"
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except redis.ConnectionError as error:
            raise CliError(f"cannot reach {url}: {error}") from error
        except (RotatorError, redis.RedisError) as error:
            raise CliError(str(error)) from error


def fail(message: str) -> NoReturn:
    raise CliError(message)


def emit(ctx: click.Context, data: Any, text: str) -> None:
    """Prints ``data`` as JSON under --json, else the human ``text`` (if any)."""
    if ctx.params.get("json"):
        click.echo(json.dumps(data, sort_keys=True))
    elif text:
        click.echo(text)


def lines(rows: Iterable[str]) -> str:
    return "\n".join(rows)


def open_queue(
    ctx: click.Context, name: str, *, must_exist: bool = True, **options: Any
) -> Rotator:
    url = ctx.find_root().params.get("url")
    queue_keys(name)  # a bad name fails before any connection is made
    rotator = Rotator.from_url(url, name, **options) if url else Rotator.embedded(name, **options)
    if must_exist and not rotator.exists():
        fail(f"unknown queue {name!r} on {url or 'the embedded server'}")
    return rotator


json_option = click.option("--json", "json", is_flag=True, help="Print JSON.")


@click.group(cls=RotatorGroup)
@click.option(
    "--url",
    envvar="ROTATOR_URL",
    help="Server URL (redis://, rediss://, unix://). Default: the embedded server.",
)
@click.version_option(package_name=DISTRIBUTION)
def main(url: str | None) -> None:
    """rotator: a reliable job queue for Redis and Valkey."""


def read_ids(values: Sequence[str]) -> Iterator[str]:
    for value in values:
        if value == "-":
            for line in sys.stdin:
                if line := line.rstrip("\r\n"):
                    yield line
        else:
            yield value


@main.command()
@click.argument("queue")
@click.argument("ids", nargs=-1, required=True)
@json_option
@click.pass_context
def push(ctx: click.Context, queue: str, ids: tuple[str, ...], json: bool) -> None:
    """Push job IDs (use - to read one per line from stdin)."""
    q = open_queue(ctx, queue, must_exist=False)
    total = 0
    batch: list[str] = []
    # A bar only for a human watching a long stdin stream.
    bar = click.progressbar(length=0, label="pushing", file=sys.stderr)
    show_bar = "-" in ids and sys.stderr.isatty()
    for job_id in read_ids(ids):
        protocol.encode_id(job_id)  # refuse a bad line before sending its batch
        batch.append(job_id)
        if len(batch) == DEFAULT_PUSH_CHUNK:
            total += q.push_many(batch)
            batch = []
            if show_bar:
                bar.update(DEFAULT_PUSH_CHUNK)
    if batch:
        total += q.push_many(batch)
    if show_bar:
        bar.render_finish()
    emit(ctx, {"pushed": total}, str(total))


def job_dict(job: Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "token": job.token,
        "deliveries": job.deliveries,
        "reclaimed": job.reclaimed,
        "deadline_ms": job.deadline_ms,
    }


@main.command(name="next")
@click.argument("queue")
@click.option("--count", default=1, show_default=True, help="Jobs to lease.")
@click.option(
    "--timeout", default=DEFAULT_LEASE_TIMEOUT, show_default=True, help="Lease, in seconds."
)
@click.option("--block", type=float, default=None, help="Seconds to wait for a job.")
@json_option
@click.pass_context
def next_(
    ctx: click.Context, queue: str, count: int, timeout: float, block: float | None, json: bool
) -> None:
    """Lease jobs; prints one `ID TOKEN` line per job."""
    q = open_queue(ctx, queue, timeout=timeout)
    jobs = q.next(count, block)
    emit(ctx, [job_dict(job) for job in jobs], lines(f"{j.id}\t{j.token}" for j in jobs))


@main.command()
@click.argument("queue")
@click.argument("tokens", nargs=-1, required=True)
@json_option
@click.pass_context
def ack(ctx: click.Context, queue: str, tokens: tuple[str, ...], json: bool) -> None:
    """Complete deliveries by token; prints how many were accepted."""
    accepted = open_queue(ctx, queue).ack(*tokens)
    emit(ctx, {"acked": accepted}, str(accepted))
    if accepted < len(tokens):
        fail(f"{len(tokens) - accepted} of {len(tokens)} tokens refused: their leases were lost")


@main.command()
@click.argument("queue")
@click.argument("tokens", nargs=-1, required=True)
@click.option("--delay", default=0.0, show_default=True, help="Seconds before redelivery.")
@json_option
@click.pass_context
def nack(ctx: click.Context, queue: str, tokens: tuple[str, ...], delay: float, json: bool) -> None:
    """Give deliveries back, to be delivered again after --delay seconds."""
    requeued = open_queue(ctx, queue).nack(*tokens, delay=delay)
    emit(ctx, {"nacked": requeued}, str(requeued))
    if requeued < len(tokens):
        fail(f"{len(tokens) - requeued} of {len(tokens)} tokens refused: their leases were lost")


def stats_table(name: str, values: dict[str, Any]) -> str:
    lines = [f"queue {name}"]
    for key, value in values.items():
        shown = "-" if value is None else (f"{value:.3f} s" if isinstance(value, float) else value)
        lines.append(f"  {key:<20} {shown}")
    return "\n".join(lines)


@main.command()
@click.argument("queue")
@click.option("--watch", is_flag=True, help="Refresh every --interval seconds until Ctrl-C.")
@click.option("--interval", default=1.0, show_default=True)
@json_option
@click.pass_context
def stats(ctx: click.Context, queue: str, watch: bool, interval: float, json: bool) -> None:
    """Counts: length, pending, in flight, done, deferred, dead, oldest pending age."""
    q = open_queue(ctx, queue)
    while True:
        values = q.stats().as_dict()
        if watch and not json:
            click.clear()
        emit(ctx, values, stats_table(queue, values))
        if not watch:
            return
        try:
            time.sleep(interval)
        except KeyboardInterrupt:
            return


@main.command()
@click.argument("queue")
@click.option("--limit", default=20, show_default=True)
@json_option
@click.pass_context
def peek(ctx: click.Context, queue: str, limit: int, json: bool) -> None:
    """Show the elements next in line, with their state, without changing anything."""
    entries = open_queue(ctx, queue).peek(limit)
    now_ms = int(time.time() * 1000)

    rows = []
    for entry in entries:
        when = f"{(entry.time_ms - now_ms) / 1000:+.1f} s" if entry.time_ms else ""
        rows.append(f"{entry.state:<9} {when:>10}  {entry.element}")
    data = [{"element": e.element, "state": e.state, "time_ms": e.time_ms} for e in entries]
    emit(ctx, data, lines(rows))


@main.command()
@click.argument("queue")
@click.argument("ids", nargs=-1)
@click.option("--requeue", is_flag=True, help="Move the letters (all, or of IDS) back.")
@click.option("--limit", default=100, show_default=True)
@json_option
@click.pass_context
def dead(
    ctx: click.Context, queue: str, ids: tuple[str, ...], requeue: bool, limit: int, json: bool
) -> None:
    """List dead letters with their reasons, or requeue them."""
    q = open_queue(ctx, queue)
    if requeue:
        moved = q.requeue_dead(*ids)
        emit(ctx, {"requeued": moved}, str(moved))
        return
    if ids:
        fail("IDS are only used with --requeue")
    letters = q.dead(0, limit)
    data = [
        {"id": d.id, "reason": d.reason, "deliveries": d.deliveries, "died_ms": d.died_ms}
        for d in letters
    ]
    emit(ctx, data, lines(f"{d.id}\t{d.reason}\t{d.deliveries}" for d in letters))


def command_runner(command: tuple[str, ...]) -> Callable[[Job], None]:
    """A handler running ``command`` per job: ``{}`` becomes the id, else it is appended."""

    def handler(job: Job) -> None:
        argv = [part.replace("{}", job.id) for part in command]
        if not any("{}" in part for part in command):
            argv.append(job.id)
        result = subprocess.run(argv, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"{shlex.join(argv)} exited with {result.returncode}")

    return handler


@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("queue")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option("--concurrency", default=1, show_default=True)
@click.option("--timeout", default=DEFAULT_LEASE_TIMEOUT, show_default=True, help="Lease (s).")
@click.option("--max-deliveries", type=int, default=None, help="Dead-letter after this many.")
@click.option("--until-empty", is_flag=True, help="Stop when nothing is left to do.")
@json_option
@click.pass_context
def work(
    ctx: click.Context,
    queue: str,
    command: tuple[str, ...],
    concurrency: int,
    timeout: float,
    max_deliveries: int | None,
    until_empty: bool,
    json: bool,
) -> None:
    """Run COMMAND for each job: exit 0 acks, anything else retries with backoff.

    Use `--` before COMMAND. SIGINT/SIGTERM finish the running jobs, then stop.
    """
    q = open_queue(ctx, queue, must_exist=False, timeout=timeout, max_deliveries=max_deliveries)
    # Failures and warnings as one line each on stderr.
    logging.basicConfig(level=logging.WARNING, format="rotator: %(message)s")
    worker = Worker(q, command_runner(command), concurrency=concurrency)
    summary = worker.run(stop_when_empty=until_empty)
    data = {"processed": summary.processed, "failed": summary.failed}
    emit(ctx, data, f"processed {summary.processed}, failed {summary.failed}")


@main.command()
@json_option
@click.pass_context
def scripts(ctx: click.Context, json: bool) -> None:
    """The Lua module's SHA and path, and how to load it with redis-cli."""
    path = str(module_path())
    load = f'redis-cli SCRIPT LOAD "$(cat {shlex.quote(path)})"'
    data = {"sha": module_sha(), "path": path, "load": load}
    emit(ctx, data, f"sha   {data['sha']}\npath  {path}\nload  {load}")


@main.command()
@click.option("--jobs", default=20_000, show_default=True)
@click.option("--workers", default=4, show_default=True)
@json_option
@click.pass_context
def demo(ctx: click.Context, jobs: int, workers: int, json: bool) -> None:
    """Push jobs, run workers, SIGKILL one mid-job, and show that nothing was lost.

    Without --url it starts the embedded server, and leaves it running.
    """
    if jobs < 1 or workers < 2:
        fail("the demo needs --jobs >= 1 and --workers >= 2 (one of them is killed)")
    given = ctx.find_root().params.get("url")
    embedded = EmbeddedServer()
    url = given or embedded.start().url
    show = sys.stderr.isatty() and not json

    def progress(done: int, total: int) -> None:
        if show:
            click.echo(f"\rcompleted {done}/{total}", nl=False, err=True)

    result = run_demo(url, jobs=jobs, workers=workers, progress=progress)
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
    if given is None:
        status = embedded.status()
        click.echo(
            f"rotator: left running: the embedded server (pid {status.pid}, data in "
            f"{status.data_dir}); `rotator server stop` stops it",
            err=True,
        )
    if result.lost:
        sys.exit(EXIT_ERROR)


@main.group()
def server() -> None:
    """Manage the embedded server (used when no --url is given)."""


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
    """Start the embedded server (harmless when it already runs)."""
    show_status(ctx, EmbeddedServer().start())


@server.command("stop")
@json_option
@click.pass_context
def server_stop(ctx: click.Context, json: bool) -> None:
    """Stop the embedded server; its data stays for the next start."""
    stopped = EmbeddedServer().stop()
    emit(ctx, {"stopped": stopped}, "stopped" if stopped else "not running")


@server.command("status")
@json_option
@click.pass_context
def server_status(ctx: click.Context, json: bool) -> None:
    """Socket URL, pid, version and data directory of the embedded server."""
    show_status(ctx, EmbeddedServer().status())


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


def spark_url(ctx: click.Context) -> str:
    """The server the executors connect to: --url, else the embedded server's socket."""
    url: str | None = ctx.find_root().params.get("url")
    return url or EmbeddedServer().start().url


def spark_options(command: Callable[..., Any]) -> Callable[..., Any]:
    command = click.option(
        "--conf", multiple=True, metavar="KEY=VALUE", help="A Spark setting (repeatable)."
    )(command)
    return click.option(
        "--master", default=DEFAULT_SPARK_MASTER, show_default=True, help="Spark master URL."
    )(command)


@main.group(name="spark")
def spark_group() -> None:
    """Push ids from datasets and drain queues with Spark (pip install 'rotator-queue[spark]')."""


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
    "--batch-size", default=DEFAULT_SPARK_PUSH_BATCH, show_default=True, help="Ids per atomic push."
)
@click.option("--distinct", is_flag=True, help="Push each distinct id once.")
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
    master: str,
    conf: tuple[str, ...],
    json: bool,
) -> None:
    """Push the ids of a dataset, every partition from its executor; prints how many.

    A dataset with an invalid id pushes nothing. A retried Spark task does not push its ids
    twice.
    """
    api = spark_api()
    queue_keys(queue)
    url = spark_url(ctx)
    with spark_failures(api), api.session(master, spark_conf(conf)) as spark:
        df = api.read_dataset(spark, path, fmt)
        column = column or ("value" if fmt == "text" else "id")
        pushed = api.push_dataframe(
            df, queue, url=url, column=column, batch_size=batch_size, distinct=distinct
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
@click.option("--parallelism", type=int, help="Spark tasks draining at once.  [default: cores]")
@click.option(
    "--idempotency",
    "idempotency_ref",
    metavar="MODULE:FUNCTION",
    help="Asked (with the job id) about reclaimed jobs: true means already done, skip it.",
)
@click.option("--timeout", default=DEFAULT_LEASE_TIMEOUT, show_default=True, help="Lease (s).")
@click.option(
    "--max-deliveries",
    default=DEFAULT_DRAIN_MAX_DELIVERIES,
    show_default=True,
    help="Dead-letter a job after this many deliveries.",
)
@click.option("--batch", default=DEFAULT_DRAIN_BATCH, show_default=True, help="Jobs per claim.")
@click.option("--overwrite", is_flag=True, help="Replace --output if it exists.")
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
    master: str,
    conf: tuple[str, ...],
    json: bool,
) -> None:
    """Run a handler for every job in Spark tasks until the queue is empty; write one row per
    delivery (id, status, deliveries, reclaimed, seconds, worker, error) to --output.

    The handler's module is shipped to the executors with it; what it imports must be
    installed there.
    """
    api = spark_api()
    queue_keys(queue)
    handler = api.load_callable(handler_ref)
    idempotency = api.load_callable(idempotency_ref) if idempotency_ref else None
    url = spark_url(ctx)
    with spark_failures(api), api.session(master, spark_conf(conf)) as spark:
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
    ctx: click.Context, name: str, count: int | None = None, age: float | None = None
) -> Topic:
    url = ctx.find_root().params.get("url")
    topic_keys(name)  # a bad name fails before any connection is made
    if url:
        client: redis.Redis = redis.Redis.from_url(url)
    else:
        server = EmbeddedServer()
        server.start()
        client = server.client()
    retention = Retention(count=count or None, age=age) if (count or age) else None
    return Topic(client, name, retention=retention)


@main.group(name="topic")
def topic_group() -> None:
    """Topics: every message reaches every subscribed group (see rotator.topic)."""


@topic_group.command("publish")
@click.argument("topic")
@click.argument("payloads", nargs=-1, required=True)
@click.option(
    "--retention",
    "count",
    type=int,
    default=DEFAULT_TOPIC_RETENTION,
    show_default=True,
    help="Messages the topic keeps (0: no count limit).",
)
@click.option("--max-age", type=float, help="Seconds a message is kept.  [default: no limit]")
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
    """Publish messages (use - to read one per line from stdin); prints their ids."""
    t = open_topic(ctx, topic, count, max_age)
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
    """Register a consumer group (a no-op when it exists)."""
    added = open_topic(ctx, topic).subscribe(group, start=start)
    emit(ctx, {"added": added}, f"{'subscribed' if added else 'already subscribed'} {group}")


@topic_group.command("unsubscribe")
@click.argument("topic")
@click.argument("group")
@json_option
@click.pass_context
def topic_unsubscribe(ctx: click.Context, topic: str, group: str, json: bool) -> None:
    """Forget a consumer group and delete its ring."""
    removed = open_topic(ctx, topic).unsubscribe(group)
    emit(ctx, {"removed": removed}, f"{'unsubscribed' if removed else 'no such group'} {group}")


@topic_group.command("groups")
@click.argument("topic")
@json_option
@click.pass_context
def topic_groups(ctx: click.Context, topic: str, json: bool) -> None:
    """List the registered groups."""
    names = open_topic(ctx, topic).groups()
    emit(ctx, {"groups": names}, lines(names))


@topic_group.command("replay")
@click.argument("topic")
@click.argument("group")
@click.option("--from-id", help="Replay from this message id (inclusive).")
@click.option("--from-time", type=float, help="Replay from this unix time in seconds.")
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
    """Deliver the retained messages from a point to GROUP again."""
    pushed = open_topic(ctx, topic).replay(group, from_id=from_id, from_time=from_time)
    emit(ctx, {"replayed": pushed}, f"replayed {pushed}")


@topic_group.command("stats")
@click.argument("topic")
@json_option
@click.pass_context
def topic_stats(ctx: click.Context, topic: str, json: bool) -> None:
    """Retained messages and bytes, and each group's backlog and oldest pending age."""
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
