"""The Spark pipeline on a real standalone cluster, where Spark retries failed tasks.

The fixture starts a master and a worker (2 cores) with the ``spark-class`` launcher that
ships in the pyspark package; each test runs the ``rotator spark`` CLI as the driver, as a
user would, and breaks something under it: a pushing task is SIGKILLed mid-partition, a
draining task hard-exits mid-job. Standalone Spark tries a task up to 4 times.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Self

import pytest
import redis

from rotator import Job, Rotator
from rotator.protocol import text
from tests.servers import ServerProcess, free_ports
from tests.test_spark import ROOT, python_env, require_java, ring_ids

try:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import pyspark
    from pyspark import TaskContext
except ImportError as missing:
    pytest.fail(
        f"{missing}: the Spark tests need the spark extra: pip install -e '.[dev]'", pytrace=False
    )

ROTATOR = str(Path(sys.executable).parent / "rotator")
START_TIMEOUT = 60.0  # seconds for the master to lead and the worker to register
RUN_TIMEOUT = 240.0  # seconds for one CLI run: JVM, executor, the work, a lease or two


class Daemon:
    """A Spark daemon started by this module; only its own process group is ever signalled."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str]) -> None:
        self.log = log
        self.name = argv[1]
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def wait_for(self, line: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while line not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])
                pytest.fail(f"no {line!r} from {self.name}:\n{tail}", pytrace=False)
            time.sleep(0.1)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # The worker's executors and their Python workers are in its group: they go with it.
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(10)


@pytest.fixture(scope="module")
def spark_master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A standalone master and one 2-core worker on loopback; yields the master URL."""
    require_java()
    spark_class = str(Path(pyspark.__file__).parent / "bin" / "spark-class")
    workdir = tmp_path_factory.mktemp("spark-cluster")
    env = {
        **os.environ,
        **python_env(),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(workdir),
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",  # no port 6066
    }
    port, ui, worker_port, worker_ui = free_ports(4)
    master_url = f"spark://127.0.0.1:{port}"
    master_argv = [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                   "--port", str(port), "--webui-port", str(ui)]  # fmt: skip
    worker_argv = [spark_class, "org.apache.spark.deploy.worker.Worker", master_url,
                   "--cores", "2", "--memory", "2g", "--host", "127.0.0.1",
                   "--port", str(worker_port), "--webui-port", str(worker_ui),
                   "--work-dir", str(workdir / "work")]  # fmt: skip
    with Daemon(master_argv, workdir / "master.log", env) as master:
        master.wait_for("I have been elected leader")
        with Daemon(worker_argv, workdir / "worker.log", env) as worker:
            worker.wait_for("Successfully registered with master")
            yield master_url


def rotator_spark(
    master: str, url: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """`rotator --url URL spark ARGS --master MASTER` as a process of its own: the driver."""
    argv = [ROTATOR, "--url", url, "spark", *args, "--master", master, "--json",
            "--conf", "spark.ui.showConsoleProgress=false",
            "--conf", "spark.driver.memory=512m"]  # fmt: skip
    return subprocess.Popen(
        argv,
        cwd=ROOT,
        env={**os.environ, **python_env(), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> str:
    """The run's stdout once it exited 0; its stderr tail in the failure otherwise."""
    try:
        out, err = proc.communicate(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    assert proc.returncode == 0, "\n".join(err.splitlines()[-40:])
    return out


def pushers(client: redis.Redis, queue: str) -> dict[str, int]:
    """The push tasks connected now: "partition.attempt" -> pid (from their client names)."""
    found = {}
    for entry in client.client_list():
        name = entry.get("name", "")
        if name.startswith(f"rotator-spark-push:{queue}:"):
            task, pid = name.rsplit(":", 2)[1:]
            found[task] = int(pid)
    return found


def test_a_push_task_killed_mid_partition_is_retried_and_pushes_each_id_once(
    spark_master: str, valkey_server: ServerProcess, queue_name: str, tmp_path: Path
) -> None:
    ids = [f"p{n:06d}" for n in range(100_000)]
    pq.write_table(pa.table({"id": ids}), tmp_path / "ids.parquet")  # one file, one partition
    path = str(tmp_path / "ids.parquet")
    proc = rotator_spark(
        spark_master, valkey_server.url, "push", queue_name, "--input", path, "--batch-size", "50"
    )
    killed_at = None
    attempts = set()
    with valkey_server.client() as client:
        ring = f"rotator:{{{queue_name}}}:ring"
        while proc.poll() is None:
            found = pushers(client, queue_name)
            attempts |= set(found)
            length = client.llen(ring) - 1  # without the sentinel
            if killed_at is None and "0.0" in found and length >= 50:
                os.kill(found["0.0"], signal.SIGKILL)  # a Python worker of our own cluster
                killed_at = length
            time.sleep(0.01)
        assert finish(proc).strip() == '{"pushed": 100000}'
        assert killed_at is not None
        assert killed_at < len(ids), "the task was killed before it finished its partition"
        assert "0.1" in attempts, "Spark ran the task again"
        assert ring_ids(client, queue_name) == Counter(ids)


# The fault test's handler and idempotency callback, run by the executors. The CLI ships this
# module to them by value; they find the server through the environment it gives executors.


def side() -> redis.Redis:
    return redis.Redis.from_url(os.environ["ROTATOR_TEST_URL"])


def crash_once(job: Job) -> None:
    """The job's work is to note that it ran; the tenth run of the whole drain hard-exits
    mid-job, after its work and before its ack, killing its task's Python worker."""
    key = os.environ["ROTATOR_TEST_KEY"]
    with side() as client:
        pipe = client.pipeline(transaction=True)
        pipe.sadd(f"{key}:done", job.id)
        pipe.rpush(f"{key}:runs", job.id)
        pipe.execute()
        time.sleep(0.002)
        if client.incr(f"{key}:count") == 10:
            context = TaskContext.get()
            assert context is not None
            client.set(f"{key}:crashed", f"{job.id} {context.attemptNumber()}")
            os._exit(3)


def already_done(job_id: str) -> bool:
    with side() as client:
        return bool(client.sismember(f"{os.environ['ROTATOR_TEST_KEY']}:done", job_id))


def test_a_drain_task_that_hard_exits_mid_job_loses_nothing_and_runs_nothing_twice(
    spark_master: str, valkey_server: ServerProcess, queue_name: str, tmp_path: Path
) -> None:
    key = f"{queue_name}:side"
    ids = [f"d{n:03d}" for n in range(200)]
    with valkey_server.client() as client:
        queue = Rotator(client, queue_name)
        queue.push_many(ids)
        executor_env = [
            "--conf", f"spark.executorEnv.ROTATOR_TEST_URL={valkey_server.url}",
            "--conf", f"spark.executorEnv.ROTATOR_TEST_KEY={key}",
        ]  # fmt: skip
        proc = rotator_spark(
            spark_master, valkey_server.url, "drain", queue_name,
            "--handler", "tests.test_spark_cluster:crash_once",
            "--idempotency", "tests.test_spark_cluster:already_done",
            "--output", str(tmp_path / "results"), "--parallelism", "2",
            "--timeout", "3", "--batch", "5", *executor_env,
        )  # fmt: skip
        finish(proc)

        crashed_id, attempt = text(client.get(f"{key}:crashed")).split()
        assert attempt == "0"  # the first attempt of its task died; Spark ran it again
        runs = Counter(text(run) for run in client.lrange(f"{key}:runs", 0, -1))
        stats = queue.stats()
        assert (stats.length, stats.pending, stats.in_flight, stats.done, stats.dead) == (
            0, 0, 0, 0, 0,
        )  # fmt: skip

    results = pq.read_table(tmp_path / "results").to_pylist()
    final = {r["id"]: r for r in results if r["status"] in ("completed", "skipped")}
    assert sorted(final) == ids  # every pushed id was completed
    assert runs == Counter(ids)  # and ran once: the callback kept the crashed job from rerunning
    assert len(final) == len(results)  # one row per id: no duplicate to explain
    crashed = final[crashed_id]
    assert (crashed["status"], crashed["reclaimed"], crashed["deliveries"]) == ("skipped", True, 2)
    # Every job the dead task held came back reclaimed, after its lease: those it had finished
    # were skipped by the idempotency callback, the others ran now for the first time.
    reclaimed = [r for r in results if r["reclaimed"]]
    assert 1 <= len(reclaimed) <= 5
    assert all(r["deliveries"] == 2 for r in reclaimed)
    assert all(r["reclaimed"] for r in results if r["status"] == "skipped")
