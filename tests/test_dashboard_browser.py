"""The dashboard in a real browser: Playwright driving Debian's chromium (never a browser
download) against the app on uvicorn on a loopback port.

One test walks what a person does: opens the overview and sees a count change after a push,
opens a queue, is refused an action without the token, types the token, and requeues a dead
letter (with a hostile id) by clicking. A missing /usr/bin/chromium fails, saying how to
install it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Dialog, expect, sync_playwright

from rotator import Rotator
from tests.servers import ServerProcess
from tests.test_dashboard import HOSTILE, TOKEN, Served

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WAIT_MS = 10_000  # the page is live within a second; this is the give-up time


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(
            f"no chromium at {CHROMIUM}: install Debian's with `apt-get install chromium`"
            " (the browser tests never download a browser)",
            pytrace=False,
        )
    with sync_playwright() as playwright:
        found = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield found
        finally:
            found.close()


def test_a_person_watches_a_count_change_and_requeues_a_dead_letter_by_clicking(
    browser: Browser, redis_server: ServerProcess, queue_name: str
) -> None:
    client = redis_server.client()
    q = Rotator(client, queue_name)
    q.push("first")
    q.push(HOSTILE)
    q.bury(*(job for job in q.next(2) if job.id == HOSTILE), error="<b>no markup</b>")
    q.sweep()  # writes the letter
    dialogs: list[str] = []

    with Served(redis_server.url, token=TOKEN) as served:
        page = browser.new_page()

        def dismiss(dialog: Dialog) -> None:
            dialogs.append(dialog.message)
            dialog.dismiss()

        page.on("dialog", dismiss)
        try:
            # The overview: the count changes live after a push through the API.
            page.goto(served.base + "/")
            expect(page.locator("#live")).to_have_attribute("data-state", "on", timeout=WAIT_MS)
            row = page.locator("#queues tr", has=page.locator(f'a[href="/queues/{queue_name}"]'))
            pending = row.locator("td").nth(2)
            expect(pending).to_have_text("0", timeout=WAIT_MS)  # "first" is leased
            q.push("second", "third")
            expect(pending).to_have_text("2", timeout=WAIT_MS)

            # The queue page: refused without the token, the letter stays.
            row.locator("a").click()
            expect(page.locator("h1")).to_have_text(queue_name, timeout=WAIT_MS)
            expect(page.locator("#live")).to_have_attribute("data-state", "on", timeout=WAIT_MS)
            dead = page.locator("#dead tr", has_text=HOSTILE)
            expect(dead).to_have_count(1)
            expect(dead).to_contain_text("<b>no markup</b>")  # shown as text, not markup
            dead.get_by_role("button", name="Requeue").click()
            result = page.locator("#action-result")
            expect(result).to_have_text(
                "refused: this action needs the dashboard token", timeout=WAIT_MS
            )
            assert q.stats().dead == 1

            # With the token typed in: requeued, and the page shows it without a reload.
            page.fill("#token", TOKEN)
            page.get_by_role("button", name="Use for this tab").click()
            expect(page.locator("#token-state")).to_have_text("set for this tab")
            dead.get_by_role("button", name="Requeue").click()
            expect(result).to_have_text("requeued 1 dead letter", timeout=WAIT_MS)
            expect(page.locator("#dead")).to_have_text("No dead letters.", timeout=WAIT_MS)
            expect(page.locator("#peek")).to_contain_text(HOSTILE, timeout=WAIT_MS)
        finally:
            page.close()

    assert q.stats().dead == 0
    assert HOSTILE in [entry.element for entry in q.peek(10)]
    assert dialogs == []  # the hostile id never ran as a script


def test_the_pause_button_is_off_without_a_token_configured(
    browser: Browser, redis_server: ServerProcess, queue_name: str
) -> None:
    Rotator(redis_server.client(), queue_name).push("a")

    with Served(redis_server.url, token=None) as served:
        page = browser.new_page()
        try:
            page.goto(f"{served.base}/queues/{queue_name}")
            expect(page.locator(".notice.off")).to_contain_text("Actions are off")
            expect(page.locator("#pause")).to_be_disabled()
            expect(page.locator("#resume")).to_be_disabled()
        finally:
            page.close()


def test_a_click_held_across_a_live_update_still_opens_the_queue(
    browser: Browser, redis_server: ServerProcess, queue_name: str
) -> None:
    """A press and a release with a count change between them: the table is not swapped
    under the pointer, so the click lands and opens the queue (a swap in between ate it)."""
    q = Rotator(redis_server.client(), queue_name)
    q.push("a")

    with Served(redis_server.url, token=None) as served:
        page = browser.new_page()
        try:
            page.goto(served.base + "/")
            expect(page.locator("#live")).to_have_attribute("data-state", "on", timeout=WAIT_MS)
            row = page.locator("#queues tr", has=page.locator(f'a[href="/queues/{queue_name}"]'))
            link, pending = row.locator("a"), row.locator("td").nth(2)
            expect(pending).to_have_text("1", timeout=WAIT_MS)
            link.hover()  # a point of the link itself (a wrapped name has gaps in its box)
            page.mouse.down()
            q.push("b")
            # Several polls go by with the button down: the count changed and was held back.
            page.wait_for_timeout(1000)
            page.mouse.up()
            expect(page.locator("h1")).to_have_text(queue_name, timeout=WAIT_MS)
        finally:
            page.close()
