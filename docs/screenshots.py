"""Makes docs/dashboard-overview.png and docs/dashboard-queue.png: a private embedded server
in a temporary directory, a few queues and a topic with workers running for a minute (so the
charts have something to draw), the dashboard on a loopback port, and Debian's chromium.

    .venv/bin/python docs/screenshots.py [--seconds 75]

Needs the dev extras (the embedded server, the dashboard extra, playwright) and
`apt-get install chromium`; downloads nothing.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from playwright.sync_api import sync_playwright  # noqa: E402

from rotator import Rotator, Topic  # noqa: E402
from rotator.server import EmbeddedServer  # noqa: E402
from tests.test_dashboard_browser import CHROMIUM, CHROMIUM_ARGS, Served  # noqa: E402

TOKEN = "docs-screenshot-token"


def workload(server: EmbeddedServer, stop: threading.Event) -> list[threading.Thread]:
    client = server.client()
    orders = Rotator(client, "orders", timeout=5, max_deliveries=3)
    emails = Rotator(client, "emails", timeout=5)
    reports = Rotator(client, "reports")
    thumbs = Rotator(client, "thumbnails")
    orders.push(*(f"order-{n}" for n in range(1, 801)))
    emails.push(*(f"mail-{n}" for n in range(1, 301)))
    reports.push("report-2026-11", "report-2026-12", delay=3600)
    reports.schedule("nightly", every=86_400, job_id="nightly-report")
    reports.schedule("hourly", every=3600, job_id="hourly-rollup")
    reports.push("report-adhoc-1")
    thumbs.push(*(f"img-{n}.jpg" for n in range(1, 2401)))
    thumbs.pause()
    orders.set_rate_limit(500, per=1.0)
    orders.schedule("reconcile", every=3600, job_id="reconcile-payments")
    orders.schedule("expire-carts", every=900, job_id="expire-carts")
    emails.set_rate_limit(40, per=1.0)
    # Dead letters with their errors.
    jobs = orders.next(4)
    orders.bury(jobs[0], error="card declined: insufficient funds")
    orders.bury(jobs[1], error="address validation failed (postcode 75OO1)")
    orders.bury(jobs[2], error="TimeoutError: payment gateway did not answer in 30 s")
    orders.nack(jobs[3], delay=20)
    topic = Topic(client, "events")
    for group in ("billing", "search", "audit"):
        topic.subscribe(group)

    def produce() -> None:
        n = 10_000
        while not stop.is_set():
            wave = 1 + 0.8 * random.random()
            burst = int(30 * wave)
            orders.push(*(f"order-{n + i}" for i in range(burst)))
            emails.push(*(f"mail-{n + i}" for i in range(burst // 2)))
            topic.publish_many([f'{{"event": {n + i}}}' for i in range(burst // 3)])
            n += burst
            stop.wait(0.5)

    def consume(q: Rotator, pace: float, fail_every: int) -> None:
        count = 0
        while not stop.is_set():
            jobs = q.next(8, block=0.2)
            for job in jobs:
                count += 1
                if fail_every and count % fail_every == 0:
                    q.nack(job, delay=2)
                else:
                    q.ack(job)
            if jobs:  # what a worker loop reports: how long each job took (about 30 ms here)
                q.durations(*(random.lognormvariate(-3.5, 0.7) for _ in jobs))
            stop.wait(pace)

    def consume_group(group: str, pace: float) -> None:
        g = topic.group(group)
        while not stop.is_set():
            jobs = g.next(10, block=0.2)
            if jobs:
                g.ack(*jobs)
            stop.wait(pace)

    threads = [
        threading.Thread(target=produce),
        threading.Thread(target=consume, args=(orders, 0.09, 40)),
        threading.Thread(target=consume, args=(emails, 0.2, 0)),
        threading.Thread(target=consume_group, args=("billing", 0.1)),
        threading.Thread(target=consume_group, args=("search", 0.3)),
    ]
    for thread in threads:
        thread.start()
    return threads


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=75.0)
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="rotdoc", dir="/tmp"))
    server = EmbeddedServer(home)
    server.start()
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        threads = workload(server, stop)
        with (
            Served(server.url, token=TOKEN, interval=1.0, discover_every=10.0) as served,
            sync_playwright() as playwright,
        ):
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1360, "height": 900})
            page.goto(served.base + "/queues/orders")
            # The queue page listens meanwhile: the hub keeps every queue's chart history.
            time.sleep(args.seconds)
            page.goto(served.base + "/")
            page.wait_for_selector("#live[data-state='on']")
            page.wait_for_timeout(2500)
            page.screenshot(path=str(args.out / "dashboard-overview.png"), full_page=True)
            page.goto(served.base + "/queues/orders")
            page.wait_for_selector("#live[data-state='on']")
            page.fill("#token", TOKEN)
            page.click("#token-form button")
            page.wait_for_timeout(2500)
            page.screenshot(path=str(args.out / "dashboard-queue.png"), full_page=True)
            browser.close()
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        server.stop()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
