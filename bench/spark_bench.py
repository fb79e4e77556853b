"""Spark against one process: push ids from a Parquet file, and drain a no-op handler.

    python -m bench.spark_bench [--ids 1000000] [--drain-jobs 200000] [--source-rows 200000]
                                [--server redis]

Push: the same ids go in (a) through ``rotator push QUEUE -`` reading them from a file (one
process, the CLI everybody has), (b) through ``Rotator.push_many`` in chunks of 5000 (one
process, the API at its best), (c) through ``push_dataframe`` on a warm ``local[2]`` session,
and (d) through ``rotator spark push`` (a cold JVM included). Drain: a no-op handler with
``drain(parallelism=1)`` and ``drain(parallelism=2)``, against one plain ``Worker`` process.
Format: the ``rotator`` data source against the function-based path, in rows/s: a batch write
against ``push_dataframe``, a streaming read of a topic (to Spark's ``noop`` sink) against a
batch read of it, a streaming read of a queue (claim, sink, ack on commit) against ``drain``.
Every run starts its own server (persistence off) and checks that every id arrived or was
processed. Writes ``bench/results/spark.json`` and ``bench/results/spark.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pyspark
import redis

from bench.harness import started
from rotator import Job, Rotator, Topic
from rotator import spark as rspark
from rotator.defaults import DEFAULT_TOPIC_RETENTION

RESULTS = Path(__file__).resolve().parent / "results"
ROTATOR = str(Path(sys.executable).parent / "rotator")
MASTER = "local[2]"
ROW_GROUP = 100_000  # so Spark can split the one file into several partitions
CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.files.maxPartitionBytes": "2m",  # the 1M-id file is about 7 MB: 4 partitions
}


def noop(job: Job) -> None:
    """The handler every drain runs."""


@contextmanager
def timed(into: dict[str, Any], key: str = "seconds") -> Iterator[None]:
    began = time.perf_counter()
    yield
    into[key] = round(time.perf_counter() - began, 3)


def fresh(client: redis.Redis, name: str) -> Rotator:
    queue = Rotator(client, name)
    queue.delete()
    for key in client.scan_iter(match=f"rotator:{{{name}}}:spark:*"):
        client.delete(key)
    return queue


def check_pushed(client: redis.Redis, name: str, count: int) -> None:
    stats = Rotator(client, name).stats()
    assert stats.pending == count, f"{name}: {stats.pending} pending, expected {count}"


def push_runs(
    spark: Any, client: redis.Redis, url: str, ids: list[str], work: Path
) -> list[dict[str, Any]]:
    parquet, text = work / "ids.parquet", work / "ids.txt"
    pq.write_table(pa.table({"id": ids}), parquet, row_group_size=ROW_GROUP)
    text.write_text("\n".join(ids) + "\n")
    runs: list[dict[str, Any]] = []

    def run(how: str, name: str, push: Callable[[], object]) -> None:
        fresh(client, name)
        row: dict[str, Any] = {"how": how, "ids": len(ids)}
        with timed(row):
            push()
        check_pushed(client, name, len(ids))
        row["ids_per_s"] = round(len(ids) / row["seconds"])
        print(f"  push  {how:<44} {row['seconds']:>8.2f} s {row['ids_per_s']:>9} ids/s")
        runs.append(row)

    def cli_push() -> None:
        with text.open("rb") as stdin:
            subprocess.run([ROTATOR, "--url", url, "push", "bench-cli", "-"], stdin=stdin,
                           stdout=subprocess.DEVNULL, check=True)  # fmt: skip

    def spark_cli_push() -> None:
        conf = [arg for key, value in CONF.items() for arg in ("--conf", f"{key}={value}")]
        subprocess.run([ROTATOR, "--url", url, "spark", "push", "bench-spark-cli", "--input",
                        str(parquet), "--master", MASTER, *conf], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=True)  # fmt: skip

    df = spark.read.parquet(str(parquet))
    partitions = df.rdd.getNumPartitions()
    rspark.push_dataframe(df, "bench-warmup", url=url)  # JIT, Python workers: a warm session
    fresh(client, "bench-warmup")
    run("rotator push QUEUE - (CLI, one process)", "bench-cli", cli_push)
    run("Rotator.push_many, chunks of 5000 (one process)", "bench-api",
        lambda: Rotator(client, "bench-api").push_many(ids, chunk=5000))  # fmt: skip
    run(f"push_dataframe, {MASTER}, {partitions} partitions (warm)", "bench-spark",
        lambda: rspark.push_dataframe(df, "bench-spark", url=url))  # fmt: skip
    run(f"rotator spark push --master {MASTER} (JVM start included)", "bench-spark-cli",
        spark_cli_push)  # fmt: skip
    return runs


def emptied(client: redis.Redis, name: str, into: dict[str, Any], began: float) -> None:
    """Notes when nothing is pending or in flight any more: the end of the work itself."""
    queue = Rotator(client, name)
    while True:
        stats = queue.stats()
        if stats.pending == 0 and stats.in_flight == 0:
            into["work_seconds"] = round(time.perf_counter() - began, 3)
            return
        time.sleep(0.02)


def drain_runs(spark: Any, client: redis.Redis, url: str, jobs: int) -> list[dict[str, Any]]:
    ids = [f"job-{n:07d}" for n in range(jobs)]
    runs: list[dict[str, Any]] = []

    def run(how: str, name: str, drain: Callable[[], int]) -> None:
        fresh(client, name).push_many(ids, chunk=5000)
        row: dict[str, Any] = {"how": how, "jobs": jobs}
        watcher_client = redis.Redis.from_url(url)
        began = time.perf_counter()
        watcher = threading.Thread(target=emptied, args=(watcher_client, name, row, began))
        watcher.start()
        processed = drain()
        row["seconds"] = round(time.perf_counter() - began, 3)
        watcher.join()
        watcher_client.close()
        assert processed == jobs, f"{how}: {processed} of {jobs} processed"
        assert Rotator(client, name).stats().length == 0
        row["jobs_per_s"] = round(jobs / row["seconds"])
        row["work_jobs_per_s"] = round(jobs / row["work_seconds"])
        print(f"  drain {how:<44} {row['seconds']:>8.2f} s {row['jobs_per_s']:>9} jobs/s"
              f" ({row['work_jobs_per_s']} while working)")  # fmt: skip
        runs.append(row)

    def worker() -> int:
        queue = Rotator.from_url(url, "bench-worker")
        summary = queue.work(noop, stop_when_empty=True, batch=100, poll=0.5,
                             install_signal_handlers=False)  # fmt: skip
        return summary.processed

    def spark_drain(name: str, parallelism: int) -> Callable[[], int]:
        def go() -> int:
            results = rspark.drain(spark, name, noop, url=url, parallelism=parallelism)
            return int(results.count())

        return go

    spark_drain("bench-warmup", 1)()
    run("Worker, batch 100 (one process)", "bench-worker", worker)
    for parallelism in (1, 2):
        name = f"bench-drain-{parallelism}"
        run(f"drain, parallelism {parallelism}, {MASTER}", name, spark_drain(name, parallelism))
    return runs


def source_runs(spark: Any, client: redis.Redis, url: str, rows: int) -> list[dict[str, Any]]:
    """Rows/s of the data source (format rotator) beside the function-based path."""
    rspark.register(spark)
    ids = [f"job-{n:07d}" for n in range(rows)]
    df = spark.createDataFrame([(i,) for i in ids], "id string").repartition(2).cache()
    df.count()
    runs: list[dict[str, Any]] = []

    def run(what: str, how: str, go: Callable[[], object]) -> None:
        row: dict[str, Any] = {"what": what, "how": how, "rows": rows}
        with timed(row):
            go()
        row["rows_per_s"] = round(rows / row["seconds"])
        print(f"  {what:<12} {how:<40} {row['seconds']:>8.2f} s {row['rows_per_s']:>9} rows/s")
        runs.append(row)

    def write(name: str) -> None:
        fresh(client, name)
        df.write.format("rotator").option("url", url).option("queue", name).mode("append").save()
        check_pushed(client, name, rows)

    def stream(checkpoint: str, **options: str) -> None:
        reader = spark.readStream.format("rotator").option("url", url).options(**options)
        query = reader.load().writeStream.format("noop")
        started = query.option("checkpointLocation", checkpoint).start()
        started.processAllAvailable()
        started.stop()

    with tempfile.TemporaryDirectory(prefix="rotator-source-bench-") as tmp:
        write("bench-src-warmup")
        run("batch write", "format rotator, save()", lambda: write("bench-src-write"))
        run("batch write", "push_dataframe", lambda: rspark.push_dataframe(
            df, fresh(client, "bench-src-push").name, url=url))  # fmt: skip
        Topic(client, "bench-src-topic").delete()
        Topic(client, "bench-src-topic").publish_many(ids)  # the default retention keeps 100k
        kept = min(rows, DEFAULT_TOPIC_RETENTION)
        runs_before = len(runs)
        run("topic read", "readStream, startingOffsets earliest", lambda: stream(
            f"{tmp}/topic", topic="bench-src-topic", startingOffsets="earliest"))  # fmt: skip
        run("topic read", "read (batch)", lambda: spark.read.format("rotator").option(
            "url", url).option("topic", "bench-src-topic").load().count())  # fmt: skip
        for row in runs[runs_before:]:
            row["rows"], row["rows_per_s"] = kept, round(kept / row["seconds"])
        fresh(client, "bench-src-stream").push_many(ids, chunk=5000)
        run("queue read", "readStream (claim, ack on commit)", lambda: stream(
            f"{tmp}/queue", queue="bench-src-stream"))  # fmt: skip
        assert Rotator(client, "bench-src-stream").stats().in_flight == 0
        fresh(client, "bench-src-drain").push_many(ids, chunk=5000)
        run("queue read", "drain, parallelism 2", lambda: rspark.drain(
            spark, "bench-src-drain", noop, url=url, parallelism=2).count())  # fmt: skip
    df.unpersist()
    return runs


def markdown(data: dict[str, Any]) -> str:
    machine = data["machine"]
    lines = [
        "# Spark pipeline benchmark",
        "",
        f"`python -m bench.spark_bench` on {machine['cpus']} cores, {machine['platform']},"
        f" Python {machine['python']}, PySpark {machine['pyspark']}, {data['server']}"
        f" {data['version']} on loopback (persistence off), {machine['date']}. Single runs;"
        f" 1-minute load average {machine['load_average_before']} before and"
        f" {machine['load_average_after']} after (other work shared the machine).",
        "",
        f"## Push {data['push'][0]['ids']:,} ids from a Parquet file",
        "",
        "| how | seconds | ids/s |",
        "|---|---:|---:|",
        *(f"| {r['how']} | {r['seconds']:.2f} | {r['ids_per_s']:,} |" for r in data["push"]),
        "",
        f"## Drain {data['drain'][0]['jobs']:,} jobs with a no-op handler",
        "",
        "`seconds` is the whole call (for `drain`: scheduling the tasks, the work, and reading"
        " every result row back into a DataFrame); `while working` counts only until nothing"
        " was pending or in flight.",
        "",
        "| how | seconds | jobs/s | jobs/s while working |",
        "|---|---:|---:|---:|",
        *(
            f"| {r['how']} | {r['seconds']:.2f} | {r['jobs_per_s']:,} | {r['work_jobs_per_s']:,} |"
            for r in data["drain"]
        ),
        "",
        *source_markdown(data.get("source", [])),
    ]
    return "\n".join(lines)


def source_markdown(runs: list[dict[str, Any]]) -> list[str]:
    if not runs:
        return []
    return [
        "## The data source (format rotator) against the functions",
        "",
        "| what | how | rows | seconds | rows/s |",
        "|---|---|---:|---:|---:|",
        *(
            f"| {r['what']} | {r['how']} | {r['rows']:,} | {r['seconds']:.2f} |"
            f" {r['rows_per_s']:,} |"
            for r in runs
        ),
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.spark_bench", description=__doc__)
    parser.add_argument("--ids", type=int, default=1_000_000, help="ids to push")
    parser.add_argument("--drain-jobs", type=int, default=200_000, help="jobs per drain")
    parser.add_argument("--source-rows", type=int, default=200_000, help="rows per format run")
    parser.add_argument("--server", default="redis", choices=["redis", "valkey"])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    ids = [f"job-{n:07d}" for n in range(args.ids)]
    machine = {
        "load_average_before": round(os.getloadavg()[0], 2),  # other work on the machine
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "pyspark": pyspark.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }
    with tempfile.TemporaryDirectory(prefix="rotator-spark-bench-") as tmp:
        work = Path(tmp)
        with started(args.server, work / args.server) as server, server.client() as client:
            print(f"{args.server} {server.version} on port {server.port}", flush=True)
            with rspark.session(MASTER, CONF) as spark:
                spark.sparkContext.setLogLevel("ERROR")
                pushes = push_runs(spark, client, server.url, ids, work)
                drains = drain_runs(spark, client, server.url, args.drain_jobs)
                sources = source_runs(spark, client, server.url, args.source_rows)
            version = server.version
    machine["load_average_after"] = round(os.getloadavg()[0], 2)
    data = {"machine": machine, "server": args.server, "version": version,
            "push": pushes, "drain": drains, "source": sources}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "spark.json").write_text(json.dumps(data, indent=2) + "\n")
    (args.out / "spark.md").write_text(markdown(data))
    print(f"results in {args.out}/spark.json and spark.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
