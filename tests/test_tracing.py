"""One trace from the producer through TaskForge to the worker (API.md "Tracing (v1.2)").

The service runs as users run it (tests/service.py: run_api, the loops and
run_pusher) with OTEL_EXPORTER_OTLP_ENDPOINT naming an OTLP/HTTP receiver of
the test (tests/otlp.py), which sees the spans of every process.  The test's own
process plays the producer and the worker with the SDK (`TaskForge`, its batcher,
`Worker`), its spans exported to the same receiver through the OpenTelemetry SDK.
Each test checks one tree: the producer's span, `taskforge.enqueue`, one
`taskforge.dispatch` per attempt, its outcome, and the worker's (or the push
target's) handler span.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from taskforge_client import Task, TaskForge, TaskSpec, Worker
from tests.otlp import Receiver, Span, names, tree
from tests.pushtarget import Answer, Request, Target
from tests.service import Api, Keys, Service, database_url

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(180),
]

SCHEDULE_DELAY_MS = "100"


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with Receiver() as running:
        yield running


@pytest.fixture(scope="module")
def tracer(receiver: Receiver) -> Iterator[trace.Tracer]:
    """The test process's tracer (the producer's and the worker's spans), exporting to
    the receiver; the SDK's `Worker` finds it as the global provider."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider(resource=Resource.create({"service.name": "test-app"}))
        trace.set_tracer_provider(provider)
    processor = _UntilShutdown(OTLPSpanExporter(endpoint=f"{receiver.endpoint}/v1/traces"))
    provider.add_span_processor(processor)
    try:
        yield provider.get_tracer("tests")
    finally:
        processor.shutdown()  # later spans of this process go nowhere, at no cost


class _UntilShutdown(SimpleSpanProcessor):
    """Exports until shut down, then nothing (the provider's own shutdown at exit too)."""

    on = True

    def on_end(self, span: Any) -> None:
        if self.on:
            super().on_end(span)

    def shutdown(self) -> None:
        if self.on:
            self.on = False
            super().shutdown()


@pytest.fixture(scope="module")
def service(
    tmp_path_factory: pytest.TempPathFactory, django_db_setup: None, receiver: Receiver
) -> Iterator[Service]:
    svc = Service(
        tmp_path_factory.mktemp("tracing-service"),
        {
            "DATABASE_URL": database_url(connection.settings_dict),
            "REDIS_URL": settings.REDIS_URL,
            "SECRET_KEY": "tracing-secret-key",
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": SCHEDULE_DELAY_MS,
            "TASKFORGE_PUSH_ALLOWED_NETWORKS": "127.0.0.0/8",
        },
        extra_loops=("pusher",),
    )
    try:
        svc.start()
        yield svc
    finally:
        svc.stop()


@pytest.fixture
def keys(service: Service) -> Keys:
    return Keys("tracing")


def _ids(span: trace.Span) -> tuple[str, str]:
    context = span.get_span_context()
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def _wait(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


def _one(spans: list[Span], name: str, **attributes: Any) -> Span:
    found = [
        span
        for span in spans
        if span.name == name and all(span.attributes.get(k) == v for k, v in attributes.items())
    ]
    assert len(found) == 1, (name, attributes, tree(spans))
    return found[0]


def _assert_one_tree(spans: list[Span]) -> None:
    """Every span's parent is in the trace, but for one root."""
    ids = {span.span_id for span in spans}
    roots = [span for span in spans if span.parent_id is None]
    assert len(roots) == 1, tree(spans)
    assert all(span.parent_id in ids for span in spans if span.parent_id is not None), tree(spans)


def _assert_taskforge_span(span: Span, queue: str, task_id: str, attempt: int | None) -> None:
    assert span.service == "taskforge"
    assert span.attributes["messaging.system"] == "taskforge"
    assert span.attributes["messaging.destination.name"] == queue
    assert span.attributes["messaging.message.id"] == task_id
    if attempt is not None:
        assert span.attributes["taskforge.attempt"] == attempt


def _has(wanted: set[str], task_id: str) -> Callable[[list[Span]], bool]:
    """A check for `Receiver.wait_for`: the task's spans include these names."""

    def check(spans: list[Span]) -> bool:
        got = {s.name for s in spans if s.attributes.get("messaging.message.id") == task_id}
        return wanted <= got

    return check


def _pull_chain(spans: list[Span], producer_id: str, queue: str, task_id: str) -> Span:
    """producer -> enqueue -> dispatch -> ack, and producer -> process; returns the ack."""
    enqueue = _one(spans, f"taskforge.enqueue {queue}", **{"messaging.message.id": task_id})
    dispatch = _one(spans, f"taskforge.dispatch {queue}", **{"messaging.message.id": task_id})
    ack = _one(spans, "taskforge.ack", **{"messaging.message.id": task_id})
    process = _one(spans, f"taskforge.process {queue}", **{"messaging.message.id": task_id})
    assert enqueue.parent_id == producer_id
    assert dispatch.parent_id == enqueue.span_id
    assert ack.parent_id == dispatch.span_id
    # The claim answer's traceparent is the enqueue's own (API.md): the producer's span.
    assert process.parent_id == producer_id
    assert process.service == "test-app" and process.kind == "consumer"
    _assert_taskforge_span(enqueue, queue, task_id, None)
    _assert_taskforge_span(dispatch, queue, task_id, 1)
    _assert_taskforge_span(ack, queue, task_id, 1)
    assert process.attributes["taskforge.attempt"] == 1
    return ack


def test_pull__one_tree_from_each_producer_span_to_its_handler_span(
    service: Service, keys: Keys, receiver: Receiver, tracer: trace.Tracer
) -> None:
    """`enqueue`, `enqueue_many` and the batcher each carry their caller's span; the
    Worker runs each handler in a span whose parent is the task's traceparent."""
    queue = "traced-pull"
    seen: dict[str, tuple[str | None, str]] = {}  # task id -> (traceparent, handler's trace)

    def handler(task: Task) -> Any:
        seen[task.id] = (task.traceparent, _ids(trace.get_current_span())[0])
        return {"ok": True}

    with TaskForge(service.base_url, keys.admin) as admin:
        admin.create_queue(queue)
    producers: dict[str, tuple[str, str]] = {}  # task id -> producer span ids
    with TaskForge(service.base_url, keys.producer) as producer:
        with tracer.start_as_current_span("producer.single") as span:
            single = producer.enqueue(queue, {"n": 1})
            producers[single.id] = _ids(span)
        with tracer.start_as_current_span("producer.many") as span:
            for task in producer.enqueue_many(queue, [{"payload": {"n": 2}}, TaskSpec({"n": 3})]):
                producers[task.id] = _ids(span)
        with producer.batcher() as batcher:
            # Two threads' enqueues may share one batch request: each keeps its own span.
            def enqueue_in_own_span(n: int) -> None:
                with tracer.start_as_current_span(f"producer.batched.{n}") as span:
                    task = batcher.enqueue(queue, {"n": n})
                    producers[task.id] = _ids(span)

            threads = [threading.Thread(target=enqueue_in_own_span, args=(n,)) for n in (4, 5)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    assert len(producers) == 5
    worker = Worker(service.base_url, keys.worker, queues=[queue], handler=handler)
    runner = threading.Thread(target=lambda: worker.run(install_signal_handlers=False))
    runner.start()
    try:
        _wait(lambda: len(seen) == 5 and worker.processed == 5, 30, "five tasks processed")
    finally:
        worker.stop()
        runner.join(timeout=10)
    for task_id, (trace_id, span_id) in producers.items():
        traceparent, handler_trace = seen[task_id]
        assert traceparent is not None and traceparent[:53] == f"00-{trace_id}-{span_id}-"
        assert int(traceparent[53:], 16) & 1  # sampled (the SDK may add level 2's random flag)
        assert handler_trace == trace_id  # the handler runs inside the task's trace
        spans = receiver.wait_for(
            trace_id, _has({"taskforge.ack", f"taskforge.process {queue}"}, task_id)
        )
        _pull_chain(spans, span_id, queue, task_id)
    # The single enqueue's trace holds only its own task: one tree.
    spans = receiver.trace(producers[single.id][0])
    assert names(spans) == sorted(
        [
            "producer.single",
            f"taskforge.enqueue {queue}",
            f"taskforge.dispatch {queue}",
            "taskforge.ack",
            f"taskforge.process {queue}",
        ]
    )
    _assert_one_tree(spans)
    print(tree(spans))


def test_push__one_tree_through_a_failed_and_a_delivered_attempt(
    service: Service, keys: Keys, receiver: Receiver, tracer: trace.Tracer
) -> None:
    """The push request's traceparent names that attempt's dispatch span; a 500 is a
    `taskforge.nack`, the next attempt's 200 a `taskforge.ack`; the target's own span
    (continuing the header's context) hangs under the dispatch span."""
    queue = "traced-push"
    propagator = TraceContextTextMapPropagator()

    def script(request: Request) -> Answer:
        context = propagator.extract({"traceparent": request.header("traceparent") or ""})
        attempt = int(request.header("TaskForge-Attempt") or 0)
        with tracer.start_as_current_span("target.handle", context=context):
            pass
        if attempt == 1:
            return Answer(500, b"not yet")
        return Answer(200, b'{"delivered": true}', {"Content-Type": "application/json"})

    with Target(script) as target:
        api = Api(service.base_url, keys.admin)
        api.ok("POST", "/queues", {"name": queue, "push": {"url": target.url("/hook")}})
        with TaskForge(service.base_url, keys.producer) as producer:
            with tracer.start_as_current_span("producer.push") as span:
                task = producer.enqueue(queue, {"to": "target"})
            trace_id, producer_id = _ids(span)
            _wait(lambda: producer.get_task(queue, task.id).status == "done", 30, "delivery")
        requests = list(target.requests)
    assert [r.header("TaskForge-Attempt") for r in requests] == ["1", "2"]
    spans = receiver.wait_for(
        trace_id, lambda spans: len([s for s in spans if s.name == "target.handle"]) == 2 and
        {"taskforge.nack", "taskforge.ack"} <= {s.name for s in spans},
    )  # fmt: skip
    enqueue = _one(spans, f"taskforge.enqueue {queue}")
    assert enqueue.parent_id == producer_id
    for attempt, request, outcome in [(1, requests[0], "nack"), (2, requests[1], "ack")]:
        dispatch = _one(spans, f"taskforge.dispatch {queue}", **{"taskforge.attempt": attempt})
        _assert_taskforge_span(dispatch, queue, task.id, attempt)
        assert dispatch.parent_id == enqueue.span_id
        assert dispatch.kind == "client"
        assert request.header("traceparent") == f"00-{trace_id}-{dispatch.span_id}-01"
        settled = _one(spans, f"taskforge.{outcome}", **{"taskforge.attempt": attempt})
        _assert_taskforge_span(settled, queue, task.id, attempt)
        assert settled.parent_id == dispatch.span_id
        handled = [
            s for s in spans if s.name == "target.handle" and s.parent_id == dispatch.span_id
        ]
        assert len(handled) == 1
    assert _one(spans, "taskforge.nack").status == "error"
    assert _one(spans, f"taskforge.dispatch {queue}", **{"taskforge.attempt": 1}).status == "error"
    _assert_one_tree(spans)
    print(tree(spans))


def test_lease_expired__its_span_hangs_under_the_dispatch(
    service: Service, keys: Keys, receiver: Receiver
) -> None:
    """A worker that claims and goes silent: the watchdog's `taskforge.lease_expired`."""
    queue = "traced-lease"
    Api(service.base_url, keys.admin).ok("POST", "/queues", {"name": queue})
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    traceparent = f"00-{trace_id}-{parent_id}-01"
    with TaskForge(service.base_url, keys.producer) as producer:
        task = producer.request(
            "POST", f"/queues/{queue}/tasks", {"payload": 1}, headers={"traceparent": traceparent}
        )
    worker = Api(service.base_url, keys.worker)
    [claimed] = _wait(
        lambda: worker.ok("POST", "/workers/claim", {"worker_id": "silent", "queues": [queue]})[
            "tasks"
        ],
        10,
        "the claim",
    )
    assert claimed["id"] == task["id"] and claimed["traceparent"] == traceparent
    assert claimed["tracestate"] is None
    spans = receiver.wait_for(trace_id, lambda s: "taskforge.lease_expired" in names(s))
    dispatch = _one(spans, f"taskforge.dispatch {queue}")
    expired = _one(spans, "taskforge.lease_expired")
    assert expired.parent_id == dispatch.span_id and expired.status == "error"
    _assert_taskforge_span(expired, queue, task["id"], 1)
    assert _one(spans, f"taskforge.enqueue {queue}").parent_id == parent_id


def test_cloud_tasks__a_created_task_keeps_its_requests_context(
    service: Service, keys: Keys, receiver: Receiver
) -> None:
    """CreateTask's traceparent is the task's (API-cloudtasks.md tasks are tasks); its HTTP
    target gets the dispatch span's, with the request's tracestate."""
    trace_id, parent_id = "5bf92f3577b34da6a3ce929d0e0e4736", "10f067aa0ba902b7"
    v2 = "/v2/projects/p/locations/l"
    with Target() as target, TaskForge(service.base_url, keys.admin) as admin:
        admin.request("POST", f"{v2}/queues", {"name": f"{v2[4:]}/queues/traced-ct"})
        admin.request(
            "POST",
            f"{v2}/queues/traced-ct/tasks",
            {"task": {"httpRequest": {"url": target.url("/ct"), "httpMethod": "POST"}}},
            headers={"traceparent": f"00-{trace_id}-{parent_id}-01", "tracestate": "ct=1"},
        )
        [request] = _wait(lambda: list(target.requests), 30, "the delivery")
    spans = receiver.wait_for(trace_id, lambda spans: "taskforge.ack" in names(spans))
    dispatch = _one(spans, "taskforge.dispatch traced-ct")
    assert request.header("traceparent") == f"00-{trace_id}-{dispatch.span_id}-01"
    assert request.header("tracestate") == "ct=1"
    assert _one(spans, "taskforge.enqueue traced-ct").parent_id == parent_id
    assert _one(spans, "taskforge.ack").parent_id == dispatch.span_id


VALID = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
# Each of these is ignored, with its tracestate: the enqueue answers as without it.
BAD_TRACEPARENTS = [
    "garbage",
    "",
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",  # no flags
    "00-00000000000000000000000000000000-b7ad6b7169203331-01",  # zero trace id
    "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",  # zero parent id
    "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  # version ff
    "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",  # uppercase
    VALID + "-extra",  # version 00 has exactly four fields
    "00-0af7651916cd43dd8448eb211c80319cz-b7ad6b7169203331-01",
    "\u00e9" * 55,
    "x" * 1000,
]
# A batch item's own fields may be any JSON: never a 400.
BAD_ITEM_VALUES: list[Any] = [*BAD_TRACEPARENTS[:3], 42, None, [VALID], {"traceparent": VALID}]


def _claim_all(worker: Api, queue: str, count: int) -> dict[str, dict[str, Any]]:
    got: dict[str, dict[str, Any]] = {}

    def more() -> bool:
        answer = worker.ok(
            "POST", "/workers/claim", {"worker_id": "w-bad", "queues": [queue], "max_tasks": 100}
        )
        got.update({task["id"]: task for task in answer["tasks"]})
        return len(got) >= count

    _wait(more, 15, f"{count} tasks claimed")
    return got


def _send(service: Service, key: str, path: str, body: Any, headers: dict[str, str]) -> Any:
    with TaskForge(service.base_url, key) as client:
        return client.request("POST", path, body, headers=headers)


def test_bad_traceparent__ignored_with_its_tracestate_never_an_error(
    service: Service, keys: Keys
) -> None:
    queue = "traced-bad"
    Api(service.base_url, keys.admin).ok("POST", "/queues", {"name": queue})
    path = f"/queues/{queue}/tasks"
    expected: dict[str, tuple[str | None, str | None]] = {}
    for value in BAD_TRACEPARENTS:
        headers = {"traceparent": value, "tracestate": "vendor=1"}
        task = _send(service, keys.producer, path, {"payload": 1}, headers)
        expected[task["id"]] = (None, None)
    items = [
        {"payload": n, "traceparent": v, "tracestate": "a=b"} for n, v in enumerate(BAD_ITEM_VALUES)
    ]
    items.append({"payload": "own", "traceparent": VALID, "tracestate": 7})  # tracestate dropped
    items.append({"payload": "header's"})  # the request's header applies
    answer = _send(
        service,
        keys.producer,
        f"{path}/batch",
        {"tasks": items},
        {"traceparent": VALID.replace("-01", "-00"), "tracestate": "k=v, l=w"},
    )
    results = answer["results"]
    assert len(results) == len(items)
    for result in results[: len(BAD_ITEM_VALUES)]:
        expected[result["id"]] = (None, None)
    expected[results[-2]["id"]] = (VALID, None)
    expected[results[-1]["id"]] = (VALID.replace("-01", "-00"), "k=v,l=w")
    # A bad tracestate alone is dropped alone.
    task = _send(
        service, keys.producer, path, {"payload": 2}, {"traceparent": VALID, "tracestate": "\t=="}
    )
    expected[task["id"]] = (VALID, None)
    claimed = _claim_all(Api(service.base_url, keys.worker), queue, len(expected))
    assert {
        task_id: (task["traceparent"], task["tracestate"]) for task_id, task in claimed.items()
    } == expected


def test_enqueue_span_without_a_traceparent__a_trace_of_its_own(
    service: Service, keys: Keys, receiver: Receiver
) -> None:
    """No context from the producer: TaskForge's spans still make one tree, rooted at
    the enqueue span; the claim answer's traceparent is null (API.md)."""
    queue = "traced-root"
    Api(service.base_url, keys.admin).ok("POST", "/queues", {"name": queue})
    token = otel_context.attach(otel_context.Context())  # no current span in this thread
    try:
        with TaskForge(service.base_url, keys.producer) as producer:
            task = producer.enqueue(queue, {"alone": True})
    finally:
        otel_context.detach(token)
    worker = Api(service.base_url, keys.worker)
    [claimed] = _claim_all(worker, queue, 1).values()
    assert claimed["traceparent"] is None
    worker.ok("POST", "/workers/ack", {"worker_id": "w-bad", "task_id": task.id})

    def chain() -> list[Span]:
        return [s for s in receiver.spans if s.attributes.get("messaging.message.id") == task.id]

    spans = _wait(lambda: len(chain()) == 3 and chain(), 20, "three spans")
    _assert_one_tree(spans)
    assert _one(spans, f"taskforge.enqueue {queue}").parent_id is None


def test_replay__the_second_life_has_dispatch_spans_of_its_own(
    service: Service, keys: Keys, receiver: Receiver
) -> None:
    """A replayed task counts its attempts from 1 again; its new attempt 1 is another
    dispatch span than its first life's, each outcome under its own."""
    queue = "traced-replay"
    admin = Api(service.base_url, keys.admin)
    admin.ok("POST", "/queues", {"name": queue})
    trace_id = "6bf92f3577b34da6a3ce929d0e0e4736"
    with TaskForge(service.base_url, keys.producer) as producer:
        task = producer.request(
            "POST",
            f"/queues/{queue}/tasks",
            {"payload": 1},
            headers={"traceparent": f"00-{trace_id}-20f067aa0ba902b7-01"},
        )
    worker = Api(service.base_url, keys.worker)
    done = {"worker_id": "w-bad", "task_id": task["id"]}
    _claim_all(worker, queue, 1)
    worker.ok("POST", "/workers/nack", {**done, "error": "boom", "retry": False})
    admin.ok("POST", f"/queues/{queue}/dlq/{task['id']}/replay")
    [again] = _claim_all(worker, queue, 1).values()
    assert again["attempts"] == 1
    worker.ok("POST", "/workers/ack", done)
    spans = receiver.wait_for(
        trace_id, lambda s: {"taskforge.ack", "taskforge.nack"} <= set(names(s))
    )
    dispatches = {s.span_id for s in spans if s.name == f"taskforge.dispatch {queue}"}
    assert len(dispatches) == 2
    outcomes = {_one(spans, "taskforge.nack").parent_id, _one(spans, "taskforge.ack").parent_id}
    assert outcomes == dispatches
    enqueue = _one(spans, f"taskforge.enqueue {queue}")
    assert enqueue.parent_id == "20f067aa0ba902b7"  # the producer's, which nobody exported here
    assert {s.parent_id for s in spans if s.name.startswith("taskforge.dispatch")} == {
        enqueue.span_id
    }
