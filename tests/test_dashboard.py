"""rotator.dashboard: the pages, the event streams, /metrics and the actions' safety, against
real servers (the browser test is tests/test_dashboard_browser.py; on a Redis Cluster,
tests/test_cluster_discovery.py).

The test servers are shared: each test looks for the queues it made among whatever else is
there, and changes only those.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import pytest
import redis
import redis.asyncio as aredis
import uvicorn
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from rotator import Rotator, Stats, Topic
from rotator.dashboard import metrics, snapshot
from rotator.dashboard.app import create_app, redacted
from rotator.dashboard.hub import Hub, queue_key
from rotator.dashboard.security import allowed_hosts
from rotator.dashboard.snapshot import Durations, Reader, Reading, rates
from tests.helpers import wait_until
from tests.servers import SentinelGroup, ServerProcess, free_ports

TOKEN = "test-token-0123456789abcdef"
BASE = "http://127.0.0.1:8765"
SAME_ORIGIN = {"origin": BASE, "sec-fetch-site": "same-origin"}
HOSTILE = "<script>alert(1)</script>"
ROTATOR = str(Path(sys.executable).parent / "rotator")


@pytest.fixture
def dashboard(server: ServerProcess) -> Iterator[TestClient]:
    """The dashboard of the test server, with actions on (the token above)."""
    app = create_app(server.url, token=TOKEN, interval=0.1, discover_every=0.1)
    with TestClient(app, base_url=BASE) as client:
        yield client


def act(
    dashboard: TestClient,
    action: str,
    form: dict[str, Any],
    *,
    token: str | None = TOKEN,
    headers: dict[str, str] | None = None,
) -> Any:
    sent = {"accept": "application/json", **SAME_ORIGIN, **(headers or {})}
    if token is not None:
        sent["x-rotator-token"] = token
    return dashboard.post(f"/actions/{action}", data=form, headers=sent)


class Served:
    """The dashboard on uvicorn on a free loopback port, in a thread (for event streams and
    the browser, which need a real socket)."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        interval: float = 0.2,
        discover_every: float = 0.2,
        cluster: bool = False,
    ) -> None:
        app = create_app(
            url,
            token=token,
            interval=interval,
            discover_every=discover_every,
            hosts=allowed_hosts("127.0.0.1"),
            cluster=cluster,
        )
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=0,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=1,
        )
        self.server = uvicorn.Server(config)
        self.app = app
        self.thread = threading.Thread(target=self.server.run, name="dashboard", daemon=True)
        self.base = ""

    def __enter__(self) -> Self:
        self.thread.start()
        give_up = time.monotonic() + 15
        while not self.server.started:
            assert self.thread.is_alive(), "the dashboard's server stopped at start"
            assert time.monotonic() < give_up, "the dashboard's server did not start"
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.base = f"http://127.0.0.1:{port}"
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        if self.thread.is_alive():
            # A page's event stream can hold a graceful shutdown past its timeout on a busy
            # machine (seen once under the full suite): then stop as Ctrl-C twice would.
            self.server.force_exit = True
            self.thread.join(10)
        assert not self.thread.is_alive(), "the dashboard's server did not stop"


def stats_now(q: Rotator) -> dict[str, Any]:
    """Stats but the age, which moves on by itself."""
    found = q.stats().as_dict()
    del found["oldest_pending_age"]
    return found


# -- pages -------------------------------------------------------------------------------------


def test_the_overview_lists_every_queue_and_topic_found_by_scan(
    dashboard: TestClient, client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name)
    q.push("a", "b", "c")
    topic = Topic(client, f"{queue_name}-news")
    topic.subscribe("mail")
    topic.publish("hello")

    page = dashboard.get("/")
    data = dashboard.get("/api/overview").json()

    assert page.status_code == 200
    assert f'href="/queues/{queue_name}"' in page.text
    assert f'href="/topics/{queue_name}-news"' in page.text
    assert "<code>SCAN</code>, never <code>KEYS</code>" in page.text
    row = next(r for r in data["queues"] if r["name"] == queue_name)
    assert row["stats"]["pending"] == 3
    news = next(t for t in data["topics"] if t["name"] == f"{queue_name}-news")
    assert news["retained"] == 1
    assert [(g["name"], g["backlog"]) for g in news["groups"]] == [("mail", 1)]


def test_the_queue_page_shows_counts_peek_dead_letters_schedules_and_the_rate_limit(
    dashboard: TestClient, client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name)
    q.push("job-1", "job-2", "job-3")
    (held,) = q.next(1)
    q.bury(held, error="card declined")
    q.sweep()  # writes the letter
    q.next(1)  # job-2 in flight, job-3 pending
    q.schedule("nightly", every=86_400, job_id="report")
    q.set_rate_limit(100, per=1.0)
    q.pause()

    page = dashboard.get(f"/queues/{queue_name}")
    data = dashboard.get(f"/api/queues/{queue_name}").json()

    assert page.status_code == 200
    stats = q.stats()
    assert data["stats"]["pending"] == stats.pending == 1
    assert data["stats"]["in_flight"] == stats.in_flight == 1
    assert data["stats"]["dead"] == stats.dead == 1
    assert data["stats"]["paused"] is True
    assert data["stats"]["rate_limit"] == {"jobs": 100, "per": 1.0}
    assert [d["id"] for d in data["dead"]] == ["job-1"]
    assert data["dead"][0]["error"] == "card declined"
    assert [s["name"] for s in data["schedules"]] == ["nightly"]
    assert "job-3" in [e["id"] for e in data["peek"]]
    assert data["durations"] is None  # the module keeps no processing times yet
    for shown in ("job-1", "card declined", "nightly", "Paused", "100 / s", "job-3"):
        assert shown in page.text, shown
    assert "Not measured" in page.text  # processing time: absent, not zero


def test_a_topic_page_shows_its_groups_and_their_backlog(
    dashboard: TestClient, client: redis.Redis, queue_name: str
) -> None:
    topic = Topic(client, queue_name)
    topic.subscribe("billing")
    topic.subscribe("search")
    topic.publish_many(["a", "b", "c"])
    topic.group("billing").ack(*topic.group("billing").next(2))

    page = dashboard.get(f"/topics/{queue_name}")

    assert page.status_code == 200
    rows = page.text.split('<tbody id="groups"', 1)[1]
    billing = rows.split("<code>billing</code>", 1)[1].split("</tr>", 1)[0]
    search = rows.split("<code>search</code>", 1)[1].split("</tr>", 1)[0]
    assert '<td class="n">1</td>' in billing  # backlog 1 of 3
    assert '<td class="n">3</td>' in search


def test_an_unknown_queue_or_a_name_rotator_never_makes_is_not_found(
    dashboard: TestClient, queue_name: str
) -> None:
    assert dashboard.get(f"/queues/{queue_name}").status_code == 404
    assert dashboard.get("/queues/a%7Bb%7D").status_code == 404  # "a{b}"
    assert dashboard.get(f"/topics/{queue_name}").status_code == 404
    assert dashboard.get(f"/api/queues/{queue_name}").status_code == 404


def test_a_hostile_id_and_error_are_escaped_in_pages_and_live_parts(
    dashboard: TestClient, client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name)
    q.push(HOSTILE)
    q.bury(*q.next(1), error='<img src=x onerror="alert(2)">')
    q.sweep()  # writes the letter
    q.push("next")

    page = dashboard.get(f"/queues/{queue_name}").text
    board = dashboard.app.state.dashboard  # type: ignore[attr-defined]
    parts = board.render(dashboard.get(f"/api/queues/{queue_name}").json())

    for html in (page, *parts.values()):
        assert HOSTILE not in html
        assert "<img" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=" in parts["dead"]


def test_pages_forbid_scripts_from_elsewhere_and_framing(dashboard: TestClient) -> None:
    page = dashboard.get("/")
    policy = page.headers["content-security-policy"]

    assert "script-src 'self'" in policy
    assert "frame-ancestors 'none'" in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    assert '<script src="/static/dashboard.js' in page.text
    assert 'src="http' not in page.text
    assert 'href="http' not in page.text


def test_the_static_files_are_served_from_the_package(dashboard: TestClient) -> None:
    script = dashboard.get("/static/dashboard.js")
    style = dashboard.get("/static/dashboard.css")

    assert script.status_code == style.status_code == 200
    assert "EventSource" in script.text
    assert "innerHTML" in script.text  # only of the parts the server rendered and escaped
    assert ".card" in style.text


def test_a_host_header_other_than_loopback_is_refused(dashboard: TestClient) -> None:
    # A page of another site whose name was rebound to 127.0.0.1 cannot read the dashboard.
    assert dashboard.get("/", headers={"host": "attacker.example:8765"}).status_code == 400
    assert dashboard.get("/", headers={"host": "localhost:8765"}).status_code == 200


def test_an_unreachable_server_is_a_503_not_a_crash() -> None:
    app = create_app("redis://127.0.0.1:1/0", token=TOKEN)
    with TestClient(app, base_url=BASE) as dashboard:
        health = dashboard.get("/healthz")
        page = dashboard.get("/")
        metric = dashboard.get("/metrics")

    assert health.status_code == 503
    assert health.json()["ok"] is False
    assert page.status_code == 503
    assert "cannot read the server" in page.text
    values = {
        s.name: s.value for f in text_string_to_metric_families(metric.text) for s in f.samples
    }
    assert values == {"rotator_up": 0.0}


def test_healthz_answers_when_the_server_does(dashboard: TestClient) -> None:
    assert dashboard.get("/healthz").json() == {"ok": True}


# -- /metrics ----------------------------------------------------------------------------------


def all_samples(text: str) -> dict[str, float]:
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def samples(text: str, queue: str) -> dict[str, float]:
    """The samples labelled ``queue`` by metric name (a counter's with its _total)."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("queue") == queue:
                found[sample.name] = sample.value
    return found


def test_metrics_parse_and_match_stats(
    dashboard: TestClient, client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name, max_deliveries=1)
    q.push(*(f"job-{n}" for n in range(10)))
    jobs = q.next(4)
    q.ack(*jobs[:2])
    q.nack(jobs[2], delay=60)
    q.bury(jobs[3], error="no")
    q.sweep()  # writes the letter
    q.next(1)

    response = dashboard.get("/metrics")
    stats = q.stats()

    assert response.headers["content-type"].startswith("text/plain")
    found = samples(response.text, queue_name)
    assert found["rotator_queue_pending"] == stats.pending
    assert found["rotator_queue_in_flight"] == stats.in_flight
    assert found["rotator_queue_deferred"] == stats.deferred
    assert found["rotator_queue_dead"] == stats.dead == 1
    assert found["rotator_queue_oldest_pending_age_seconds"] == pytest.approx(
        stats.oldest_pending_age, abs=1.0
    )
    assert found["rotator_jobs_pushed_total"] == stats.pushed == 10
    assert found["rotator_jobs_delivered_total"] == stats.delivered
    assert found["rotator_jobs_completed_total"] == stats.completed
    assert found["rotator_jobs_retried_total"] == stats.retried == 1
    assert found["rotator_jobs_reclaimed_total"] == stats.reclaimed
    assert found["rotator_jobs_dead_total"] == stats.dead_lettered == 1
    assert found["rotator_jobs_cancelled_total"] == stats.cancelled == 0
    assert not any(name.startswith("rotator_job_duration_seconds") for name in found)
    assert all_samples(response.text)["rotator_up"] == 1.0


def test_metrics_leave_out_what_the_module_does_not_report() -> None:
    bare = Stats(10, 5, 3, 1, 1, 0, 2.5)  # a module without counters or processing times

    text = "".join(
        f"{sample.name} {sample.value}\n"
        for family in metrics.queue_metrics({"orders": bare})
        for sample in family.samples
    )

    assert "rotator_queue_pending 5" in text
    assert "rotator_jobs_" not in text  # absent, never a 0 that would look like a count
    assert "rotator_job_duration_seconds" not in text


def test_the_duration_histogram_appears_once_the_module_keeps_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    durations = Durations(((0.1, 50), (0.5, 90), (1.0, 99), (math.inf, 100)), total=25.0)
    monkeypatch.setattr(metrics, "durations_of", lambda stats: durations)
    monkeypatch.setattr(snapshot, "durations_of", lambda stats: durations)
    stats = Stats(0, 0, 0, 0, 0, 0, None)

    families = {f.name: f for f in metrics.queue_metrics({"orders": stats})}
    shown = snapshot.durations_json(stats)

    histogram = families["rotator_job_duration_seconds"]
    assert histogram.type == "histogram"
    buckets = {s.labels["le"]: s.value for s in histogram.samples if s.name.endswith("_bucket")}
    assert buckets == {"0.1": 50, "0.5": 90, "1.0": 99, "+Inf": 100}
    assert shown is not None
    assert shown["p50"] == pytest.approx(0.1)
    assert shown["p95"] == pytest.approx(0.5 + 0.5 * (95 - 90) / 9)
    assert shown["p99"] == pytest.approx(1.0)
    assert shown["count"] == 100


# -- rates -------------------------------------------------------------------------------------


def test_rates_come_from_two_readings_and_are_absent_where_counters_are() -> None:
    before = Stats(5, 5, 0, 0, 0, 0, None, pushed=10, completed=4, delivered=4)
    after = Stats(3, 3, 0, 0, 0, 0, None, pushed=30, completed=20, delivered=22)

    first = rates(None, Reading(100.0, before))
    found = rates(Reading(100.0, before), Reading(102.0, after))
    reset = rates(Reading(100.0, after), Reading(101.0, before))  # deleted and made again

    assert set(first.values()) == {None}
    assert found["pushed"] == 10.0
    assert found["completed"] == 8.0
    assert found["retried"] is None  # not reported by this (made-up) module
    assert found["backlog"] == -1.0
    assert reset["pushed"] is None


# -- the shared poll loop and its event streams ------------------------------------------------


def test_one_poll_loop_serves_every_page_and_stops_with_the_last(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    Rotator(client, queue_name).push("a")

    async def scenario() -> tuple[int, int, list[dict[str, Any]], bool]:
        async_client = aredis.Redis.from_url(server.url)
        hub = Hub(Reader(async_client), interval=0.05, discover_every=0.05)
        pages = [hub.listen(), hub.listen(), hub.listen(queue_key(queue_name))]
        try:
            seen = [json.loads(await pages[2].__anext__())]
            for _ in range(5):
                for page in pages[:2]:
                    await page.__anext__()
            seen.append(json.loads(await pages[2].__anext__()))
            polls, listeners = hub.polls, hub.listeners
        finally:
            for page in pages:
                await page.aclose()
        stopped = hub._task is None
        await hub.close()
        await async_client.aclose()
        return polls, listeners, seen, stopped

    polls, listeners, seen, stopped = asyncio.run(scenario())

    assert listeners == 3
    assert 5 <= polls <= 8  # one reading per tick for all three pages, not one each
    assert "history" in seen[0]  # the first event carries the chart's points
    assert "history" not in seen[1]
    assert seen[1]["stats"]["pending"] == 1
    assert stopped  # no page listens: no reads


class LosesACancel(Reader):
    """A real reader whose discovery, cancelled, raises TimeoutError instead: as a read of
    redis-py's can when a cancellation and its socket timeout meet."""

    async def discover(self) -> Any:
        found = await super().discover()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            raise TimeoutError("timed out (injected)") from None
        return found


def test_the_poll_loop_stops_at_close_even_when_a_read_loses_the_cancellation(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    Rotator(client, queue_name).push("a")

    async def scenario() -> tuple[float, bool]:
        async_client = aredis.Redis.from_url(server.url)
        hub = Hub(LosesACancel(async_client), interval=0.05, discover_every=0.05)
        page = hub.listen()
        first = asyncio.ensure_future(page.__anext__())
        await asyncio.sleep(0.3)  # the loop is inside discover()
        task = hub._task
        began = time.monotonic()
        await asyncio.wait_for(hub.close(), 10)  # (a close that hangs fails here)
        took = time.monotonic() - began
        await asyncio.sleep(0.2)
        first.cancel()
        await async_client.aclose()
        return took, task is not None and task.done()

    took, done = asyncio.run(scenario())

    assert took < 1  # not CLOSE_WAIT: the loop saw it is closing
    assert done  # and ended, rather than polling on after the lost cancellation


def test_readings_closer_than_half_an_interval_keep_the_last_rates(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name)
    q.push("a")

    async def scenario() -> list[dict[str, Any]]:
        async_client = aredis.Redis.from_url(server.url)
        hub = Hub(Reader(async_client), interval=10.0)
        found = []
        for _ in range(2):
            await hub.poll()  # the second at once, as when a page opens
            row = next(r for r in hub._snapshots["overview"]["queues"] if r["name"] == queue_name)
            found.append(row)
            q.push(f"more-{len(found)}")
        await async_client.aclose()
        return found

    first, second = asyncio.run(scenario())

    assert first["rates"]["pushed"] is None
    assert second["rates"]["pushed"] is None  # not 1 job over a few milliseconds
    assert second["stats"]["pending"] == 2  # the counts are fresh all the same


def read_events(response: http.client.HTTPResponse) -> Iterator[dict[str, Any]]:
    for raw in response:
        line = raw.decode().rstrip("\n")
        if line.startswith("data: "):
            yield json.loads(line.removeprefix("data: "))


def test_an_event_stream_pushes_a_changed_count(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name)
    q.push("first")
    with Served(server.url) as served:
        host, port = served.base.removeprefix("http://").split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=10)
        connection.request("GET", f"/events/queues/{queue_name}")
        response = connection.getresponse()
        assert response.getheader("content-type", "").startswith("text/event-stream")
        events = read_events(response)
        first = next(events)
        q.push("second", "third")
        later = next(e for e in events if e["stats"]["pending"] == 3)
        connection.close()

    assert first["stats"]["pending"] == 1
    assert first["html"]["cards"].count("Pending") == 1  # the live parts, rendered
    assert later["point"]["backlog"] == 3


def test_a_topic_stream_pushes_its_groups_backlog(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    topic = Topic(client, queue_name)
    topic.subscribe("mail")
    topic.publish("one")
    with Served(server.url) as served:
        host, port = served.base.removeprefix("http://").split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=10)
        connection.request("GET", f"/events/topics/{queue_name}")
        events = read_events(connection.getresponse())
        first = next(events)
        topic.publish_many(["two", "three"])
        later = next(e for e in events if e["backlog"] == 3)
        connection.close()

    assert first["kind"] == "topic"
    assert first["backlog"] == 1
    assert "<code>mail</code>" in later["html"]["groups"]


# -- actions -----------------------------------------------------------------------------------


def test_actions_pause_resume_requeue_and_delete_with_the_token(
    dashboard: TestClient, client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name)
    q.push("a", "b", "c")
    q.bury(*q.next(3), error="failed")
    q.sweep()  # writes the letters
    assert q.stats().dead == 3

    paused = act(dashboard, "pause", {"queue": queue_name})
    again = act(dashboard, "pause", {"queue": queue_name})
    assert paused.json() == {"ok": True, "message": "paused"}
    assert again.json()["message"] == "was paused already"
    assert q.stats().paused
    assert act(dashboard, "resume", {"queue": queue_name}).json()["message"] == "resumed"
    assert not q.stats().paused

    requeued = act(dashboard, "requeue", {"queue": queue_name, "id": "a"})
    assert requeued.json()["message"] == "requeued 1 dead letter"
    letter = next(d for d in dashboard.get(f"/api/queues/{queue_name}").json()["dead"])
    deleted = act(dashboard, "delete", {"queue": queue_name, "letter": letter["letter"]})
    assert deleted.json()["message"] == "deleted 1 dead letter"
    assert q.stats().dead == 1
    assert act(dashboard, "requeue", {"queue": queue_name, "all": "1"}).status_code == 200
    assert q.stats().dead == 0
    assert sorted(job.id for job in q.next(10)) == sorted({"a", "b", "c"} - {letter["id"]})


def test_a_plain_form_with_the_token_field_goes_back_to_the_queue_page(
    dashboard: TestClient, client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name)
    q.push("a")

    response = dashboard.post(
        "/actions/pause",
        data={"queue": queue_name, "token": TOKEN},
        headers=SAME_ORIGIN,
        follow_redirects=False,
    )

    assert response.status_code == 303
    assert response.headers["location"] == f"/queues/{queue_name}?done=paused"
    assert q.stats().paused
    assert (
        '<div class="notice ok" role="status">paused</div>'
        in dashboard.get(response.headers["location"]).text
    )
    # The page shows only what an action answers, not any text a link puts there.
    forged = dashboard.get(f"/queues/{queue_name}?done=Your+session+expired").text
    assert "session expired" not in forged


@pytest.mark.parametrize(
    "refusal",
    [
        (None, {}, "needs the dashboard token"),
        ("wrong-token", {}, "wrong token"),
        (TOKEN, {"origin": "http://attacker.example"}, "another origin"),
        (TOKEN, {"sec-fetch-site": "cross-site"}, "cross-site"),
        (TOKEN, {"origin": "null"}, "another origin"),
    ],
    ids=["no-token", "wrong-token", "other-origin", "cross-site", "null-origin"],
)
def test_an_action_without_the_token_or_from_another_site_is_refused(
    dashboard: TestClient,
    client: redis.Redis,
    queue_name: str,
    refusal: tuple[str | None, dict[str, str], str],
) -> None:
    token, headers, says = refusal
    q = Rotator(client, queue_name)
    q.push("a")
    before = stats_now(q)

    response = act(dashboard, "pause", {"queue": queue_name}, token=token, headers=headers)

    assert response.status_code == 403
    assert response.json()["ok"] is False
    assert says in response.json()["message"]
    assert stats_now(q) == before


def test_actions_are_post_only(dashboard: TestClient, client: redis.Redis, queue_name: str) -> None:
    Rotator(client, queue_name).push("a")

    assert dashboard.get(f"/actions/pause?queue={queue_name}&token={TOKEN}").status_code == 405
    assert not Rotator(client, queue_name).stats().paused


def test_without_a_token_configured_actions_are_off_and_the_page_says_so(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name)
    q.push("a")
    app = create_app(server.url, token=None)
    with TestClient(app, base_url=BASE) as dashboard:
        page = dashboard.get(f"/queues/{queue_name}").text
        response = act(dashboard, "pause", {"queue": queue_name}, token="anything")

    assert "Actions are off" in page
    assert "ROTATOR_DASHBOARD_TOKEN" in page
    assert 'id="pause" disabled' in page
    assert response.status_code == 403
    assert "actions are off" in response.json()["message"]
    assert not q.stats().paused


def test_an_action_on_an_unknown_queue_or_an_unknown_action_is_refused(
    dashboard: TestClient, queue_name: str
) -> None:
    unknown = act(dashboard, "pause", {"queue": queue_name})
    bad_name = act(dashboard, "pause", {"queue": "a{b}"})
    bad_action = act(dashboard, "flushall", {"queue": queue_name})

    assert unknown.status_code == 404
    assert bad_name.status_code == 400
    assert bad_action.status_code == 404


# -- packaging ---------------------------------------------------------------------------------


def test_importing_rotator_or_its_metrics_loads_no_web_framework() -> None:
    code = (
        "import sys, rotator, rotator.aio, rotator.cli; a = set(sys.modules);"
        " import rotator.dashboard.metrics; b = set(sys.modules);"
        " print(' '.join(sorted(a))); print(' '.join(sorted(b)))"
    )
    plain, with_metrics = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()

    for module in ("starlette", "uvicorn", "prometheus_client", "jinja2", "rotator.dashboard.app"):
        assert module not in plain.split(), module
    for module in ("starlette", "uvicorn", "jinja2"):
        assert module not in with_metrics.split(), module


def test_the_wheel_carries_the_templates_and_static_files(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parent.parent
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(root)],
        capture_output=True,
        check=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        meta = archive.read(next(n for n in names if n.endswith("METADATA"))).decode()

    shipped = {
        str(path.relative_to(root))
        for path in (root / "rotator" / "dashboard").rglob("*")
        if path.is_file() and path.suffix in {".py", ".html", ".js", ".css"}
    }
    assert shipped >= {
        "rotator/dashboard/static/dashboard.js",
        "rotator/dashboard/static/dashboard.css",
        "rotator/dashboard/templates/queue.html",
    }
    assert shipped <= names
    assert "Provides-Extra: dashboard" in meta
    for package in ("starlette", "uvicorn", "prometheus-client", "jinja2"):
        assert re.search(rf"Requires-Dist: {package}\b.*extra == .dashboard.", meta), package


# -- the command -------------------------------------------------------------------------------


def test_the_dashboard_command_serves_until_ctrl_c(
    server: ServerProcess, queue_name: str, client: redis.Redis
) -> None:
    Rotator(client, queue_name).push("a")
    (port,) = free_ports(1)
    env = {**os.environ, "ROTATOR_DASHBOARD_TOKEN": TOKEN, "ROTATOR_URL": server.url}
    command = subprocess.Popen(
        [ROTATOR, "dashboard", "--port", str(port)],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert command.stderr is not None
        said = command.stderr.readline()
        assert f"at http://127.0.0.1:{port}/ (actions on" in said
        wait_until(lambda: answers(f"http://127.0.0.1:{port}/healthz"))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            assert f'rotator_queue_pending{{queue="{queue_name}"}} 1.0' in reply.read().decode()
        command.send_signal(signal.SIGINT)
        assert command.wait(timeout=15) == 0
    finally:
        if command.poll() is None:
            command.kill()
            command.wait()


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


WITHOUT_THE_EXTRA = """
import sys
sys.modules["starlette"] = None  # an install without the dashboard extra
from click.testing import CliRunner
from rotator.cli import main
result = CliRunner().invoke(main, ["dashboard", "--url", sys.argv[1]])
print(result.exit_code)
print(result.stderr, end="")
"""


def test_without_the_extra_the_command_says_which_extra_to_install(server: ServerProcess) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_THE_EXTRA, server.url],
        capture_output=True,
        text=True,
        check=True,
    )

    code, message = done.stdout.splitlines()
    assert code == "1"
    assert message.startswith("rotator: error: the dashboard needs its extra")
    assert "pip install 'rotator-queue[dashboard]'" in message


# -- behind Redis Sentinel -----------------------------------------------------------------


def test_the_dashboard_shows_a_sentinel_url_without_its_password() -> None:
    shown = redacted("redis+sentinel://ann:secret@s1:26379,s2:26379/jobs")

    assert shown == "redis+sentinel://ann:***@s1:26379,s2:26379/jobs"
    assert redacted("redis+sentinel://s1,s2/jobs") == "redis+sentinel://s1,s2/jobs"
    # (a plain URL's as before: by its text now)
    assert redacted("redis://:secret@h1:6379/0") == "redis://:***@h1:6379/0"
    assert redacted("rediss://ann:secret@h1/0") == "rediss://ann:***@h1/0"


def test_the_dashboard_by_a_sentinel_url_reads_the_master(
    sentinel_group: SentinelGroup, queue_name: str
) -> None:
    Rotator.from_url(sentinel_group.url, queue_name).push("a", "b", "c")
    app = create_app(sentinel_group.url, interval=0.1, discover_every=0.1)
    with TestClient(app, base_url="http://127.0.0.1:8765") as dashboard:
        overview = dashboard.get("/api/overview").json()
        metrics = dashboard.get("/metrics").text

    row = next(r for r in overview["queues"] if r["name"] == queue_name)
    assert row["stats"]["pending"] == 3
    assert all_samples(metrics)["rotator_up"] == 1.0
