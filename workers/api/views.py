"""The /workers endpoints of API.md: the worker protocol."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from taskforge.api.hot import Answer, HotView
from taskforge.api.middleware import SINGLE_TASK
from taskforge.api.models import ApiKey
from taskforge.api.pagination import KeysetPaginator
from taskforge.api.peer import disconnected
from taskforge.api.permissions import ADMIN, WORKER
from taskforge.api.schema import BAD_QUERY, BODY_ERRORS, NOT_FOUND, error, errors, page_of
from taskforge.lib.timeutil import isoformat
from tasks.api.serializers import task_to_dict
from tasks.models import Task, TaskStatus
from workers import protocol as leases
from workers.api.serializers import (
    ACK,
    ACK_BATCH,
    CLAIM,
    HEARTBEAT,
    HEARTBEAT_BATCH,
    NACK,
    AckBatchSerializer,
    AckSerializer,
    BatchResultSerializer,
    ClaimedTaskSerializer,
    ClaimResultSerializer,
    ClaimSerializer,
    HeartbeatBatchSerializer,
    HeartbeatResultSerializer,
    HeartbeatSerializer,
    NackSerializer,
    WorkerSerializer,
)
from workers.models import Worker, current_tasks
from workers.protocol import ClaimRequest, claim

LEASE_LOST = {409: error("`lease_lost`: the worker does not hold this task's lease")}


def claimed_task(task: Task) -> dict[str, Any]:
    """A task as a claim hands it out: with its lease's end and the enqueue's trace
    context (API.md "Tracing (v1.2)": null without a valid traceparent)."""
    body = task_to_dict(task)
    body["lease_expires_at"] = isoformat(task.lease_expires_at)
    body["traceparent"] = task.traceparent
    body["tracestate"] = task.tracestate
    return body


def _items(data: list[dict[str, Any]]) -> list[leases.Item]:
    return [leases.Item(**item) for item in data]


def _batch_result(outcome: leases.Outcome, *, lease: bool) -> dict[str, Any]:
    if outcome.error is not None:
        return {
            "task_id": outcome.task_id,
            "ok": False,
            "error": {"code": outcome.error.code, "message": outcome.error.message},
        }
    result: dict[str, Any] = {"task_id": outcome.task_id, "ok": True}
    if lease:
        assert outcome.heartbeat_at is not None
        result["status"] = TaskStatus.EXECUTING
        result["lease_expires_at"] = isoformat(leases.lease_expires_at(outcome.heartbeat_at))
    else:
        assert outcome.task is not None
        result["status"] = outcome.task.status
    return result


class ClaimView(HotView):
    roles = {"POST": WORKER}
    body = CLAIM

    @extend_schema(
        operation_id="workers_claim",
        request=ClaimSerializer,
        responses={200: ClaimResultSerializer, **errors(BODY_ERRORS, NOT_FOUND)},
        description=(
            "Hand out up to `max_tasks` tasks from the queues in the order given; with "
            "`wait_seconds` > 0 and nothing available, wait for work (long poll)."
        ),
        tags=["workers"],
    )
    def post(self, request: Request) -> Response:
        return self.serve_drf(request)

    @staticmethod
    def handle(request: HttpRequest, key: ApiKey, data: dict[str, Any], **context: Any) -> Answer:
        tasks = claim(ClaimRequest(**data, key_id=key.pk), gone=disconnected(request))
        return {"tasks": [claimed_task(task) for task in tasks]}, 200


class HeartbeatView(HotView):
    roles = {"POST": WORKER}
    body_limit = SINGLE_TASK
    body = HEARTBEAT

    @extend_schema(
        operation_id="workers_heartbeat",
        request=HeartbeatSerializer,
        responses={200: HeartbeatResultSerializer, **errors(BODY_ERRORS, LEASE_LOST)},
        tags=["workers"],
    )
    def post(self, request: Request) -> Response:
        return self.serve_drf(request)

    @staticmethod
    def handle(request: HttpRequest, key: ApiKey, data: dict[str, Any], **context: Any) -> Answer:
        worker_id = data.pop("worker_id")
        [outcome] = leases.heartbeat(worker_id, [leases.Item(**data)], key_id=key.pk)
        if outcome.error is not None:
            raise outcome.error
        assert outcome.heartbeat_at is not None
        return {
            "task_id": outcome.task_id,
            "status": TaskStatus.EXECUTING,
            "heartbeat_at": isoformat(outcome.heartbeat_at),
            "lease_expires_at": isoformat(leases.lease_expires_at(outcome.heartbeat_at)),
        }, 200


class AckView(HotView):
    roles = {"POST": WORKER}
    body_limit = SINGLE_TASK
    body = ACK

    @extend_schema(
        operation_id="workers_ack",
        request=AckSerializer,
        responses={200: ClaimedTaskSerializer, **errors(BODY_ERRORS, LEASE_LOST)},
        description="Mark the task done. Repeating a successful ack answers 200 again.",
        tags=["workers"],
    )
    def post(self, request: Request) -> Response:
        return self.serve_drf(request)

    @staticmethod
    def handle(request: HttpRequest, key: ApiKey, data: dict[str, Any], **context: Any) -> Answer:
        worker_id = data.pop("worker_id")
        [outcome] = leases.ack(worker_id, [leases.Item(**data)], key_id=key.pk)
        if outcome.error is not None:
            raise outcome.error
        assert outcome.task is not None
        return task_to_dict(outcome.task), 200


class NackView(HotView):
    roles = {"POST": WORKER}
    body_limit = SINGLE_TASK
    body = NACK

    @extend_schema(
        operation_id="workers_nack",
        request=NackSerializer,
        responses={200: ClaimedTaskSerializer, **errors(BODY_ERRORS, LEASE_LOST)},
        description=(
            "Fail the attempt: the task goes to `retry` (backoff, or `retry_after_seconds`), "
            'or `dead` when attempts are spent or `"retry": false`.'
        ),
        tags=["workers"],
    )
    def post(self, request: Request) -> Response:
        return self.serve_drf(request)

    @staticmethod
    def handle(request: HttpRequest, key: ApiKey, data: dict[str, Any], **context: Any) -> Answer:
        task = leases.nack(
            data["worker_id"],
            leases.Item(data["task_id"], data.get("attempt")),
            error=data["error"],
            retry=data["retry"],
            retry_after_seconds=data.get("retry_after_seconds"),
            key_id=key.pk,
        )
        return task_to_dict(task), 200


class HeartbeatBatchView(HotView):
    roles = {"POST": WORKER}
    body = HEARTBEAT_BATCH

    @extend_schema(
        operation_id="workers_heartbeat_batch",
        request=HeartbeatBatchSerializer,
        responses={200: BatchResultSerializer, **errors(BODY_ERRORS)},
        tags=["workers"],
    )
    def post(self, request: Request) -> Response:
        return self.serve_drf(request)

    @staticmethod
    def handle(request: HttpRequest, key: ApiKey, data: dict[str, Any], **context: Any) -> Answer:
        outcomes = leases.heartbeat(data["worker_id"], _items(data["items"]), key_id=key.pk)
        return {"results": [_batch_result(o, lease=True) for o in outcomes]}, 200


class AckBatchView(HotView):
    roles = {"POST": WORKER}
    body = ACK_BATCH

    @extend_schema(
        operation_id="workers_ack_batch",
        request=AckBatchSerializer,
        responses={200: BatchResultSerializer, **errors(BODY_ERRORS)},
        tags=["workers"],
    )
    def post(self, request: Request) -> Response:
        return self.serve_drf(request)

    @staticmethod
    def handle(request: HttpRequest, key: ApiKey, data: dict[str, Any], **context: Any) -> Answer:
        outcomes = leases.ack(data["worker_id"], _items(data["items"]), key_id=key.pk, brief=True)
        return {"results": [_batch_result(o, lease=False) for o in outcomes]}, 200


class WorkerListView(APIView):
    roles = {"GET": ADMIN}

    @extend_schema(
        operation_id="workers_list",
        responses={200: page_of(WorkerSerializer, "WorkerPage"), **errors(BAD_QUERY)},
        description="Workers seen in the last hour; `stale` when not seen within the "
        "heartbeat timeout.",
        tags=["workers"],
    )
    def get(self, request: Request) -> Response:
        now = timezone.now()
        paginator = KeysetPaginator(request, ordering=["worker_id"])

        def render(page: list[Worker]) -> list[dict[str, Any]]:
            current = current_tasks(worker.worker_id for worker in page)
            return [
                {
                    "worker_id": worker.worker_id,
                    "last_seen_at": isoformat(worker.last_seen_at),
                    "current_tasks": current.get(worker.worker_id, []),
                    "stale": worker.is_stale(now),
                }
                for worker in page
            ]

        return paginator.answer(Worker.objects.recent(now), render)
