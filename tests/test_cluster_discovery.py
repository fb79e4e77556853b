"""Discovery, ``rotator queues`` and the dashboard on a real 3-master Redis Cluster.

Queues and topics are named so that their hash tags land on different primaries; each test
proves where they landed by asking every primary which of the keys it holds. The cluster is
shared by the session: each test looks for the names it made among whatever else is there.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import signal
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import ClusterNode, RedisCluster
from starlette.testclient import TestClient

from rotator import Rotator, Topic
from rotator.dashboard.app import create_app
from rotator.discovery import find, find_async
from rotator.keys import queue_keys, topic_keys
from rotator.models import Discovered
from tests.helpers import wait_until
from tests.servers import ClusterProcess, ServerProcess, free_ports
from tests.test_cli import assert_error, ok_json, run
from tests.test_dashboard import (
    BASE,
    ROTATOR,
    SAME_ORIGIN,
    TOKEN,
    Served,
    all_samples,
    answers,
    read_events,
    samples,
)

pytestmark = pytest.mark.cluster


# -- where keys live ---------------------------------------------------------------------------


def primaries(client: RedisCluster) -> list[ClusterNode]:
    found: list[ClusterNode] = client.get_primaries()  # type: ignore[no-untyped-call]
    return found


def holder(client: RedisCluster, key: str) -> str:
    """The one primary that holds ``key``, asked of every primary (not the client's slot
    map), and checked against the slot the server computes (CLUSTER KEYSLOT). SCAN, since a
    node answers MOVED to an EXISTS of a key in another node's slot."""
    holders = [
        node.name
        for node in primaries(client)
        if any(client.get_redis_connection(node).scan_iter(match=key, count=1000))
    ]
    assert len(holders) == 1, (key, holders)
    slot = client.cluster_keyslot(key)
    owner: ClusterNode = client.nodes_manager.get_node_from_slot(slot)
    assert owner.name == holders[0], (key, slot)
    return holders[0]


def spread(client: RedisCluster, base: str, count: int = 3) -> list[str]:
    """``count`` names whose hash tags hash to ``count`` different primaries."""
    picked: dict[str, str] = {}  # node name -> name
    for i in range(1000):
        name = f"{base}-{i}"
        node = client.get_node_from_key(f"{{{name}}}")  # type: ignore[no-untyped-call]
        picked.setdefault(node.name, name)
        if len(picked) == count:
            return list(picked.values())
    raise AssertionError(f"no {count} names on distinct primaries among 1000 tries")


def node_url(cluster: ClusterProcess) -> str:
    """A URL of one node: a cluster client learns the others from it."""
    node = cluster.nodes[0]
    return f"redis://{node.host}:{node.port}/0"


@pytest.fixture
def queues(cluster_client: RedisCluster, queue_name: str) -> list[str]:
    """Three queues, one per primary, with 1, 2 and 3 jobs pending."""
    names = spread(cluster_client, queue_name)
    for n, name in enumerate(names, 1):
        Rotator(cluster_client, name).push(*(f"job-{k}" for k in range(n)))
    return names


def mine(found: Discovered, base: str) -> tuple[list[str], list[str]]:
    return (
        [name for name in found.queues if name.startswith(base)],
        [name for name in found.topics if name.startswith(base)],
    )


# -- rotator.discovery -------------------------------------------------------------------------


def test_find_scans_every_primary_and_lists_what_each_holds(
    cluster_client: RedisCluster, queues: list[str], queue_name: str
) -> None:
    subscribed, published = spread(cluster_client, f"{queue_name}-t", 2)
    Topic(cluster_client, subscribed).subscribe("mail")
    Topic(cluster_client, published).publish("m")
    held = {name: holder(cluster_client, queue_keys(name).ring) for name in queues}
    assert len(set(held.values())) == 3  # one queue on each primary
    topic_nodes = {
        holder(cluster_client, topic_keys(subscribed).groups),
        holder(cluster_client, topic_keys(published).log),
    }
    assert len(topic_nodes) == 2

    found = find(cluster_client)

    assert mine(found, queue_name) == (sorted(queues), sorted([subscribed, published]))
    assert list(found.queues) == sorted(set(found.queues))  # sorted, each name once
    for node in primaries(cluster_client):  # one primary alone sees only its own queue
        alone = find(cluster_client.get_redis_connection(node))
        assert mine(alone, queue_name)[0] == [n for n, at in held.items() if at == node.name]


def test_a_deleted_queue_disappears_from_the_cluster_listing(
    cluster_client: RedisCluster, queues: list[str], queue_name: str
) -> None:
    gone, *kept = queues
    Rotator(cluster_client, gone).delete()

    found = find(cluster_client)

    assert mine(found, queue_name)[0] == sorted(kept)


def test_small_scan_steps_on_each_primary_find_the_same_as_one_big_step(
    cluster_client: RedisCluster, queue_name: str
) -> None:
    for n in range(30):
        Rotator(cluster_client, f"{queue_name}-{n}").push("x")

    small = find(cluster_client, count=3)
    big = find(cluster_client, count=100_000)

    assert small == big
    assert len(mine(small, queue_name)[0]) == 30


def test_find_async_on_an_asyncio_cluster_client_finds_the_same(
    cluster: ClusterProcess, cluster_client: RedisCluster, queues: list[str]
) -> None:
    async def scenario() -> Discovered:
        client = AsyncRedisCluster.from_url(node_url(cluster))  # not connected yet
        try:
            return await find_async(client)
        finally:
            await client.aclose()

    found = asyncio.run(scenario())

    assert set(queues) <= set(found.queues)
    assert found == find(cluster_client)


def test_cluster_discovery_never_runs_keys(
    cluster: ClusterProcess, cluster_client: RedisCluster, queues: list[str]
) -> None:
    user, password = f"nokeys-{uuid.uuid4().hex[:8]}", "pw"
    nodes = [cluster_client.get_redis_connection(node) for node in primaries(cluster_client)]
    for node in nodes:  # ACL users are per node
        node.acl_setuser(
            user, enabled=True, passwords=[f"+{password}"], keys=["*"], commands=["+@all", "-keys"]
        )
    try:
        limited = cluster.client(username=user, password=password)
        try:
            with pytest.raises(redis.exceptions.NoPermissionError):
                limited.get_redis_connection(primaries(limited)[0]).keys("*")
            found = find(limited)
        finally:
            limited.close()
    finally:
        for node in nodes:
            node.acl_deluser(user)

    assert set(queues) <= set(found.queues)


# -- rotator queues ----------------------------------------------------------------------------


def test_the_queues_command_with_cluster_lists_every_primarys_queues(
    cluster: ClusterProcess, queues: list[str]
) -> None:
    data = ok_json(run("queues", "--cluster", "--json", "--url", node_url(cluster)))

    pending = {name: data["queues"][name]["pending"] for name in queues}
    assert pending == {name: n for n, name in enumerate(queues, 1)}


def test_the_queues_command_on_a_cluster_node_without_cluster_says_to_add_it(
    cluster: ClusterProcess,
) -> None:
    result = run("queues", "--url", node_url(cluster))

    assert result.exit_code == 2
    assert_error(result, "is a node of a Redis Cluster: add --cluster")


def test_cluster_needs_a_url_and_a_cluster_behind_it(redis_server: ServerProcess) -> None:
    no_url = run("queues", "--cluster", env={"ROTATOR_URL": None})
    standalone = run("queues", "--cluster", "--url", redis_server.url)

    assert no_url.exit_code == 2
    assert_error(no_url, "--cluster needs --url")
    assert standalone.exit_code == 1
    assert_error(standalone, "Redis Cluster at redis://", "Cluster mode is not enabled")


def test_a_sharded_queue_needs_a_url_and_the_error_names_shards(tmp_path: Path) -> None:
    drain = ["spark", "drain", "orders", "--handler", "json:dumps", "--output", str(tmp_path)]
    for command in (["stats", "orders"], ["push", "orders", "a"], drain):
        result = run(*command, "--shards", "3", env={"ROTATOR_URL": None})
        assert result.exit_code == 2, result.output
        assert_error(result, "--shards needs --url")


# -- the dashboard -----------------------------------------------------------------------------


@pytest.fixture
def dashboard(cluster: ClusterProcess) -> Iterator[TestClient]:
    """The dashboard of the cluster, with actions on."""
    app = create_app(node_url(cluster), token=TOKEN, interval=0.1, discover_every=0.1, cluster=True)
    with TestClient(app, base_url=BASE) as client:
        yield client


def test_the_overview_and_metrics_list_the_queues_of_every_primary(
    dashboard: TestClient, queues: list[str]
) -> None:
    overview = dashboard.get("/api/overview").json()
    metrics = dashboard.get("/metrics").text
    page = dashboard.get("/")

    rows = {row["name"]: row for row in overview["queues"]}
    assert {name: rows[name]["stats"]["pending"] for name in queues} == {
        name: n for n, name in enumerate(queues, 1)
    }
    assert {name: samples(metrics, name)["rotator_queue_pending"] for name in queues} == {
        name: float(n) for n, name in enumerate(queues, 1)
    }
    assert all_samples(metrics)["rotator_up"] == 1.0
    assert page.status_code == 200
    assert "Redis Cluster" in page.text
    assert "each primary of the cluster (replicas are not read)" in page.text
    assert dashboard.get("/healthz").json() == {"ok": True}


def test_queue_pages_and_actions_reach_the_node_of_each_queue(
    dashboard: TestClient, cluster_client: RedisCluster, queues: list[str]
) -> None:
    headers = {"accept": "application/json", "x-rotator-token": TOKEN, **SAME_ORIGIN}
    for n, name in enumerate(queues, 1):
        q = Rotator(cluster_client, name)
        (job,) = q.next()
        q.bury(job, error="no")
        q.sweep()  # writes the letter

        detail = dashboard.get(f"/api/queues/{name}").json()
        paused = dashboard.post("/actions/pause", data={"queue": name}, headers=headers)
        requeued = dashboard.post(
            "/actions/requeue", data={"queue": name, "all": "1"}, headers=headers
        )

        assert (detail["stats"]["pending"], detail["stats"]["dead"]) == (n - 1, 1)
        assert [letter["id"] for letter in detail["dead"]] == ["job-0"]
        assert (paused.status_code, requeued.status_code) == (200, 200)
        stats = q.stats()
        assert (stats.paused, stats.dead, stats.pending) == (True, 0, n)


def test_an_event_stream_on_a_cluster_carries_every_primarys_queues(
    cluster: ClusterProcess, cluster_client: RedisCluster, queues: list[str]
) -> None:
    with Served(node_url(cluster), cluster=True) as served:
        host, port = served.base.removeprefix("http://").split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=10)
        connection.request("GET", "/events")
        events = read_events(connection.getresponse())
        first = next(events)
        Rotator(cluster_client, queues[0]).push("more")

        def pending(snapshot: dict[str, object]) -> dict[str, int]:
            rows = snapshot["queues"]
            assert isinstance(rows, list)
            return {r["name"]: r["stats"]["pending"] for r in rows if r["name"] in queues}

        later = next(e for e in events if pending(e).get(queues[0]) == 2)
        connection.close()

    assert pending(first) == {name: n for n, name in enumerate(queues, 1)}
    assert pending(later)[queues[1]] == 2


def test_an_unreachable_cluster_is_a_503_and_rotator_up_0_not_a_crash() -> None:
    app = create_app("redis://127.0.0.1:1/0", token=TOKEN, cluster=True)
    with TestClient(app, base_url=BASE) as dashboard:
        health = dashboard.get("/healthz")
        page = dashboard.get("/")
        metric = dashboard.get("/metrics")

    assert health.status_code == 503
    assert page.status_code == 503
    assert "cannot read the server" in page.text
    assert all_samples(metric.text) == {"rotator_up": 0.0}


def test_the_dashboard_command_with_cluster_serves_every_primarys_queues(
    cluster: ClusterProcess, queues: list[str]
) -> None:
    (port,) = free_ports(1)
    env = {k: v for k, v in os.environ.items() if k != "ROTATOR_DASHBOARD_TOKEN"}
    command = subprocess.Popen(
        [ROTATOR, "dashboard", "--cluster", "--url", node_url(cluster), "--port", str(port)],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert command.stderr is not None
        said = command.stderr.readline()
        assert f"(Redis Cluster) at http://127.0.0.1:{port}/ (actions off" in said
        wait_until(lambda: answers(f"http://127.0.0.1:{port}/healthz"))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
        command.send_signal(signal.SIGINT)
        assert command.wait(timeout=15) == 0
    finally:
        if command.poll() is None:
            command.kill()
            command.wait()

    pending = {
        s.labels["queue"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "rotator_queue_pending" and s.labels["queue"] in queues
    }
    assert pending == {name: float(n) for n, name in enumerate(queues, 1)}
