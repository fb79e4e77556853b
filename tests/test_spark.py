"""rotator.spark on a local Spark session: push from datasets, drain, snapshot, the CLI.

The Spark tests share one session (its JVM takes about 10 s to start): ``local[2]`` with
``spark.task.maxFailures=1``, so a failed task is never retried and a retry cannot hide double
processing. Retries, crashes and a standalone cluster are in test_spark_cluster.py. The
partition pusher's exactly-once chunks are also tested here without Spark, on both servers.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from rotator import InvalidArgument, InvalidJobId, Job, Rotator, WrongKeyType
from rotator.cli import main
from rotator.keys import queue_keys
from rotator.protocol import text
from tests.helpers import snapshot as key_values
from tests.servers import ServerProcess

try:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import DataFrame, SparkSession

    from rotator import spark as rspark
except ImportError as missing:
    pytest.fail(
        f"{missing}: the Spark tests need the spark extra: pip install -e '.[dev]'", pytrace=False
    )

ROOT = Path(__file__).resolve().parent.parent
JAVA_INSTALL = "apt-get install -y default-jre-headless"


def require_java() -> None:
    """Spark needs a JVM: fail (never skip) with the install command when there is none."""
    if shutil.which("java") is None:
        pytest.fail(f"java not found: Spark needs Java 17+; install it: {JAVA_INSTALL}", False)


def python_env() -> dict[str, str]:
    """The environment for Spark's Python workers: this interpreter, and tests importable."""
    path = os.environ.get("PYTHONPATH")
    return {
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": f"{ROOT}{os.pathsep}{path}" if path else str(ROOT),
    }


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    require_java()
    saved = {name: os.environ.get(name) for name in python_env()}
    os.environ.update(python_env())  # read whenever the JVM starts a Python worker
    session = (
        SparkSession.builder.master("local[2]")
        .appName("rotator-tests")
        .config("spark.task.maxFailures", "1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "512m")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    yield session
    session.stop()
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture
def url(valkey_server: ServerProcess) -> str:
    return valkey_server.url


@pytest.fixture
def conn(valkey_server: ServerProcess) -> Iterator[redis.Redis]:
    with valkey_server.client() as client:
        yield client


def ring_ids(client: redis.Redis, queue: str) -> Counter[str]:
    """How often each id is in the ring, whatever its state."""
    elements = client.lrange(queue_keys(queue).ring, 0, -1)
    return Counter(text(e).partition("*")[0] for e in elements if e != b"*lap")


def spark_keys(client: redis.Redis, queue: str) -> list[bytes]:
    return sorted(client.scan_iter(match=f"rotator:{{{queue}}}:spark:*"))


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def rows(df: DataFrame) -> list[dict[str, Any]]:
    return [row.asDict() for row in df.collect()]


def noop(job: Job) -> None:
    """A handler for the CLI tests."""


# -- without PySpark ------------------------------------------------------------------------

WITHOUT_PYSPARK = """
import sys
sys.modules["pyspark"] = None  # what an environment without the extra looks like
from click.testing import CliRunner
from rotator.cli import main
assert CliRunner().invoke(main, ["--help"]).exit_code == 0
try:
    import rotator.spark
except ImportError as error:
    print("import:", error)
result = CliRunner().invoke(main, ["spark", "push", "q", "--input", "x"])
print("cli:", result.exit_code, result.stderr.strip())
"""


def test_importing_rotator_and_its_cli_never_imports_pyspark() -> None:
    code = "import sys, rotator, rotator.cli; print(sorted(m for m in sys.modules if 'spark' in m))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_without_pyspark_import_and_cli_say_how_to_install_it() -> None:
    out = subprocess.run(
        [sys.executable, "-c", WITHOUT_PYSPARK], capture_output=True, text=True, check=True
    )
    assert "import: rotator.spark needs PySpark" in out.stdout
    assert "pip install 'rotator-queue[spark]'" in out.stdout
    assert "cli: 1 rotator: error: rotator.spark needs PySpark" in out.stdout


# -- the partition pusher, without Spark ----------------------------------------------------


def test_a_partition_rerun_after_a_crash_pushes_only_the_missing_chunks(
    client: redis.Redis, queue_name: str
) -> None:
    keys = queue_keys(queue_name)
    marker = f"rotator:{{{queue_name}}}:spark:push:run:0"
    ids = [f"id-{n:04d}" for n in range(1000)]

    def dies_after_350() -> Iterator[str]:
        yield from ids[:350]
        raise RuntimeError("the task died")

    with pytest.raises(RuntimeError):
        rspark.push_partition(client, keys, marker, dies_after_350(), 100)
    assert sum(ring_ids(client, queue_name).values()) == 300  # three whole chunks
    assert rspark.push_partition(client, keys, marker, ids, 100) == 1000
    assert ring_ids(client, queue_name) == Counter(ids)
    assert client.hgetall(marker) == {b"chunks": b"10", b"pushed": b"100"}  # (its last chunk)
    assert 0 < client.ttl(marker) <= 86_400
    # A third run (a speculative copy finishing late) pushes nothing and counts everything.
    assert rspark.push_partition(client, keys, marker, ids, 100) == 1000
    assert ring_ids(client, queue_name) == Counter(ids)


def test_two_attempts_of_a_partition_at_once_push_each_chunk_once(
    server: ServerProcess, queue_name: str
) -> None:
    keys = queue_keys(queue_name)
    marker = f"rotator:{{{queue_name}}}:spark:push:run:0"
    ids = [str(n) for n in range(20_000)]
    counts: list[int] = []

    def attempt() -> None:
        with server.client() as own:
            counts.append(rspark.push_partition(own, keys, marker, ids, 50))

    threads = [threading.Thread(target=attempt) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert counts == [20_000, 20_000]
    with server.client() as client:
        assert ring_ids(client, queue_name) == Counter(ids)


def test_a_chunk_whose_push_fails_inside_the_transaction_is_not_marked(
    client: redis.Redis, queue_name: str
) -> None:
    keys = queue_keys(queue_name)
    marker = f"rotator:{{{queue_name}}}:spark:push:run:0"
    client.set(keys.ring, "not a list")
    with pytest.raises(WrongKeyType):
        rspark.push_partition(client, keys, marker, ["a", "b"], 10)
    assert client.hgetall(marker) == {}  # neither done nor a leftover `before`
    client.delete(keys.ring)
    assert rspark.push_partition(client, keys, marker, ["a", "b"], 10) == 2
    assert ring_ids(client, queue_name) == Counter(["a", "b"])


def test_a_script_flush_between_chunks_reloads_and_pushes_once(
    client: redis.Redis, queue_name: str
) -> None:
    keys = queue_keys(queue_name)
    marker = f"rotator:{{{queue_name}}}:spark:push:run:0"
    pusher: rspark._ChunkPusher[bytes] = rspark._ChunkPusher(client, keys, marker)
    assert pusher.push(0, [b"a"]) == 1
    client.script_flush()  # the next EXEC finds no script: nothing pushed, nothing marked
    assert pusher.push(1, [b"b"]) == 1
    assert ring_ids(client, queue_name) == Counter(["a", "b"])
    assert client.hget(marker, "chunks") == b"2"


# -- push_dataframe -------------------------------------------------------------------------


def test_push_from_parquet_pushes_every_id_once_from_each_partition(
    spark: SparkSession, url: str, conn: redis.Redis, queue_name: str, tmp_path: Path
) -> None:
    ids = [f"order-{n}" for n in range(12_345)]
    for part in range(3):  # three files: three partitions pushing side by side
        table = pa.table({"id": ids[part::3], "amount": list(range(len(ids[part::3])))})
        pq.write_table(table, tmp_path / f"part-{part}.parquet")
    df = spark.read.parquet(str(tmp_path))
    assert df.rdd.getNumPartitions() >= 2

    assert rspark.push_dataframe(df, queue_name, url=url, batch_size=1000) == len(ids)
    assert ring_ids(conn, queue_name) == Counter(ids)
    stats = Rotator(conn, queue_name).stats()
    assert (stats.length, stats.pending) == (len(ids), len(ids))
    markers = spark_keys(conn, queue_name)
    assert markers, "one marker per partition"
    assert all(0 < conn.ttl(key) <= 86_400 for key in markers)  # they expire on their own


def test_push_of_integer_ids_sends_their_decimal_form_and_distinct_drops_repeats(
    spark: SparkSession, url: str, conn: redis.Redis, queue_name: str
) -> None:
    df = spark.createDataFrame([(n % 50,) for n in range(200)], "n bigint")
    assert rspark.push_dataframe(df, queue_name, url=url, column="n", distinct=True) == 50
    assert ring_ids(conn, queue_name) == Counter(str(n) for n in range(50))


def test_invalid_ids_are_reported_and_nothing_is_pushed(
    spark: SparkSession, url: str, conn: redis.Redis, queue_name: str
) -> None:
    long_id = "x" * 1025
    values = ["fine", None, "", "a*b", long_id, "also-fine"]
    df = spark.createDataFrame([(v,) for v in values], "id string")

    with pytest.raises(InvalidJobId, match="4 invalid job ids in column 'id'") as error:
        rspark.push_dataframe(df, queue_name, url=url)
    assert "'a*b' (contains \"*\")" in str(error.value)
    assert not Rotator(conn, queue_name).exists()
    reasons = {row["reason"] for row in rows(rspark.invalid_ids(df))}
    assert reasons == {"null", "empty", 'contains "*"', "longer than 1024 bytes"}


def test_a_column_that_is_missing_or_cannot_hold_ids_is_refused(
    spark: SparkSession, url: str, queue_name: str
) -> None:
    df = spark.createDataFrame([(1.5,)], "price double")
    with pytest.raises(InvalidArgument, match="no column 'id'"):
        rspark.push_dataframe(df, queue_name, url=url)
    with pytest.raises(InvalidArgument, match="'price' is double: job ids are strings or integers"):
        rspark.push_dataframe(df, queue_name, url=url, column="price")


def test_cli_push_reads_a_csv_file(
    spark: SparkSession, url: str, conn: redis.Redis, queue_name: str, tmp_path: Path
) -> None:
    path = tmp_path / "jobs.csv"
    path.write_text("name,job\nalice,j-1\nbob,j-2\ncarol,j-3\n")
    result = cli("--url", url, "spark", "push", queue_name, "--input", str(path),
                 "--format", "csv", "--column", "job", "--json")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == '{"pushed": 3}'
    assert ring_ids(conn, queue_name) == Counter(["j-1", "j-2", "j-3"])
    missing = cli("--url", url, "spark", "push", queue_name, "--input", str(tmp_path / "no"))
    assert missing.exit_code == 1
    assert missing.stderr.startswith("rotator: error: Spark: [PATH_NOT_FOUND] Path does not")
    assert len(missing.stderr.splitlines()) == 1


# -- drain ----------------------------------------------------------------------------------


def test_drain_runs_the_handler_once_per_job_and_leaves_the_ring_empty(
    spark: SparkSession, url: str, conn: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(conn, queue_name)
    ids = [f"j{n}" for n in range(3000)]
    queue.push_many(ids)
    runs = f"{queue_name}:runs"

    def handler(job: Job) -> None:
        with redis.Redis.from_url(url) as side:  # the job's work: note that it ran
            side.rpush(runs, job.id)

    results = rspark.drain(spark, queue_name, handler, url=url, parallelism=2, poll=0.2)

    found = rows(results)
    assert Counter(conn.lrange(runs, 0, -1)) == Counter(i.encode() for i in ids)
    assert Counter(row["id"] for row in found) == Counter(ids)
    assert {row["status"] for row in found} == {"completed"}
    assert all(row["deliveries"] == 1 and not row["reclaimed"] for row in found)
    assert all(row["error"] is None and row["seconds"] >= 0 for row in found)
    tasks = {row["worker"].rsplit(":", 1)[1] for row in found}
    assert tasks == {"task0.0", "task1.0"}  # both tasks took work
    stats = queue.stats()
    assert (stats.length, stats.pending, stats.in_flight, stats.done) == (0, 0, 0, 0)
    assert conn.llen(queue.keys.ring) <= 1  # at most the sentinel
    assert spark_keys(conn, queue_name) == []  # the journal was read and deleted
    assert results.count() == len(ids)  # materialized: counting again runs nothing


def test_drain_records_failures_retries_them_and_dead_letters_a_poison_job(
    spark: SparkSession, url: str, conn: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(conn, queue_name)
    queue.push("ok", "flaky", "poison")

    def handler(job: Job) -> None:
        if job.id == "poison" or (job.id == "flaky" and job.deliveries == 1):
            raise ValueError(f"cannot do {job.id}")

    results = rspark.drain(
        spark, queue_name, handler, url=url, parallelism=1, max_deliveries=2, poll=0.2
    )

    seen = sorted((r["id"], r["deliveries"], r["status"], r["error"]) for r in rows(results))
    assert seen == [
        ("flaky", 1, "failed", "ValueError: cannot do flaky"),
        ("flaky", 2, "completed", None),
        ("ok", 1, "completed", None),
        ("poison", 1, "failed", "ValueError: cannot do poison"),
        ("poison", 2, "failed", "ValueError: cannot do poison"),
    ]
    assert [(d.id, d.reason, d.deliveries, d.error) for d in queue.dead()] == [
        ("poison", "failed", 2, "ValueError: cannot do poison")
    ]
    assert queue.stats().length == 0


def test_drain_asks_the_idempotency_callback_about_reclaimed_jobs(
    spark: SparkSession, url: str, conn: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(conn, queue_name, timeout=0.5)
    queue.push_many(f"j{n}" for n in range(20))
    held = queue.next(6)  # a worker that dies holding six jobs, three of them done
    done = f"{queue_name}:done"
    conn.sadd(done, *(job.id for job in held[:3]))
    runs = f"{queue_name}:runs"

    def already_done(job_id: str) -> bool:
        with redis.Redis.from_url(url) as side:
            return bool(side.sismember(done, job_id))

    def handler(job: Job) -> None:
        with redis.Redis.from_url(url) as side:
            side.rpush(runs, job.id)

    results = rspark.drain(
        spark, queue_name, handler, url=url, idempotency=already_done, parallelism=2, poll=0.2
    )

    by_id = {row["id"]: row for row in rows(results)}
    assert len(by_id) == 20
    for job in held[:3]:
        assert by_id[job.id]["status"] == "skipped"
    for job in held:
        assert (by_id[job.id]["reclaimed"], by_id[job.id]["deliveries"]) == (True, 2)
    ran = {text(run) for run in conn.lrange(runs, 0, -1)}
    assert ran == set(by_id) - {job.id for job in held[:3]}
    assert sum(row["status"] == "completed" for row in by_id.values()) == 17
    assert queue.stats().length == 0


def test_cli_drain_writes_the_results_as_parquet_and_keeps_an_existing_output(
    spark: SparkSession, url: str, conn: redis.Redis, queue_name: str, tmp_path: Path
) -> None:
    Rotator(conn, queue_name).push_many(str(n) for n in range(500))
    output = tmp_path / "results"
    args = ["--url", url, "spark", "drain", queue_name, "--handler", "tests.test_spark:noop",
            "--output", str(output), "--parallelism", "2"]  # fmt: skip

    result = cli(*args, "--json")
    assert result.exit_code == 0, result.stderr
    assert '"completed": 500' in result.stdout
    table = pq.read_table(output)
    assert table.column_names == [
        "id", "status", "deliveries", "reclaimed", "seconds", "worker", "error"
    ]  # fmt: skip
    assert sorted(table.column("id").to_pylist()) == sorted(str(n) for n in range(500))

    again = cli(*args)
    assert again.exit_code == 1
    assert again.stderr.strip() == f"rotator: error: {output} exists: use --overwrite to replace it"
    assert cli(*args, "--overwrite").exit_code == 0
    assert pq.read_table(output).num_rows == 0  # the queue was already drained

    missing = cli("--url", url, "spark", "drain", queue_name, "--handler", "tests.nowhere:f",
                  "--output", str(tmp_path / "x"))  # fmt: skip
    assert missing.exit_code == 1
    assert "cannot import tests.nowhere" in missing.stderr


# -- snapshot -------------------------------------------------------------------------------


def test_snapshot_shows_every_state_across_pages_and_changes_nothing(
    spark: SparkSession, url: str, conn: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(conn, queue_name, timeout=60)
    queue.push_many(f"j{n}" for n in range(2500))  # three pages of 1000
    leased, acked, nacked, extended = queue.next(4)
    queue.ack(acked)
    queue.nack(nacked, delay=30)
    queue.extend(extended, 600)
    whole = queue.next(2)  # its walk of the lease list took the acked job's lease away
    assert queue.ack(*whole) == 2  # sent as one batch ack
    conn.rpush(queue.keys.ring, "x*nan")  # a corrupt element at the tail
    before = key_values(conn, queue)
    began_ms = int(time.time() * 1000)

    found = rows(rspark.snapshot(spark, queue_name, url=url))

    assert key_values(conn, queue) == before
    assert len(found) == 2500
    assert found[0] == {"id": "x*nan", "state": "corrupt", "stamp_ms": None, "age_ms": None,
                        "deliveries": 0}  # fmt: skip
    by_id = {row["id"]: row for row in found}
    assert sum(row["state"] == "pending" for row in found) == 2494
    assert by_id["j9"] == {"id": "j9", "state": "pending", "stamp_ms": None, "age_ms": None,
                           "deliveries": 0}  # fmt: skip
    assert acked.id not in by_id
    expected = {leased: "leased", nacked: "deferred", extended: "leased"}
    expected |= {job: "done" for job in whole}
    for job, state in expected.items():
        row = by_id[job.id]
        assert (row["state"], row["deliveries"]) == (state, 1)
        assert row["age_ms"] < 0  # nothing is overdue yet
    assert by_id[leased.id]["stamp_ms"] == leased.deadline_ms
    assert by_id[nacked.id]["stamp_ms"] >= began_ms + 29_000
    assert by_id[extended.id]["stamp_ms"] >= began_ms + 599_000


def test_snapshot_of_a_missing_queue_is_empty(
    spark: SparkSession, url: str, queue_name: str
) -> None:
    df = rspark.snapshot(spark, queue_name, url=url)
    assert df.count() == 0
    assert df.columns == ["id", "state", "stamp_ms", "age_ms", "deliveries"]


def test_an_id_that_is_not_utf8_is_drained_and_shown_with_a_replacement_character(
    spark: SparkSession, url: str, conn: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(conn, queue_name)
    queue.push("\udcffraw", "plain")  # rotator's way to name the bytes b"\xffraw"
    assert [row["id"] for row in rows(rspark.snapshot(spark, queue_name, url=url))] == [
        "\ufffdraw", "plain"
    ]  # fmt: skip
    results = rspark.drain(spark, queue_name, noop, url=url, parallelism=1, poll=0.2)
    seen = sorted(row["id"] for row in rows(results))
    assert seen == ["plain", "\ufffdraw"]
    assert queue.stats().length == 0


def run_readme_block(
    marker: str, url: str, directory: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs the README's python block after ``<!-- marker -->`` as a script, in
    ``directory``, with ROTATOR_URL set to ``url``."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    found = re.search(rf"<!-- {marker} -->\s*```python\n(.*?)```", readme, re.DOTALL)
    assert found, f"README has no python block after <!-- {marker} -->"
    monkeypatch.chdir(directory)
    monkeypatch.setenv("ROTATOR_URL", url)
    exec(compile(found.group(1), "README.md", "exec"), {"__name__": "__main__"})


def test_the_readme_spark_example_runs_as_written(
    spark: SparkSession,
    url: str,
    conn: redis.Redis,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    orders = Rotator(conn, "orders")
    orders.delete()  # the name is the README's; the redis-cli example uses it too
    try:
        run_readme_block("spark-example", url, tmp_path, monkeypatch)
        table = pq.read_table(tmp_path / "results.parquet")
        statuses = Counter(table.column("status").to_pylist())
        assert statuses == {"completed": 10_000, "failed": 1000}
        assert orders.stats().length == 0
    finally:
        orders.delete()
