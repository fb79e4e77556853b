"""The harness itself: real servers start, answer, restart in place, crash and form a cluster."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster

from tests.servers import ClusterProcess, Kind, ServerProcess, find_server_binary

MAJOR = {"redis": "7.", "valkey": "8."}
KINDS = pytest.mark.parametrize("kind", ["redis", "valkey"], ids=["redis7", "valkey8"])


def test_server_answers_ping_and_reports_its_version(
    server: ServerProcess, client: redis.Redis
) -> None:
    assert client.ping()
    assert server.version.startswith(MAJOR[server.kind])
    assert server.url == f"redis://127.0.0.1:{server.port}/0"
    assert client.get("no-such-key-here") is None


def test_queue_names_are_unique_valid_and_short(queue_name: str) -> None:
    assert queue_name.startswith("t-queue_names_are_unique")
    assert len(queue_name) <= 64
    assert all(c.isascii() and (c.isalnum() or c in "-_") for c in queue_name)


@KINDS
def test_restart_keeps_port_directory_and_aof_data(kind: Kind, tmp_path: Path) -> None:
    aof = {"appendonly": "yes", "appendfsync": "always"}
    with ServerProcess(kind, tmp_path, aof) as server:
        port = server.port
        with server.client() as conn:
            conn.set("kept", b"1")
        server.restart()
        assert server.port == port
        with server.client() as conn:
            assert conn.get("kept") == b"1"


@KINDS
def test_kill9_is_a_crash_that_appendfsync_always_survives(kind: Kind, tmp_path: Path) -> None:
    aof = {"appendonly": "yes", "appendfsync": "always"}
    with ServerProcess(kind, tmp_path, aof) as server:
        with server.client() as conn:
            conn.set("acked", b"1")
        server.kill9()
        assert not server.running
        server.start()
        with server.client() as conn:
            assert conn.get("acked") == b"1"


def test_missing_binary_fails_with_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROTATOR_REDIS_SERVER", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(pytest.fail.Exception, match=r"apt-get install -y redis-server"):
        find_server_binary("redis")


@pytest.mark.cluster
def test_cluster_of_three_masters_spreads_hash_tags_over_nodes(
    cluster: ClusterProcess, cluster_client: RedisCluster
) -> None:
    # One hash tag per node: try tags until every master owns one (bounded, slots are spread).
    key_by_node: dict[int, str] = {}
    for i in range(1000):
        key = f"{{q{i}}}:job"
        key_by_node.setdefault(cluster_client.get_node_from_key(key).port, key)  # type: ignore[no-untyped-call]
        if len(key_by_node) == 3:
            break
    assert sorted(key_by_node) == sorted(node.port for node in cluster.nodes)
    slots = {cluster_client.keyslot(key) for key in key_by_node.values()}  # type: ignore[no-untyped-call]
    assert len(slots) == 3

    for port, key in key_by_node.items():
        assert cluster_client.set(key, port)
        assert cluster_client.get(key) == str(port).encode()
        # The key really lives on that node: asked directly, its owner answers without MOVED.
        owner = next(node for node in cluster.nodes if node.port == port)
        with owner.client() as direct:
            assert direct.get(key) == str(port).encode()
