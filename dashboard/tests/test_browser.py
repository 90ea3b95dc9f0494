"""The dashboard in a real browser: headless Chromium driven by Playwright.

Needs Debian's `chromium` at /usr/bin/chromium (`apt-get install chromium`) and
the `playwright` Python package (the `test` extra); Playwright's own browser
downloads are never used.  Without them these tests are skipped, and the rest
of the suite runs.

`TASKFORGE_SCREENSHOTS=1` also writes the screenshots of docs/screenshots/
(see docs/screenshots/make_screenshots.py).
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.contrib.auth.models import User

from dashboard import roles, snapshot, sse
from dashboard.tests import demo
from dashboard.tests.conftest import PASSWORD, make_staff
from queues.models import Queue
from queues.tests.factories import QueueFactory
from taskforge.api.models import ApiKey
from tasks.models import Task, TaskStatus
from tasks.tests.factories import ScheduleFactory, TaskFactory
from tests.service import api_process

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
TIMEOUT_MS = 10_000

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not os.path.exists(CHROMIUM):
        pytest.skip("chromium not installed: apt-get install chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright not installed: make test installs it (the test extra)")
    # Playwright's sync API keeps an asyncio loop in this thread, and Django
    # refuses ORM calls where a loop runs; the tests' ORM calls are plain sync
    # code between browser steps, so allow them while the browser is up.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(
                executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
            )
            yield chromium
            chromium.close()
    finally:
        if previous is None:
            del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def fast_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    # Snapshots twice a second, streams of a few seconds: the tests see
    # updates quickly and reconnects happen too (on live_server: a run_api
    # process keeps the defaults, a snapshot every 2 s).
    monkeypatch.setattr(sse, "INTERVAL_SECONDS", 0.5)
    monkeypatch.setattr(sse, "LIFETIME_SECONDS", 6.0)
    monkeypatch.setattr(sse, "RETRY_MS", 300)
    monkeypatch.setattr(snapshot, "MAX_AGE_SECONDS", 0.0)


@dataclass(frozen=True)
class Site:
    url: str
    run_api: bool  # a `run_api` process, not Django's live_server in this one


# Tests marked so run twice: on Django's live_server, and on a `run_api` process (the
# production server, granian through taskforge.api.bridge) serving the test database.
# Those that load dashboard.js and follow the live stream are marked.
on_run_api_too = pytest.mark.parametrize("site", ["live_server", "run_api"], indirect=True)


@pytest.fixture
def site(request: pytest.FixtureRequest) -> Iterator[Site]:
    """Where the browser goes: Django's live_server unless `on_run_api_too` asks for
    run_api as well."""
    if getattr(request, "param", "live_server") == "live_server":
        yield Site(request.getfixturevalue("live_server").url, run_api=False)
        return
    request.getfixturevalue("transactional_db")
    workdir: Path = request.getfixturevalue("tmp_path")
    # The browser fixture allows ORM calls beside Playwright's loop in this process
    # only: the server checks as in production.
    with api_process(workdir, {"DJANGO_ALLOW_ASYNC_UNSAFE": ""}) as server:
        yield Site(server.base_url, run_api=True)


def _signed_in(browser: Any, site: Site, username: str, group: str) -> Any:
    """A new 1280x800 tab of a staff user in `group`, signed in on the dashboard."""
    user = make_staff(username, group)
    if site.run_api:
        # run_api checks the password with production's hashers, not the tests' fast one.
        hasher = PBKDF2PasswordHasher()
        user.password = hasher.encode(PASSWORD, hasher.salt())
        user.save(update_fields=["password"])
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(TIMEOUT_MS)
    tab = context.new_page()
    tab.goto(f"{site.url}/admin/dashboard/")
    # Not logged in: the admin's login form, then back to the dashboard.
    assert "/admin/login/" in tab.url
    tab.fill("#id_username", username)
    tab.fill("#id_password", PASSWORD)
    tab.click("input[type=submit]")
    tab.wait_for_url(f"{site.url}/admin/dashboard/")
    return tab


@pytest.fixture
def page(browser: Any, site: Site, fast_stream: None) -> Iterator[Any]:
    """A signed-in operator's page (TaskForge operators) at 1280x800."""
    tab = _signed_in(browser, site, "oncall", roles.OPERATORS)
    yield tab
    tab.context.close()


@pytest.fixture
def viewer_page(browser: Any, site: Site, fast_stream: None) -> Iterator[Any]:
    """A signed-in viewer's page (TaskForge viewers) at 1280x800."""
    tab = _signed_in(browser, site, "watcher", roles.VIEWERS)
    yield tab
    tab.context.close()


def _reload(tab: Any) -> None:
    """Reload the page.  An overview without a queue reloads itself once its stream shows
    one (dashboard.js): when that navigation cuts this one short, it is the reload."""
    from playwright.sync_api import Error

    try:
        tab.reload()
    except Error as exc:
        if "ERR_ABORTED" not in str(exc):
            raise
        tab.wait_for_load_state("load")


def _expect() -> Any:
    from playwright.sync_api import expect

    # As long as any other step may take (a run_api process sends a snapshot every 2 s).
    expect.set_options(timeout=TIMEOUT_MS)
    return expect


def _api(site: Site, method: str, path: str, body: Any, key: str) -> Any:
    request = urllib.request.Request(
        f"{site.url}{path}",
        data=json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_login__lands_on_the_queue_overview(page: Any) -> None:
    _expect()(page.locator("h1")).to_have_text("Queues")
    _expect()(page.locator("#summary")).to_contain_text("No queues yet")


@on_run_api_too
def test_overview__depth_changes_live_when_a_task_is_enqueued(page: Any, site: Any) -> None:
    QueueFactory(name="live-q")
    _, key = ApiKey.issue(name="browser-test", role="producer")
    snapshot.invalidate()  # the servers' cached overview, shared in Redis (run_api's too)
    _reload(page)
    # A due task of a running queue goes straight into the dispatch buffer,
    # so it shows under "claimed".
    pending = page.locator('tr[data-queue="live-q"] [data-field="claimed"]')
    _expect()(pending).to_have_text("0")
    _expect()(page.locator("#live")).to_have_attribute("data-state", "live")
    page.evaluate("window.__marker = 'no reload'")

    _api(site, "POST", "/queues/live-q/tasks", {"payload": {"n": 1}}, key)
    _api(site, "POST", "/queues/live-q/tasks", {"payload": {"n": 2}}, key)

    _expect()(pending).to_have_text("2")
    # The same page, updated in place: no reload happened.
    assert page.evaluate("window.__marker") == "no reload"


@on_run_api_too
def test_overview__with_no_queue_goes_live_and_shows_the_first_one(page: Any, site: Any) -> None:
    """The empty overview streams too: the first queue created appears by itself.

    It once opened no stream without a queue table, so it stayed "No queues yet" (and
    a page rendered from a cached empty snapshot never went live)."""
    _expect()(page.locator("#summary")).to_contain_text("No queues yet")
    _expect()(page.locator("#live")).to_have_attribute("data-state", "live")

    QueueFactory(name="first-q")
    snapshot.invalidate()

    _expect()(page.locator('tr[data-queue="first-q"]')).to_be_visible()
    _expect()(page.locator("#live")).to_have_attribute("data-state", "live")


def test_task_page__shows_a_failed_tasks_transitions(page: Any, site: Any) -> None:
    queue = QueueFactory(name="payments")
    TaskFactory(queue=queue, status="done")
    failed = TaskFactory(queue=queue, status="dead", worker_id="billing-7")

    page.click("text=Tasks")
    page.select_option("#id_queue", "payments")
    page.select_option("#id_status", "dead")
    page.click("text=Search")
    rows = page.locator("#task-list tbody tr")
    _expect()(rows).to_have_count(1)
    page.click(f"text={failed.pk}")

    _expect()(page.locator("#task-status")).to_have_text("dead")
    _expect()(page.locator("#last-error")).to_contain_text("boom")
    transitions = page.locator("#transitions tbody tr")
    _expect()(transitions).to_have_count(4)  # created, buffered, handed out, dead
    _expect()(transitions.last).to_contain_text("executing")
    _expect()(transitions.last).to_contain_text("dead")
    _expect()(transitions.last).to_contain_text("billing-7")
    _expect()(transitions.last).to_contain_text("boom")
    _expect()(page.locator("#payload")).to_contain_text('"n"')


@on_run_api_too
def test_dlq__bulk_replay_of_two_tasks_takes_them_out_of_the_dlq(page: Any, site: Any) -> None:
    queue = QueueFactory(name="payments")
    first, second, third = (TaskFactory(queue=queue, status="dead") for _ in range(3))

    page.click("text=Dead letters")
    _expect()(page.locator("#dlq-list tbody tr")).to_have_count(3)
    page.check(f'input[name="ids"][value="{first.pk}"]')
    page.check(f'input[name="ids"][value="{second.pk}"]')
    _expect()(page.locator("[data-selection-count]")).to_have_text("2 selected")
    page.click("#replay-selected")

    _expect()(page.locator(".msg-success")).to_contain_text("Replayed 2 tasks")
    _expect()(page.locator("#dlq-list tbody tr")).to_have_count(1)
    _expect()(page.locator(f'tr[data-task="{third.pk}"]')).to_be_visible()
    statuses = dict(Task.objects.values_list("pk", "status"))
    assert statuses[first.pk] == statuses[second.pk] == TaskStatus.PENDING
    assert statuses[third.pk] == TaskStatus.DEAD


def test_overview__pause_a_queue(page: Any) -> None:
    QueueFactory(name="webhooks")
    _reload(page)
    row = page.locator('tr[data-queue="webhooks"]')
    _expect()(row.locator(".badge-paused")).to_be_hidden()

    row.get_by_role("button", name="Pause").click()

    _expect()(page.locator(".msg-success")).to_contain_text("Paused queue webhooks")
    _expect()(row).to_have_class("health-warn is-paused")
    _expect()(row.locator(".badge-paused")).to_be_visible()
    _expect()(row.get_by_role("button", name="Resume")).to_be_visible()
    _expect()(row.get_by_role("button", name="Pause")).to_be_hidden()
    assert Queue.objects.get(name="webhooks").paused is True


def test_overview__purge_asks_for_the_queue_name_first(page: Any) -> None:
    queue = QueueFactory(name="thumbs")
    task = TaskFactory(queue=queue)
    _reload(page)
    page.locator('tr[data-queue="thumbs"]').get_by_role("link", name="Purge…").click()

    _expect()(page.locator("h1")).to_contain_text("Purge queue")
    page.fill("#confirm-name", "thumbs")
    page.get_by_role("button", name="Purge thumbs").click()

    _expect()(page.locator(".msg-success")).to_contain_text("1 tasks cancelled")
    task.refresh_from_db()
    assert task.status == TaskStatus.CANCELLED


def test_schedules__pause_and_resume_from_the_page(page: Any, site: Any) -> None:
    ScheduleFactory(queue=QueueFactory(name="reports"), name="nightly", cron="0 3 * * *")
    page.get_by_role("link", name="Schedules").click()
    row = page.locator('tr[data-schedule="reports/nightly"]')
    _expect()(row).to_contain_text("0 3 * * *")
    _expect()(row).to_contain_text("never")

    row.get_by_role("button", name="Pause").click()

    _expect()(page.locator(".msg-success")).to_contain_text("Paused schedule nightly")
    _expect()(row.locator(".pill")).to_have_text("Paused")
    if os.environ.get("TASKFORGE_SCREENSHOTS"):
        page.screenshot(path=str(SCREENSHOTS / "schedules.png"))
    row.get_by_role("button", name="Resume").click()
    _expect()(row.locator(".pill")).to_have_text("Running")


@on_run_api_too
def test_pages__break_no_content_security_policy_rule(page: Any, site: Any) -> None:
    """The pages carry a strict CSP (no inline script or style): nothing on them is refused.

    Issue 14: the issued-key page had an inline handler, and pages inline styles."""
    refused: list[str] = []
    page.on(
        "console",
        lambda message: (
            refused.append(f"{page.url}: {message.text}")
            if "Content Security Policy" in message.text
            else None
        ),
    )
    task = TaskFactory(queue=QueueFactory(name="csp-q"), status="dead")
    for path in [
        "/admin/dashboard/",
        "/admin/dashboard/tasks/",
        f"/admin/dashboard/tasks/{task.pk}",
        "/admin/dashboard/dlq/",
        "/admin/dashboard/workers/",
        "/admin/",
    ]:
        page.goto(f"{site.url}{path}")
        page.wait_for_load_state("load")
    page.goto(f"{site.url}/admin/dashboard/")
    _expect()(page.locator("#live")).to_have_attribute("data-state", "live")
    assert refused == []


def test_overview__phone_layout_shows_every_queue_as_a_card(browser: Any, page: Any) -> None:
    QueueFactory(name="emails")
    page.set_viewport_size({"width": 390, "height": 844})
    _reload(page)
    row = page.locator('tr[data-queue="emails"]')
    _expect()(row).to_be_visible()
    box = row.bounding_box()
    assert box is not None and box["width"] <= 390
    assert page.evaluate("document.documentElement.scrollWidth") <= 390


# Roles -----------------------------------------------------------------------------


def _post_form(tab: Any, site: Site, path: str) -> int:
    """POST a form to `path` as this browser would (its session, its CSRF token)."""
    token = next(c["value"] for c in tab.context.cookies() if c["name"] == "csrftoken")
    response = tab.request.post(
        f"{site.url}{path}",
        form={"csrfmiddlewaretoken": token, "confirm": "q", "all": "1"},
        headers={"Referer": f"{site.url}/admin/dashboard/"},
        max_redirects=0,
    )
    return int(response.status)


def test_viewer__sees_every_page_and_is_offered_no_action(viewer_page: Any, site: Any) -> None:
    queue = QueueFactory(name="q")
    pending = TaskFactory(queue=queue)
    dead = TaskFactory(queue=queue, status="dead")
    tab = viewer_page
    _reload(tab)

    row = tab.locator('tr[data-queue="q"]')
    _expect()(row).to_be_visible()
    _expect()(row.locator("form, a.btn")).to_have_count(0)  # no pause, resume or purge
    tab.click("text=Dead letters")
    _expect()(tab.locator("#dlq-list tbody tr")).to_have_count(1)
    _expect()(tab.locator('#dlq-form button, input[name="ids"]')).to_have_count(0)
    tab.goto(f"{site.url}/admin/dashboard/tasks/{pending.pk}")
    _expect()(tab.locator("#task-status")).to_have_text("pending")
    _expect()(tab.locator(".actions-bar button")).to_have_count(0)
    tab.click("text=Workers")
    _expect()(tab.locator("h1")).to_contain_text("Workers")
    tab.click("text=Audit log")
    _expect()(tab.locator("h1")).to_have_text("Audit log")

    # Posted anyway: 403, and nothing changes.
    for path in [
        "/admin/dashboard/queues/q/pause",
        "/admin/dashboard/queues/q/purge",
        f"/admin/dashboard/tasks/{pending.pk}/cancel",
        f"/admin/dashboard/dlq/{dead.pk}/replay",
        f"/admin/dashboard/dlq/{dead.pk}/discard",
        "/admin/dashboard/dlq/replay",
    ]:
        assert _post_form(tab, site, path) == 403, path
    assert Queue.objects.get(name="q").paused is False
    statuses = dict(Task.objects.values_list("pk", "status"))
    assert (statuses[pending.pk], statuses[dead.pk]) == (TaskStatus.PENDING, TaskStatus.DEAD)


def test_operator__acts_and_finds_the_actions_in_the_audit_log(page: Any, site: Any) -> None:
    queue = QueueFactory(name="q")
    pending = TaskFactory(queue=queue)
    _reload(page)

    page.locator('tr[data-queue="q"]').get_by_role("button", name="Pause").click()
    _expect()(page.locator(".msg-success")).to_contain_text("Paused queue q")
    page.goto(f"{site.url}/admin/dashboard/tasks/{pending.pk}")
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Cancel task").click()
    _expect()(page.locator(".msg-success")).to_contain_text("Task cancelled")

    page.click("text=Audit log")
    page.fill("#id_actor", "oncall")
    page.click("text=Filter")
    rows = page.locator("#audit-list tbody tr")
    _expect()(rows).to_have_count(2)
    _expect()(rows.first).to_contain_text("task.cancel")
    _expect()(rows.first).to_contain_text(str(pending.pk))
    _expect()(rows.last).to_contain_text("queue.pause")
    _expect()(rows.last).to_contain_text("oncall")


@pytest.mark.skipif(
    not os.environ.get("TASKFORGE_SCREENSHOTS"), reason="set TASKFORGE_SCREENSHOTS=1 to write them"
)
def test_screenshots(page: Any, site: Any, redis_client: Any) -> None:
    """Write docs/screenshots/*.png at 1280x800 from the demo world."""
    world = demo.build()
    User.objects.filter(username="oncall").update(is_superuser=True)  # for the admin shot
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    # The throughput charts draw the samples this browser kept; seed five
    # minutes of them (as a browser that had the page open would have).
    page.evaluate(
        """() => {
        const now = Date.now(), h = {};
        // [start, end] acks/s: each chart ends at the queue's real throughput.
        const shape = {emails: [0.55, 0.8], payments: [0.9, 0.05], thumbnails: [0.45, 0],
                       webhooks: [0.35, 0], reports: [0, 0]};
        for (const [name, [start, end]] of Object.entries(shape)) {
          h[name] = [];
          for (let i = 150; i > 0; i--) {
            const x = (150 - i) / 149;
            const ease = name === "webhooks" ? (x < 0.6 ? 0 : 1) : x * x;
            const wobble = i > 3 ? 0.08 * start * Math.sin(i / 5) : 0;
            h[name].push([now - i * 2000, Math.max(0, start + (end - start) * ease + wobble), 0]);
          }
        }
        sessionStorage.setItem('taskforge.throughput.v1', JSON.stringify(h));
      }"""
    )
    shots = {
        "overview.png": "/admin/dashboard/",
        "tasks.png": "/admin/dashboard/tasks/",
        "task.png": f"/admin/dashboard/tasks/{world['running'][0].pk}",
        "task-dead.png": f"/admin/dashboard/tasks/{world['dead'][0].pk}",
        "dlq.png": "/admin/dashboard/dlq/",
        "workers.png": "/admin/dashboard/workers/",
        "admin-tasks.png": "/admin/tasks/task/",
    }
    for name, path in shots.items():
        page.goto(f"{site.url}{path}")
        if name == "overview.png":
            _expect()(page.locator("#live")).to_have_attribute("data-state", "live")
        page.screenshot(path=str(SCREENSHOTS / name))
        if name == "task.png":  # the heartbeat history is below the fold
            page.screenshot(path=str(SCREENSHOTS / "task-full.png"), full_page=True)
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{site.url}/admin/dashboard/")
    _expect()(page.locator("#live")).to_have_attribute("data-state", "live")
    page.screenshot(path=str(SCREENSHOTS / "overview-phone.png"))
