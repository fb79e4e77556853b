"""Sharded queues (rotator.sharded) in discovery, the dashboard, /metrics and `rotator queues`,
on the real 3-master Redis Cluster: each is one queue under its logical name, its shards'
counts added up (ShardedRotator.stats()), its shards grouped under it and never listed as
queues of their own; its page has a table of its shards; its actions act on every shard.
Last, the page in a real browser (Debian's chromium through Playwright), with a screenshot.

The cluster is shared by the session: each test looks for the names it made among whatever
else is there, and changes only those.
"""

from __future__ import annotations

import asyncio
import html
import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, expect, sync_playwright
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from starlette.testclient import TestClient

from rotator import Rotator, ShardedRotator, Stats
from rotator.dashboard.app import create_app
from rotator.dashboard.snapshot import Reader
from rotator.discovery import Found, ShardedQueue, find, find_async
from rotator.sharded import layout_key
from tests.servers import ClusterProcess
from tests.test_cli import ok, ok_json, run
from tests.test_dashboard import BASE, SAME_ORIGIN, TOKEN, Served
from tests.test_dashboard_browser import CHROMIUM, CHROMIUM_ARGS, WAIT_MS

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parent.parent
SHARDS = 6
# What the dashboard shows of a queue's counts, compared with ShardedRotator's (the age of
# the oldest pending job moves on by itself).
COUNTS = (
    "length", "pending", "in_flight", "done", "deferred", "dead", "scheduled", "paused",
    "pushed", "delivered", "completed", "retried", "dead_lettered",
)  # fmt: skip
# Set to write the browser test's screenshot to docs/dashboard-sharded.png.
DOCS_ENV = "ROTATOR_DOCS_SCREENSHOT"


def node_url(cluster: ClusterProcess) -> str:
    node = cluster.nodes[0]
    return f"redis://{node.host}:{node.port}/0"


def counts(stats: Stats | dict[str, Any]) -> dict[str, Any]:
    found = stats.as_dict() if isinstance(stats, Stats) else stats
    return {field: found[field] for field in COUNTS}


def fill(q: ShardedRotator, jobs: int = 40) -> None:
    """``jobs`` jobs pushed: 5 leased, of which 2 buried (dead letters) and 1 nacked for a
    minute (deferred), so 35 pending, 2 in flight, 1 deferred, 2 dead, over the shards."""
    q.push(*(f"job-{n}" for n in range(jobs)))
    leased = q.next(5)
    q.bury(*leased[:2], error="card declined")
    q.nack(leased[2], delay=60)
    q.sweep()  # writes the letters


@pytest.fixture
def sharded(cluster_client: RedisCluster, queue_name: str) -> Iterator[ShardedRotator]:
    """A sharded queue of 6 shards (two on each master), filled as ``fill`` says."""
    q = ShardedRotator(cluster_client, queue_name, shards=SHARDS, timeout=60)
    fill(q)
    try:
        yield q
    finally:
        q.delete()


@pytest.fixture
def dashboard(cluster: ClusterProcess) -> Iterator[TestClient]:
    """The dashboard of the cluster, with actions on (the token of tests.test_dashboard)."""
    app = create_app(node_url(cluster), token=TOKEN, interval=0.1, discover_every=0.1, cluster=True)
    with TestClient(app, base_url=BASE) as client:
        yield client


def act(dashboard: TestClient, action: str, form: dict[str, Any], token: str | None = TOKEN) -> Any:
    headers = {"accept": "application/json", **SAME_ORIGIN}
    if token is not None:
        headers["x-rotator-token"] = token
    return dashboard.post(f"/actions/{action}", data=form, headers=headers)


def labelled(text: str, queue: str) -> dict[tuple[str, str | None], float]:
    """The samples labelled ``queue``, by (metric, shard label or None)."""
    return {
        (sample.name, sample.labels.get("shard")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels.get("queue") == queue
    }


def queue_labels(text: str) -> set[str]:
    return {
        sample.labels["queue"]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if "queue" in sample.labels
    }


# -- rotator.discovery -------------------------------------------------------------------------


def test_discovery_reports_a_sharded_queue_once_with_its_shards_grouped_under_it(
    cluster: ClusterProcess, cluster_client: RedisCluster, sharded: ShardedRotator
) -> None:
    name, shards = sharded.name, sharded.shard_names
    assert len(set(sharded.placement())) == 3  # its shards are on every master
    # A queue named like a shard, of a name with no layout: an ordinary queue.
    lookalike = f"{name}-x:0.1"
    Rotator(cluster_client, lookalike).push("a")

    async def found_async() -> Found:
        client = AsyncRedisCluster.from_url(node_url(cluster))
        try:
            return await find_async(client)
        finally:
            await client.aclose()

    found = find(cluster_client)

    assert cluster_client.exists(layout_key(name, "rotator")) == 1  # the key it is found by
    assert [q for q in found.sharded if q.name == name] == [ShardedQueue(name, SHARDS, shards)]
    assert name not in found.queues
    assert not set(shards) & set(found.queues)  # grouped, not listed as queues
    assert lookalike in found.queues
    assert {name, lookalike} <= found.names
    assert asyncio.run(found_async()) == find(cluster_client)


def test_a_deleted_sharded_queue_is_no_longer_found_nor_are_its_shards(
    cluster_client: RedisCluster, queue_name: str
) -> None:
    q = ShardedRotator(cluster_client, queue_name, shards=3)
    q.push("a", "b", "c", "d")
    before = find(cluster_client)
    q.delete()

    after = find(cluster_client)

    assert queue_name in {s.name for s in before.sharded}
    assert queue_name not in {s.name for s in after.sharded}
    assert not set(q.shard_names) & set(after.queues)  # deleted shards keep only their seq


# -- the dashboard -----------------------------------------------------------------------------


def test_the_overview_lists_a_sharded_queue_as_one_row_with_its_shards_counts_added_up(
    dashboard: TestClient, sharded: ShardedRotator
) -> None:
    data = dashboard.get("/api/overview").json()
    page = dashboard.get("/")

    rows = [row for row in data["queues"] if row["name"].startswith(sharded.name)]
    assert [(r["name"], r["kind"], r["shards"]) for r in rows] == [
        (sharded.name, "sharded", SHARDS)
    ]
    assert counts(rows[0]["stats"]) == counts(sharded.stats())
    assert (rows[0]["stats"]["pending"], rows[0]["stats"]["dead"]) == (35, 2)
    assert page.status_code == 200
    assert f'href="/queues/{sharded.name}"' in page.text
    assert f"{SHARDS} shards</span>" in page.text
    for shard in sharded.shard_names:
        assert shard not in page.text


def test_the_queue_page_shows_the_sum_and_a_table_of_its_shards(
    dashboard: TestClient, sharded: ShardedRotator
) -> None:
    data = dashboard.get(f"/api/queues/{sharded.name}").json()
    page = dashboard.get(f"/queues/{sharded.name}")

    parts = sharded.shard_stats()
    assert (data["queue_kind"], data["exists"]) == ("sharded", True)
    assert counts(data["stats"]) == counts(sharded.stats())
    assert [(s["index"], s["name"], s["node"]) for s in data["shards"]] == list(
        zip(range(SHARDS), sharded.shard_names, sharded.placement(), strict=True)
    )
    assert [counts(s["stats"]) for s in data["shards"]] == [counts(p) for p in parts]
    assert sum(s["stats"]["pending"] for s in data["shards"]) == data["stats"]["pending"] == 35
    assert sorted(d["id"] for d in data["dead"]) == sorted(d.id for d in sharded.dead())
    assert {d["error"] for d in data["dead"]} == {"card declined"}

    assert page.status_code == 200
    assert f"Sharded queue · {SHARDS} shards" in page.text
    body = page.text.split('<tbody id="shards" data-live="shards">', 1)[1].split("</tbody>", 1)[0]
    rows = re.findall(r"<tr>(.*?)</tr>", body, re.S)
    assert len(rows) == SHARDS
    for k, (row, shard, node, part) in enumerate(
        zip(rows, sharded.shard_names, sharded.placement(), parts, strict=True)
    ):
        cells = [html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(
            r"<td[^>]*>(.*?)</td>", row, re.S
        )]  # fmt: skip
        assert cells[:3] == [str(k), shard, node]
        assert cells[4:9] == [
            str(part.pending), str(part.in_flight), str(part.deferred), str(part.scheduled),
            str(part.dead),
        ]  # fmt: skip
    assert "Next in the ring" not in page.text  # sharded queues offer no peek


def test_a_shard_is_still_an_ordinary_queue_page_of_its_own(
    dashboard: TestClient, sharded: ShardedRotator
) -> None:
    data = dashboard.get(f"/api/queues/{sharded.shard_names[0]}").json()

    assert data["queue_kind"] == "queue"
    assert data["shards"] is None
    assert counts(data["stats"]) == counts(sharded.shard(0).stats())


def test_metrics_show_a_sharded_queue_once_equal_to_its_stats_and_each_shard_apart(
    dashboard: TestClient, sharded: ShardedRotator
) -> None:
    text = dashboard.get("/metrics").text
    stats, parts = sharded.stats(), sharded.shard_stats()

    found = labelled(text, sharded.name)
    assert found[("rotator_queue_pending", None)] == stats.pending == 35
    assert found[("rotator_queue_in_flight", None)] == stats.in_flight == 2
    assert found[("rotator_queue_deferred", None)] == stats.deferred == 1
    assert found[("rotator_queue_dead", None)] == stats.dead == 2
    assert found[("rotator_jobs_pushed_total", None)] == stats.pushed == 40
    assert found[("rotator_queue_shards", None)] == SHARDS
    for k, part in enumerate(parts):
        shard = str(k)
        assert found[("rotator_shard_pending", shard)] == part.pending
        assert found[("rotator_shard_in_flight", shard)] == part.in_flight
        assert found[("rotator_shard_deferred", shard)] == part.deferred
        assert found[("rotator_shard_dead", shard)] == part.dead
    # No double counting: the shards are no queues of their own in any metric.
    assert not set(sharded.shard_names) & queue_labels(text)


def test_actions_with_the_token_act_on_every_shard_and_without_it_on_none(
    dashboard: TestClient, sharded: ShardedRotator
) -> None:
    refused = act(dashboard, "pause", {"queue": sharded.name}, token=None)
    wrong_origin = dashboard.post(
        "/actions/pause",
        data={"queue": sharded.name},
        headers={"x-rotator-token": TOKEN, "origin": "http://evil.example"},
    )
    assert (refused.status_code, wrong_origin.status_code) == (403, 403)
    assert not any(part.paused for part in sharded.shard_stats())

    paused = act(dashboard, "pause", {"queue": sharded.name})
    assert (paused.status_code, paused.json()["message"]) == (200, "paused")
    assert all(part.paused for part in sharded.shard_stats())
    assert dashboard.get(f"/api/queues/{sharded.name}").json()["stats"]["paused"] is True

    resumed = act(dashboard, "resume", {"queue": sharded.name})
    assert (resumed.status_code, resumed.json()["message"]) == (200, "resumed")
    assert not any(part.paused for part in sharded.shard_stats())

    one, other = sorted(letter.id for letter in sharded.dead())
    home = sharded.shard_of(one)
    held = sharded.shard_stats()[home].dead
    requeued = act(dashboard, "requeue", {"queue": sharded.name, "id": one})
    assert requeued.json()["message"] == "requeued 1 dead letter"
    assert [letter.id for letter in sharded.dead()] == [other]
    assert sharded.shard_stats()[home].dead == held - 1  # from the shard its id names

    letter = dashboard.get(f"/api/queues/{sharded.name}").json()["dead"][0]["letter"]
    deleted = act(dashboard, "delete", {"queue": sharded.name, "letter": letter})
    assert deleted.json()["message"] == "deleted 1 dead letter"
    stats = sharded.stats()
    assert (stats.dead, stats.pending) == (0, 36)  # the requeued one is pending again


def test_requeue_all_on_a_sharded_queue_moves_every_shards_dead_letters(
    dashboard: TestClient, sharded: ShardedRotator
) -> None:
    dead_shards = {sharded.shard_of(letter.id) for letter in sharded.dead()}

    answer = act(dashboard, "requeue", {"queue": sharded.name, "all": "1"})

    assert answer.json()["message"] == "requeued 2 dead letters"
    assert sharded.stats().dead == 0
    assert all(sharded.shard_stats()[k].dead == 0 for k in dead_shards)


def test_a_reader_on_its_own_reads_a_sharded_queue_on_its_asyncio_cluster_client(
    cluster: ClusterProcess, sharded: ShardedRotator
) -> None:
    async def read() -> tuple[Any, Any]:
        client = AsyncRedisCluster.from_url(node_url(cluster))
        try:
            reader = Reader(client)
            return await reader.overview(await reader.discover()), await reader.detail(sharded.name)
        finally:
            await client.aclose()

    overview, detail = asyncio.run(read())

    assert overview.shards[sharded.name] == SHARDS
    assert counts(overview.queues[sharded.name]) == counts(sharded.stats())
    assert not set(sharded.shard_names) & set(overview.queues)
    assert detail.shards is not None
    assert [(r.index, r.name, r.node) for r in detail.shards] == list(
        zip(range(SHARDS), sharded.shard_names, sharded.placement(), strict=True)
    )
    assert [counts(r.stats) for r in detail.shards] == [counts(p) for p in sharded.shard_stats()]


# -- rotator queues ----------------------------------------------------------------------------


def test_the_queues_command_lists_a_sharded_queue_as_one_line(
    cluster: ClusterProcess, sharded: ShardedRotator
) -> None:
    data = ok_json(run("queues", "--cluster", "--json", "--url", node_url(cluster)))
    text = ok(run("queues", "--cluster", "--url", node_url(cluster))).splitlines()

    entry = data["queues"][sharded.name]
    assert (entry["kind"], entry["shards"]) == ("sharded", SHARDS)
    assert entry["shard_queues"] == list(sharded.shard_names)
    assert counts(entry) == counts(sharded.stats())
    assert not set(sharded.shard_names) & set(data["queues"])
    mine = [line for line in text if sharded.name in line]
    assert len(mine) == 1
    assert mine[0].startswith(f"sharded  {sharded.name}  {SHARDS} shards  ")
    assert "pending 35" in mine[0]
    assert "dead 2" in mine[0]


# -- in a real browser -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(
            f"no chromium at {CHROMIUM}: install Debian's with `apt-get install chromium`",
            pytrace=False,
        )
    with sync_playwright() as playwright:
        found = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield found
        finally:
            found.close()


def test_the_sharded_queue_in_a_browser_one_overview_row_and_a_live_table_of_shards(
    browser: Browser,
    cluster: ClusterProcess,
    cluster_client: RedisCluster,
    queue_name: str,
    tmp_path: Path,
) -> None:
    docs = bool(os.environ.get(DOCS_ENV))
    name = f"orders-{queue_name[-8:]}"  # short enough to show whole in the screenshot
    sharded = ShardedRotator(cluster_client, name, shards=SHARDS, timeout=60)
    fill(sharded, 120)
    stop = threading.Event()

    def traffic() -> None:
        """Pushes and acks, so that the charts have something to draw."""
        n = 0
        while not stop.is_set():
            sharded.push(*(f"live-{n}-{i}" for i in range(6 + n % 7)))
            sharded.ack(*sharded.next(5 + n % 5))
            n += 1
            stop.wait(0.2)

    try:
        # For the docs, the command's 1 s poll (fast polls draw a sawtooth of the acks' batches).
        interval = 1.0 if docs else 0.2
        with Served(
            node_url(cluster),
            token=TOKEN,
            cluster=True,
            interval=interval,
            discover_every=interval,
        ) as served:
            page = browser.new_page(viewport={"width": 1360, "height": 1000})
            try:
                # The overview: one row, with its shard count; no row of a shard.
                page.goto(served.base + "/")
                expect(page.locator("#live")).to_have_attribute("data-state", "on", timeout=WAIT_MS)
                link = page.locator(f'a[href="/queues/{name}"]')
                expect(link).to_have_count(1)
                row = page.locator("#queues tr", has=link)
                expect(row.locator(".badge.shards")).to_have_text(f"{SHARDS} shards")
                expect(row.locator("td").nth(2)).to_have_text(f"{sharded.stats().pending:,}")
                expect(page.locator("#queues")).not_to_contain_text(f"{name}:")

                # Its page: the shards' table, each row its shard, live.
                link.click()
                expect(page.locator("h1")).to_have_text(name)
                expect(page.locator(".kicker")).to_have_text(f"Sharded queue · {SHARDS} shards")
                expect(page.locator("#live")).to_have_attribute("data-state", "on", timeout=WAIT_MS)
                rows = page.locator("#shards tr")
                expect(rows).to_have_count(SHARDS)
                for k, (shard, node) in enumerate(
                    zip(sharded.shard_names, sharded.placement(), strict=True)
                ):
                    cells = rows.nth(k).locator("td")
                    expect(cells.nth(0)).to_have_text(str(k))
                    expect(cells.nth(1)).to_have_text(shard)
                    expect(cells.nth(2)).to_have_text(node)
                    part = sharded.shard_stats()[k]
                    expect(cells.nth(4)).to_have_text(f"{part.pending:,}")
                    expect(cells.nth(8)).to_have_text(f"{part.dead:,}")

                # A push to one shard shows in its row without a reload.
                k = sharded.shard_of("pushed-now")
                pending = rows.nth(k).locator("td").nth(4)
                before = sharded.shard_stats()[k].pending
                sharded.push("pushed-now")
                expect(pending).to_have_text(f"{before + 1:,}", timeout=WAIT_MS)

                worker = threading.Thread(target=traffic, name="traffic", daemon=True)
                worker.start()
                try:
                    # Some chart; for the docs, 40 s: under the 60 s leases of fill's jobs.
                    time.sleep(40 if docs else 3)
                finally:
                    stop.set()
                    worker.join(10)
                total = sharded.stats()
                cards = page.locator("#cards .stat .value")
                expect(cards.first).to_have_text(f"{total.pending:,}", timeout=WAIT_MS)
                expect(page.locator("#shards")).to_contain_text("Active")
                shot = (ROOT / "docs" if docs else tmp_path) / "dashboard-sharded.png"
                page.screenshot(path=str(shot), full_page=True)
            finally:
                page.close()
    finally:
        stop.set()
        sharded.delete()

    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
