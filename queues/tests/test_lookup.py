"""queues.lookup: the hot paths' per-process memory of queue rows."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from queues import lookup, services
from queues.models import Queue
from queues.tests.factories import QueueFactory
from taskforge.audit.log import CLI
from tasks import services as task_services

pytestmark = pytest.mark.django_db


def test_lookup__remembers_rows_by_name_and_id() -> None:
    queue = QueueFactory(name="q")
    assert lookup.by_name("q") == queue
    with CaptureQueriesContext(connection) as queries:
        assert lookup.by_name("q") == queue
        assert lookup.by_ids([queue.pk]) == {queue.pk: queue}
        assert lookup.by_names(["q", "nope"]) == {"q": queue}  # the unknown name costs one
    assert len(queries) == 1


def test_lookup__a_change_in_this_process_shows_at_once() -> None:
    queue = QueueFactory(name="q", rate_limit=None)
    assert _named("q").rate_limit is None
    services.update_queue(Queue.objects.get(pk=queue.pk), rate_limit=5, paused=True, actor=CLI)
    assert (_named("q").rate_limit, _named("q").paused) == (5, True)
    task_services.delete_queue(Queue.objects.get(pk=queue.pk), actor=CLI)
    assert lookup.by_name("q") is None
    assert lookup.by_ids([queue.pk]) == {}


def test_lookup__a_change_elsewhere_shows_within_the_ttl(monkeypatch) -> None:
    QueueFactory(name="q", max_retries=3)
    monkeypatch.setattr(lookup._by_name, "seconds", 0.0)  # every entry is already expired
    assert _named("q").max_retries == 3
    Queue.objects.filter(name="q").update(max_retries=7)  # no signal: as another process
    assert _named("q").max_retries == 7


def test_lookup__fresh_reads_anew() -> None:
    queue = QueueFactory(name="q")
    lookup.by_ids([queue.pk])
    Queue.objects.filter(pk=queue.pk).update(paused=True)
    assert lookup.by_ids([queue.pk])[queue.pk].paused is False  # remembered
    assert lookup.by_ids([queue.pk], fresh=True)[queue.pk].paused is True
    assert lookup.by_ids([queue.pk])[queue.pk].paused is True  # and remembered anew


def _named(name: str) -> Queue:
    queue = lookup.by_name(name)
    assert queue is not None
    return queue
