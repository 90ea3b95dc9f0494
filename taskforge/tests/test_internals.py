"""The leans of taskforge/lib/internals.py still hold on the installed dependencies.

A failure here means an upgrade changed a private or undocumented behaviour
that TaskForge relies on: fix (or drop) the lean in taskforge/lib/internals.py
and update its docstring, rather than this test.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import DataError, connection
from django.db.models import Model
from django.db.models.signals import post_init
from prometheus_client import Counter, Histogram, multiprocess, values

from queues.models import Queue
from taskforge.lib import internals, pg
from tasks.models import Task
from tasks.tests.factories import TaskFactory

FIX = "a dependency changed under taskforge/lib/internals.py: fix the lean there"


# --- prometheus_client ----------------------------------------------------------------


def test_prometheus_value_class_is_what_we_replace() -> None:
    assert hasattr(values, "ValueClass"), FIX
    assert hasattr(values, "MutexValue"), FIX
    assert callable(getattr(values, "MultiProcessValue", None)), FIX


def test_prometheus_count_in_files_names_them_by_our_identifier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(values, "ValueClass", values.ValueClass)  # restored after the test
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    internals.count_in_files(lambda: "somehost-4242")
    # Metrics made after the swap use the new class: they look it up on the
    # module when they make a value.
    value_class: Any = values.ValueClass
    try:
        counter = Counter("internals_probe", "Probe.", ["queue"], registry=None)
        counter.labels(queue="emails").inc(3)
        assert [path.name for path in tmp_path.iterdir()] == ["counter_somehost-4242.db"], FIX
        collected = {
            sample.name: sample.value
            for metric in multiprocess.MultiProcessCollector(None, path=str(tmp_path)).collect()
            for sample in metric.samples
        }
        assert collected == {"internals_probe_total": 3.0}, FIX
    finally:
        value_class.close_all_files()


def test_prometheus_count_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(values, "ValueClass", values.ValueClass)
    internals.count_in_memory()
    counter = Counter("internals_memory_probe", "Probe.", registry=None)
    counter.inc(2)
    assert counter._value.get() == 2.0, FIX


def _histogram_state(child: Any) -> tuple[list[float], float]:
    return [bucket.get() for bucket in child._buckets], child._sum.get()


AMOUNTS = [0.004, 0.005, 0.0051, 0.3, 0.3, 7.5, 1e9, 0.0, -1.0, float("nan"), 2.5]


@pytest.mark.parametrize("where", ["memory", "files"])
def test_prometheus_observe_and_observe_many_count_as_observe_does(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(values, "ValueClass", values.ValueClass)
    if where == "files":
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
        internals.count_in_files(lambda: f"probe-{where}")
    else:
        internals.count_in_memory()
    value_class: Any = values.ValueClass
    try:
        buckets = (0.005, 0.01, 0.5, 5.0)
        one_by_one = Histogram("internals_h1", "Probe.", ["q"], buckets=buckets, registry=None)
        at_once = Histogram("internals_h2", "Probe.", ["q"], buckets=buckets, registry=None)
        singly = Histogram("internals_h3", "Probe.", ["q"], buckets=buckets, registry=None)
        for amount in AMOUNTS:
            one_by_one.labels(q="a").observe(amount)
        internals.observe_many(at_once.labels(q="a"), AMOUNTS)
        internals.observe_many(at_once.labels(q="a"), [])
        for amount in AMOUNTS:
            internals.observe(singly.labels(q="a"), amount)
        expected_buckets, expected_sum = _histogram_state(one_by_one.labels(q="a"))
        got_buckets, got_sum = _histogram_state(at_once.labels(q="a"))
        assert got_buckets == expected_buckets, FIX
        assert _histogram_state(singly.labels(q="a"))[0] == expected_buckets, FIX
        assert got_sum != got_sum and expected_sum != expected_sum, FIX  # NaN in both sums
        finite = [a for a in AMOUNTS if a == a]
        internals.observe_many(at_once.labels(q="b"), finite)
        for amount in finite:
            one_by_one.labels(q="b").observe(amount)
        assert (
            _histogram_state(at_once.labels(q="b"))[0]
            == _histogram_state(one_by_one.labels(q="b"))[0]
        ), FIX
        assert _histogram_state(at_once.labels(q="b"))[1] == pytest.approx(
            _histogram_state(one_by_one.labels(q="b"))[1]
        ), FIX
    finally:
        if where == "files":
            value_class.close_all_files()


# --- psycopg ------------------------------------------------------------------------------


def test_psycopg_timestamptz_loader_is_the_c_one() -> None:
    assert psycopg.pq.__impl__ in ("binary", "c"), FIX
    assert internals.TIMESTAMPTZ_LOADER.__module__.startswith(("psycopg_binary", "psycopg_c")), FIX


@pytest.mark.django_db
def test_psycopg_c_loader_loads_timestamptz_as_django_does() -> None:
    text = "2026-11-30 05:09:23.075089+05:30"
    with connection.cursor() as cursor:
        cursor.execute("SHOW TimeZone")
        assert cursor.fetchone()[0] == "UTC", FIX
        cursor.execute("SELECT %s::timestamptz", [text])
        (by_django,) = cursor.fetchone()
    with connection.cursor() as cursor:
        assert isinstance(cursor.cursor, psycopg.Cursor), FIX
        internals.load_timestamptz_in_c(cursor)
        cursor.execute("SELECT %s::timestamptz", [text])
        (by_c,) = cursor.fetchone()
    expected = dt.datetime(2026, 11, 29, 23, 39, 23, 75089, tzinfo=dt.UTC)
    assert by_c == by_django == expected, FIX
    assert by_c.tzinfo is by_django.tzinfo is dt.UTC, FIX


@pytest.mark.django_db
def test_prepared_cursor_prepares_and_translates_errors() -> None:
    query = "SELECT %(n)s::int + 1 AS probe_prepared_cursor"
    for n in (1, 2):
        with internals.prepared_cursor(connection) as cursor:
            cursor.execute(query, {"n": n})
            assert cursor.fetchone()[0] == n + 1, FIX
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s",
            ["%probe_prepared_cursor%"],
        )
        assert cursor.fetchone()[0] == 1, FIX
    with pytest.raises(DataError), internals.prepared_cursor(connection) as cursor:
        cursor.execute("SELECT %(n)s::int / 0", {"n": 1})


# --- psycopg_pool ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_reset_set_on_a_made_pool_runs_on_connections_given_back() -> None:
    import threading

    from psycopg_pool import ConnectionPool

    reset_seen: list[Any] = []
    ran = threading.Event()

    def reset(conn: Any) -> None:
        reset_seen.append(conn)
        ran.set()

    pool: ConnectionPool[Any] = ConnectionPool(
        kwargs=pg.own_params(), min_size=1, max_size=1, open=True
    )
    try:
        with pool.connection(timeout=10):
            pass
        assert not reset_seen, FIX
        internals.reset_returned_connections(pool, reset)
        with pool.connection(timeout=10) as conn:
            pass
        assert ran.wait(10), FIX
        assert reset_seen == [conn], FIX
    finally:
        pool.close()


# --- Django --------------------------------------------------------------------------------


def fetch(query: str, params: list[Any]) -> tuple[list[str], list[tuple[Any, ...]]]:
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return [column.name for column in cursor.description], cursor.fetchall()


def state(instance: Model) -> dict[str, Any]:
    """What an instance holds, but for its ModelState (compared separately)."""
    held = {k: v for k, v in vars(instance).items() if k != "_state"}
    return held | {"_db": instance._state.db, "_adding": instance._state.adding}


@pytest.mark.django_db
@pytest.mark.usefixtures("redis_client")
@pytest.mark.parametrize(
    "columns",
    [
        "t.*, t.status_changed_at AS previous_changed_at",  # every field and an extra
        "t.id, t.status, t.payload, 42 AS rank",  # the others deferred
    ],
)
def test_instances_from_rows_builds_what_raw_builds(columns: str) -> None:
    TaskFactory(status="executing", payload={"to": "someone@example.com", "n": [1, 2]})
    TaskFactory(status="done")
    query = f"SELECT {columns} FROM tasks_task t ORDER BY t.id"
    by_raw = list(Task.objects.raw(query))
    built = internals.instances_from_rows(Task, *fetch(query, []))
    assert [state(task) for task in built] == [state(task) for task in by_raw], FIX
    assert [t.get_deferred_fields() for t in built] == [t.get_deferred_fields() for t in by_raw]
    assert isinstance(built[0].payload, dict), FIX  # the JSONField's converter ran


@pytest.mark.django_db
def test_instances_from_rows_is_generic_over_the_model() -> None:
    Queue.objects.create(name="emails", max_retries=2)
    query = "SELECT * FROM queues_queue"
    by_raw = list(Queue.objects.raw(query))
    built = internals.instances_from_rows(Queue, *fetch(query, []))
    assert [state(queue) for queue in built] == [state(queue) for queue in by_raw], FIX


def test_instances_from_rows_needs_the_primary_key() -> None:
    with pytest.raises(ValueError, match="primary key"):
        internals.instances_from_rows(Task, ["status"], [("pending",)])


@pytest.mark.django_db
@pytest.mark.usefixtures("redis_client")
def test_instances_from_rows_takes_from_db_while_init_signals_are_listened_to() -> None:
    """A receiver of pre_init or post_init sees every instance built, as with raw()."""
    TaskFactory()
    seen: list[Any] = []

    def receiver(sender: Any, instance: Any, **kwargs: Any) -> None:
        seen.append(instance)

    post_init.connect(receiver, sender=Task)
    try:
        built = internals.instances_from_rows(Task, *fetch("SELECT * FROM tasks_task", []))
    finally:
        post_init.disconnect(receiver, sender=Task)
    assert seen == built and len(built) == 1


# --- Django: a foreign key's object through its field's cache ------------------------------


@pytest.mark.django_db
def test_cache_related_sets_what_the_descriptor_reads(
    django_assert_num_queries: Any,
) -> None:
    task = TaskFactory()
    bare = Task.objects.only("id", "queue_id").get(pk=task.pk)
    queue = Queue.objects.get(pk=task.queue_id)
    internals.cache_related(Task._meta.get_field("queue"), bare, queue)
    with django_assert_num_queries(0):
        assert bare.queue is queue, FIX
    assert bare.queue_id == queue.pk, FIX


# --- opentelemetry-exporter-otlp-proto-http -------------------------------------------


def test_otlp_export_sends_what_taskforge_wrote_and_a_receiver_decodes_it() -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from taskforge.lib import otlp
    from tests.otlp import Receiver

    trace_id, span_id, parent_id = bytes(range(1, 17)), bytes(range(17, 25)), b"\x09" * 8
    head = otlp.Head.of("taskforge.ack", otlp.INTERNAL, {"messaging.system": "taskforge"})
    task_id = "01a2520a-54c7-71c7-8a49-c9b36091f82f"
    spans = [
        otlp.span(
            head,
            trace_id,
            span_id,
            parent_id,
            10**18,
            10**18 + 5,
            message_id=task_id,
            attempt=3,
            error="HTTP 500: é",
        ),
        otlp.span(head, trace_id, b"\x01" * 8, None, 7, 8, message_id="short", attempt=-1),
    ]
    data = otlp.request(
        otlp.resource_of({"service.name": "svc", "n": 2, "b": True}), otlp.scope_of("taskforge"),
        spans,
    )  # fmt: skip
    with Receiver() as receiver:
        exporter = OTLPSpanExporter(endpoint=f"{receiver.endpoint}/v1/traces")
        assert internals.otlp_export(exporter, data), FIX
        exporter.shutdown()  # type: ignore[no-untyped-call]
    first, second = receiver.spans
    assert (first.name, first.trace_id, first.span_id, first.parent_id) == (
        "taskforge.ack", trace_id.hex(), span_id.hex(), parent_id.hex()
    ), FIX  # fmt: skip
    assert (first.kind, first.status, first.service) == ("internal", "error", "svc"), FIX
    assert (first.start_ns, first.end_ns) == (10**18, 10**18 + 5), FIX
    assert first.attributes == {
        "messaging.system": "taskforge", "messaging.message.id": task_id, "taskforge.attempt": 3
    }, FIX  # fmt: skip
    assert second.parent_id is None and second.attributes["taskforge.attempt"] == -1, FIX
    assert second.attributes["messaging.message.id"] == "short", FIX
