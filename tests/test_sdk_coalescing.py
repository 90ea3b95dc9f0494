"""`TaskForge.enqueue` and `enqueue_many` coalescing by themselves (issue 34), against `run_api`.

Calls made while a request of the same client to the same queue is in flight wait and
go together as the next request (a batch enqueue); each still gets its own answer or
its own error.  To make "while a request is in flight" certain rather than a matter of
thread scheduling, `Held` keeps its first request from leaving until the given number
of calls wait behind it; every request then goes to the real server.  Requests are
counted in the server's request log.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from taskforge.api.models import ApiKey
from taskforge_client import (
    ConnectionFailed,
    Invalid,
    NotFound,
    PayloadTooLarge,
    Task,
    TaskForge,
    TaskSpec,
)
from taskforge_client.calls import Enqueues
from tests.service import API, Service, api_process, free_port

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, django_db_setup: None) -> Iterator[Service]:
    with api_process(tmp_path_factory.mktemp("coalescing"), {}) as svc:
        yield svc


@pytest.fixture
def queue(service: Service) -> str:
    name = f"co-{uuid.uuid4().hex[:10]}"
    with TaskForge(service.base_url, ApiKey.issue(name=f"admin-{name}", role="admin")[1]) as a:
        a.create_queue(name)
    return name


@pytest.fixture
def producer_key(service: Service) -> str:
    return ApiKey.issue(name=f"producer-{uuid.uuid4().hex[:8]}", role="producer")[1]


class Held(TaskForge):
    """A client whose first enqueue request waits until `behind` calls wait in its
    queue's lane; it records each request it makes as (tasks, through the batch endpoint)."""

    def __init__(self, url: str, key: str, *, behind: int, **kwargs: Any) -> None:
        super().__init__(url, key, **kwargs)
        self.behind = behind
        self.held = False
        self.sent: list[tuple[int, bool]] = []
        self._record = threading.Lock()

    def _enqueue_call(self, queue: str, call: Enqueues) -> Any:
        with self._record:
            first, self.held = not self.held, True
            self.sent.append((call.count, call.many))
        if first:
            assert self._lanes is not None
            lanes = self._lanes._lanes
            lane = lanes[queue]
            wait_for(lambda: len(lane.waiting) >= self.behind, 10, "calls waiting")
        return super()._enqueue_call(queue, call)


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.005)
    return value


def in_threads(*calls: Callable[[], Any], client: TaskForge | None = None) -> list[Any]:
    """Run each call in a thread of its own; each one's answer or error.

    With `client`, the threads start one by one, each once the previous call is in
    flight (the first) or waiting in its queue's lane (the others), so that they wait
    in the order given.
    """
    out: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            out[i] = calls[i]()
        except Exception as exc:
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for i, thread in enumerate(threads):
        thread.start()
        if client is not None:
            assert client._lanes is not None
            lanes = client._lanes._lanes

            def arrived(i: int = i, lanes: dict[str, Any] = lanes) -> bool:
                return sum(len(lane.waiting) + 1 for lane in lanes.values()) > i

            wait_for(arrived, 10, "the call in flight or waiting")
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive(), "a call did not return"
    return out


def requests_to(service: Service, queue: str) -> dict[str, int]:
    """The server's requests to the queue's enqueue endpoints, by endpoint (from its log)."""
    counts = {"single": 0, "batch": 0}
    for line in service.log_lines(API):
        if line.get("event") != "http.request":
            continue
        if line.get("path") == f"/queues/{queue}/tasks" and line.get("method") == "POST":
            counts["single"] += 1
        elif line.get("path") == f"/queues/{queue}/tasks/batch":
            counts["batch"] += 1
    return counts


def logged(service: Service, queue: str, total: int) -> dict[str, int]:
    """`requests_to`, once the log holds `total` of them (lines land a moment after the answer)."""
    wait_for(lambda: sum(requests_to(service, queue).values()) >= total, 10, "request log")
    return requests_to(service, queue)


# -- coalescing ------------------------------------------------------------------------------


def test_enqueue__calls_made_during_a_request_go_as_the_next_one(
    service: Service, queue: str, producer_key: str
) -> None:
    with Held(service.base_url, producer_key, behind=7) as client:
        answers = in_threads(
            *[lambda n=n: client.enqueue(queue, {"n": n}, priority=1 + n) for n in range(8)],
            client=client,
        )
    assert all(isinstance(task, Task) for task in answers), answers
    assert [(t.payload, t.priority, t.queue) for t in answers] == [
        ({"n": n}, 1 + n, queue) for n in range(8)
    ]
    assert len({task.id for task in answers}) == 8
    # The held lone call through the single endpoint, then the seven that waited in one batch.
    assert client.sent == [(1, False), (7, True)]
    assert logged(service, queue, 2) == {"single": 1, "batch": 1}


def test_enqueue__many_threads_fewer_requests_than_calls(
    service: Service, queue: str, producer_key: str
) -> None:
    got: dict[int, Task] = {}
    lock = threading.Lock()
    with Held(service.base_url, producer_key, behind=7) as client:

        def produce(thread: int) -> None:
            for n in range(25):
                task = client.enqueue(queue, {"n": thread * 100 + n})
                with lock:
                    got[thread * 100 + n] = task

        in_threads(*[lambda t=t: produce(t) for t in range(8)], client=client)
    assert len(got) == 200
    assert all(task.payload == {"n": n} and task.queue == queue for n, task in got.items())
    assert len({task.id for task in got.values()}) == 200
    counts = logged(service, queue, len(client.sent))
    assert sum(counts.values()) == len(client.sent) < 200
    assert counts["batch"] >= 1


def test_enqueue__order_kept_per_thread(service: Service, queue: str, producer_key: str) -> None:
    """Each call of a thread returns before its next is made, so it is in an earlier
    request: its task was created before the next one."""
    with Held(service.base_url, producer_key, behind=3) as client:
        answers = in_threads(
            *[
                lambda t=t: [client.enqueue(queue, {"t": t, "n": n}) for n in range(20)]
                for t in range(4)
            ],
            client=client,
        )
    for t, tasks in enumerate(answers):
        assert [task.payload for task in tasks] == [{"t": t, "n": n} for n in range(20)]
        created = [task.created_at for task in tasks if task.created_at is not None]
        assert len(created) == 20
        assert all(a < b for a, b in itertools.pairwise(created))
    assert any(many for _, many in client.sent)


def test_enqueue__a_refused_item_fails_only_its_own_call(
    service: Service, queue: str, producer_key: str
) -> None:
    with Held(service.base_url, producer_key, behind=4) as client:
        first, good, bad, many_bad, other = in_threads(
            lambda: client.enqueue(queue, {"label": "first"}),
            lambda: client.enqueue(queue, {"label": "good"}),
            lambda: client.enqueue(queue, {"label": "bad"}, priority=11),
            lambda: client.enqueue_many(
                queue, [TaskSpec({"label": "many-0"}), TaskSpec({"label": "many-1"}, priority=0)]
            ),
            lambda: client.enqueue(queue, {"label": "other"}, priority=2),
            client=client,
        )
        stored = {t.payload["label"] for t in client.list_tasks(queue)}
    assert isinstance(bad, Invalid) and set(bad.fields) == {"priority"}, bad
    # An enqueue_many stays all or nothing, its fields in its own numbering.
    assert isinstance(many_bad, Invalid) and set(many_bad.fields) == {"tasks[1].priority"}
    assert (first.payload, good.payload, other.priority) == (
        {"label": "first"},
        {"label": "good"},
        2,
    )
    assert stored == {"first", "good", "other"}
    # The refused batch of four, then the two good ones again.
    assert client.sent == [(1, False), (5, True), (2, True)]


def test_enqueue__an_oversized_payload_fails_only_its_own_call(
    service: Service, queue: str, producer_key: str
) -> None:
    """A 413 names no item: each call of that batch goes again on its own, and gets
    what it would have had alone."""
    big = {"blob": "x" * 300_000}  # over TASKFORGE_MAX_PAYLOAD_BYTES (262144)
    with Held(service.base_url, producer_key, behind=3) as client:
        first, good, oversized, bad = in_threads(
            lambda: client.enqueue(queue, {"label": "first"}),
            lambda: client.enqueue(queue, {"label": "good"}),
            lambda: client.enqueue(queue, big),
            lambda: client.enqueue(queue, {"label": "bad"}, priority=11),
            client=client,
        )
        stored = {t.payload.get("label") for t in client.list_tasks(queue)}
    assert isinstance(oversized, PayloadTooLarge) and oversized.status == 413, oversized
    assert isinstance(bad, Invalid) and set(bad.fields) == {"priority"}, bad
    assert (first.payload, good.payload) == ({"label": "first"}, {"label": "good"})
    assert stored == {"first", "good"}
    assert client.sent[:2] == [(1, False), (3, True)]
    assert sorted(client.sent[2:]) == [(1, False)] * 3


def test_enqueue__a_whole_request_failure_fails_every_call_in_it(
    service: Service, producer_key: str
) -> None:
    missing = f"co-missing-{uuid.uuid4().hex[:8]}"
    with Held(service.base_url, producer_key, behind=3) as client:
        answers = in_threads(
            *[lambda n=n: client.enqueue(missing, {"n": n}) for n in range(4)], client=client
        )
    assert all(isinstance(a, NotFound) and a.code == "not_found" for a in answers), answers
    assert client.sent == [(1, False), (3, True)]


def test_enqueue__no_answer_repeats_only_the_keyed_calls_on_their_own() -> None:
    """A batch with a call without a key is sent once; when no answer comes, the keyed
    calls in it are made again on their own (alone they would have been retried), the
    others fail as they would have alone."""
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with Held(url, "key", behind=2, retries=1, backoff_base=0.01) as client:
        lone, keyed, unkeyed = in_threads(
            lambda: client.enqueue("q", {"n": 0}),
            lambda: client.enqueue("q", {"n": 1}, idempotency_key="k"),
            lambda: client.enqueue("q", {"n": 2}),
            client=client,
        )
    assert all(isinstance(a, ConnectionFailed) for a in (lone, keyed, unkeyed))
    assert client.sent == [(1, False), (2, True), (1, False)]
    # The lone call and the batch once each; the keyed call alone, retried once.
    assert client.requests_sent == 1 + 1 + 2


def test_enqueue__idempotency_keys_kept_per_item(
    service: Service, queue: str, producer_key: str
) -> None:
    with Held(service.base_url, producer_key, behind=4) as client:
        first, again, k1, k1_again, unkeyed = in_threads(
            lambda: client.enqueue(queue, {"n": 0}, idempotency_key="k0"),
            lambda: client.enqueue(queue, {"n": 1}, idempotency_key="k0"),
            lambda: client.enqueue(queue, {"n": 2}, idempotency_key="k1"),
            lambda: client.enqueue(queue, {"n": 3}, idempotency_key="k1"),
            lambda: client.enqueue(queue, {"n": 4}),
            client=client,
        )
        later = client.enqueue(queue, {"n": 5}, idempotency_key="k1")
        stored = client.list_tasks(queue)
    assert client.sent[:2] == [(1, False), (4, True)]
    assert again.id == first.id and again.payload == {"n": 0}  # the key seen before the batch
    assert k1_again.id == k1.id and k1.payload == {"n": 2}  # the key seen earlier in the batch
    assert later.id == k1.id
    assert (k1.idempotency_key, unkeyed.idempotency_key) == ("k1", None)
    assert len({first.id, k1.id, unkeyed.id}) == 3
    assert len(stored) == 3


# -- no linger, and off ------------------------------------------------------------------------


def test_enqueue__a_lone_call_goes_at_once_through_the_single_endpoint(
    service: Service, queue: str, producer_key: str
) -> None:
    with TaskForge(service.base_url, producer_key) as client:
        tasks = [client.enqueue(queue, {"n": n}) for n in range(5)]
        many = client.enqueue_many(queue, [TaskSpec({"n": 5}), TaskSpec({"n": 6})])
    assert [t.payload["n"] for t in [*tasks, *many]] == list(range(7))
    assert logged(service, queue, 6) == {"single": 5, "batch": 1}


def test_enqueue__coalesce_false_sends_every_call_on_its_own(
    service: Service, queue: str, producer_key: str
) -> None:
    """With coalescing off, eight calls in flight at once are eight requests."""
    together = threading.Barrier(8, timeout=10)

    class AllInFlight(TaskForge):
        def _enqueue_call(self, queue: str, call: Enqueues) -> Any:
            together.wait()  # all eight are making their request at once
            return super()._enqueue_call(queue, call)

    with AllInFlight(service.base_url, producer_key, coalesce=False) as client:
        answers = in_threads(*[lambda n=n: client.enqueue(queue, {"n": n}) for n in range(8)])
    assert [t.payload for t in answers] == [{"n": n} for n in range(8)]
    assert logged(service, queue, 8) == {"single": 8, "batch": 0}
