"""Lists are bounded in memory (API.md "Security (v1.2)").

A page holds at most `limit` items, and the item whose compact JSON takes the
page's items past 4 MiB is its last; `next` continues after it.  Every list
pages through `taskforge.api.pagination`, so every list is walked here with a
lowered bound.  Then the whole server: eight concurrent pages of 500 tasks
with 256 KiB payloads leave each `run_api` process, a second after the last
answer, within 256 MiB of what it held before.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from rest_framework.test import APIClient

from queues.models import Queue
from queues.tests.factories import QueueFactory
from taskforge.api import pagination
from taskforge.api.models import ApiKey
from taskforge.lib import jsonutil
from tasks import transitions
from tasks.models import TaskStatus
from tasks.tests.factories import ScheduleFactory, TaskFactory
from tests.service import API, Api, Service, database_url
from workers.models import Worker

MiB = 1024 * 1024


def size_of(item: Any) -> int:
    """An item's compact JSON, in bytes, as the page counts it."""
    return len(jsonutil.dumps(item))


def walk(client: APIClient, path: str) -> list[list[Any]]:
    """Every page of a list, `limit=500`, following `next` to the end (at most 100 pages)."""
    pages: list[list[Any]] = []
    url: str | None = f"{path}?limit=500"
    while url is not None:
        response = client.get(url)
        assert response.status_code == 200, response.content[:300]
        body = response.json()
        assert set(body) == {"results", "next"}
        pages.append(body["results"])
        url = body["next"]
        assert len(pages) < 100, "next never ends"
    return pages


def assert_bounded(pages: list[list[Any]], limit: int, bound: int) -> None:
    """Each page but the last ends with the item that took it past `bound` (or at `limit`)."""
    for number, page in enumerate(pages):
        sizes = [size_of(item) for item in page]
        assert page, f"page {number} is empty"
        assert len(page) <= limit
        assert sum(sizes[:-1]) <= bound, f"page {number} went on past {bound} bytes"
        if number < len(pages) - 1:
            assert len(page) == limit or sum(sizes) > bound, f"page {number} stopped early"


# -- the 4 MiB rule -----------------------------------------------------------------------


@pytest.mark.django_db
def test_task_list__page_ends_with_the_item_past_4_mib(producer_client: APIClient) -> None:
    """36 tasks of 256 KiB payloads: pages of 16 (the 16th takes it past 4 MiB), 16, 4."""
    queue = QueueFactory(name="big")
    for _ in range(36):
        TaskFactory(queue=queue, payload="x" * 262_000)

    pages = walk(producer_client, "/queues/big/tasks")

    assert [len(page) for page in pages] == [16, 16, 4]
    assert_bounded(pages, 500, 4 * MiB)
    ids = [task["id"] for page in pages for task in page]
    assert len(set(ids)) == 36  # nothing repeated, nothing skipped
    one_page = producer_client.get("/queues/big/tasks?limit=16").json()
    assert [t["id"] for t in one_page["results"]] == ids[:16]


# -- every list, through the one paginator --------------------------------------------------


def _queues() -> str:
    for n in range(12):
        QueueFactory(name=f"queue-{n:02}")
    return "/queues"


def _tasks() -> str:
    queue = QueueFactory(name="q")
    for n in range(12):
        TaskFactory(queue=queue, payload={"n": n, "pad": "p" * 50})
    return "/queues/q/tasks"


def _dlq() -> str:
    queue = QueueFactory(name="q")
    for _ in range(8):
        TaskFactory(queue=queue, status=TaskStatus.DEAD)
    return "/queues/q/dlq"


def _workers() -> str:
    for n in range(12):
        Worker.objects.create(worker_id=f"worker-{n:02}", last_seen_at=timezone.now())
    return "/workers"


def _schedules() -> str:
    queue = QueueFactory(name="q")
    for n in range(12):
        ScheduleFactory(queue=queue, name=f"nightly-{n:02}")
    return "/queues/q/schedules"


def _audit() -> str:
    _schedules()  # each creation is audited
    return "/audit"


def _events() -> str:
    task = TaskFactory(queue=QueueFactory(name="q"), status=TaskStatus.RETRY)
    return f"/queues/q/tasks/{task.pk}/events"  # created, claimed, executing, retry


LISTS: dict[str, Callable[[], str]] = {
    "queues": _queues,
    "tasks": _tasks,
    "dlq": _dlq,
    "workers": _workers,
    "schedules": _schedules,
    "audit": _audit,
    "events": _events,
}


@pytest.mark.django_db
@pytest.mark.parametrize("make", LISTS.values(), ids=LISTS.keys())
def test_every_list__stops_a_page_after_the_item_past_the_bound(
    make: Callable[[], str], admin_client: APIClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = make()
    whole = walk(admin_client, path)
    assert len(whole) == 1 and len(whole[0]) >= 4, whole
    bound = 2 * max(size_of(item) for item in whole[0]) - 1  # two items or fewer a page
    monkeypatch.setattr(pagination, "MAX_PAGE_BYTES", bound)

    pages = walk(admin_client, path)

    assert len(pages) >= 2
    assert_bounded(pages, 500, bound)
    # Nothing skipped or repeated, in the list's order.
    assert [item for page in pages for item in page] == whole[0]


@pytest.mark.django_db
def test_limit__still_cuts_a_page_of_small_items(admin_client: APIClient) -> None:
    _queues()
    pages = [admin_client.get("/queues?limit=5").json()]
    while pages[-1]["next"]:
        pages.append(admin_client.get(pages[-1]["next"]).json())
    assert [len(page["results"]) for page in pages] == [5, 5, 2]


# -- the whole server ---------------------------------------------------------------------

TASKS = 500
PAYLOAD_CHARS = 256 * 1024 - 2  # with its quotes, 256 KiB of JSON
CONCURRENT = 8
ALLOWED_GROWTH = 256 * MiB


@pytest.fixture
def server(tmp_path: Path, transactional_db: None, redis_client: redis.Redis) -> Iterator[Service]:
    svc = Service(
        tmp_path,
        {
            "DATABASE_URL": database_url(connection.settings_dict),
            "REDIS_URL": settings.REDIS_URL,
            "SECRET_KEY": "bounded-lists-secret-key",
        },
    )
    svc.spawn(API)
    try:
        svc.wait_ready([API])
        yield svc
    finally:
        svc.stop()


def api_processes(server: Service) -> list[psutil.Process]:
    """The processes that serve requests: run_api's workers (or run_api itself)."""
    popen = server.procs[API].popen
    assert popen is not None
    parent = psutil.Process(popen.pid)
    return parent.children(recursive=True) or [parent]


def resident(processes: list[psutil.Process]) -> dict[int, int]:
    return {process.pid: process.memory_info().rss for process in processes}


@pytest.mark.postgres
@pytest.mark.timeout(180)
def test_eight_pages_of_500_big_tasks__leave_each_process_within_256_mib(
    server: Service,
) -> None:
    """Regression: one `?limit=500` over 256 KiB payloads built ~131 MB; eight at once
    took the API processes to 3.9 GB, and 2.6 GB stayed after."""
    queue = Queue.objects.create(name="big")
    now = timezone.now()
    new = transitions.NewTask(
        queue=queue, payload=0, priority=5, scheduled_at=now + timedelta(days=1), max_retries=3
    )
    with transaction.atomic():
        transitions.create([new] * TASKS, now=now)
    with connection.cursor() as cursor:
        # Each payload a string of 256 KiB of JSON, made where it is stored (a faster
        # test than sending 131 MB from here; the API reads the same rows either way).
        cursor.execute(
            "UPDATE tasks_task SET payload = to_jsonb(left(repeat(md5(id::text), %s), %s))"
            " WHERE queue_id = %s",
            [PAYLOAD_CHARS // 32 + 1, PAYLOAD_CHARS, queue.pk],
        )
    key = ApiKey.issue(name="bounded-producer", role="producer")[1]
    api = Api(server.base_url, key)
    for _ in range(8):  # each process imports and caches what a list needs
        api.ok("GET", "/queues/big/tasks?limit=2")
    processes = api_processes(server)
    before = resident(processes)

    answers: list[tuple[int, int]] = []
    lock = threading.Lock()

    def list_tasks() -> None:
        status, body = api.call("GET", "/queues/big/tasks?limit=500", timeout=120)
        with lock:
            answers.append((status, len(body["results"]) if status == 200 else -1))

    threads = [threading.Thread(target=list_tasks) for _ in range(CONCURRENT)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=150)
    time.sleep(1.0)
    after = resident(processes)

    assert len(answers) == CONCURRENT and all(status == 200 for status, _ in answers), answers
    grown = {pid: (after[pid] - before[pid]) // MiB for pid in before}
    assert all(mib < ALLOWED_GROWTH // MiB for mib in grown.values()), (grown, answers)
