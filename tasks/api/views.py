"""The /queues/:name/tasks and /stats endpoints of API.md."""

from __future__ import annotations

import uuid
from typing import Any

from django.http import HttpRequest
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from queues.api.lookup import QueueLookupMixin, queue_named
from queues.models import Queue
from taskforge import tracing
from taskforge.api.hot import Answer, HotView
from taskforge.api.middleware import SINGLE_TASK
from taskforge.api.models import ApiKey
from taskforge.api.pagination import KeysetPaginator
from taskforge.api.permissions import PRODUCER
from taskforge.api.schema import BAD_QUERY, BODY_ERRORS, NOT_FOUND, error, errors, page_of
from taskforge.audit.log import of_request
from taskforge.lib import pg
from tasks import events, services, stats
from tasks.api.serializers import (
    ENQUEUE,
    ENQUEUE_BATCH,
    EnqueueBatchSerializer,
    EnqueueSerializer,
    KeysQuerySerializer,
    TaskEventSerializer,
    TaskListQuerySerializer,
    TaskSerializer,
    enqueued_to_dict,
    task_to_dict,
    to_spec,
)
from tasks.models import Task
from tasks.stats import queue_stats

LIST_PARAMS = [
    OpenApiParameter("status", str, enum=[s.value for s in Task.Status]),
    OpenApiParameter("claimed_by", str),
    OpenApiParameter("created_after", str, description="ISO 8601 time, exclusive"),
    OpenApiParameter("created_before", str, description="ISO 8601 time, exclusive"),
    OpenApiParameter(
        "fairness_key", str, description="Tasks of this fairness key; empty: tasks without one"
    ),
    OpenApiParameter("limit", int, description="1..500, default 100"),
    OpenApiParameter("cursor", str, description="From the previous page's `next`"),
]
PAGE_PARAMS = LIST_PARAMS[-2:]
# W3C Trace Context of an enqueue (API.md "Tracing (v1.2)"): kept on each task created.
TRACE_HEADERS = [
    OpenApiParameter(
        "traceparent",
        str,
        OpenApiParameter.HEADER,
        description="W3C traceparent; a malformed one is ignored with its tracestate.",
    ),
    OpenApiParameter("tracestate", str, OpenApiParameter.HEADER, description="W3C tracestate."),
]


def parse_task_id(raw: str) -> uuid.UUID:
    """A task id from the URL; anything but a UUID names no task (404)."""
    try:
        return uuid.UUID(raw)
    except ValueError as exc:
        raise services.UnknownTask() from exc


class TaskLookupMixin(QueueLookupMixin):
    def get_task(self, queue: Queue) -> Task:
        return services.get_task(parse_task_id(self.kwargs["task_id"]), queue=queue)


# An enqueue endpoint: its handler gets the URL's queue (an unknown one is a 404). (No
# docstring: drf-spectacular would take it for the operations' description.)
class EnqueueView(QueueLookupMixin, HotView):
    @staticmethod
    def context(**kwargs: Any) -> dict[str, Any]:
        return {"queue": queue_named(kwargs["name"], fresh=False)}


class TaskListView(EnqueueView):
    roles = {"GET": PRODUCER, "POST": PRODUCER}
    body_limit = SINGLE_TASK  # the enqueue body
    body = ENQUEUE

    @extend_schema(
        operation_id="tasks_list",
        parameters=LIST_PARAMS,
        responses={
            200: page_of(TaskSerializer, "TaskPage"),
            **errors(NOT_FOUND, BAD_QUERY),
        },
        tags=["tasks"],
    )
    def get(self, request: Request, name: str) -> Response:
        queue = self.get_queue()
        query = TaskListQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        filters: dict[str, Any] = {"queue": queue}
        for key, lookup in [
            ("status", "status"),
            ("claimed_by", "claimed_by"),
            ("created_after", "created_at__gt"),
            ("created_before", "created_at__lt"),
        ]:
            if key in query.validated_data:
                filters[lookup] = query.validated_data[key]
        if "fairness_key" in query.validated_data:
            fairness_key = query.validated_data["fairness_key"]
            if fairness_key == "":
                filters["fairness_key__isnull"] = True
            else:
                filters["fairness_key"] = fairness_key
        paginator = KeysetPaginator(request, ordering=["-created_at", "-id"])

        def render(page: list[Task]) -> list[dict[str, Any]]:
            for task in page:
                task.queue = queue
            return [task_to_dict(task) for task in page]

        with pg.planned_without(pg.ORDERED_BY_INDEX if "status" in filters else ()):
            return paginator.answer(Task.objects.filter(**filters), render)

    @extend_schema(
        operation_id="tasks_enqueue",
        parameters=TRACE_HEADERS,
        request=EnqueueSerializer,
        responses={
            201: TaskSerializer,
            200: TaskSerializer,
            **errors(BODY_ERRORS, NOT_FOUND),
        },
        description=(
            "201 with the new task; 200 with the existing task when its `idempotency_key` "
            "was seen in this queue. 413 when the payload is over TASKFORGE_MAX_PAYLOAD_BYTES."
        ),
        tags=["tasks"],
    )
    def post(self, request: Request, name: str) -> Response:
        return self.serve_drf(request, name=name)

    @staticmethod
    def handle(request: HttpRequest, key: ApiKey, data: dict[str, Any], **context: Any) -> Answer:
        trace = tracing.from_headers(request.META)
        [result] = services.enqueue(context["queue"], [to_spec(data, trace)])
        return (
            enqueued_to_dict(result),
            status.HTTP_201_CREATED if result.created else status.HTTP_200_OK,
        )


class TaskBatchView(EnqueueView):
    roles = {"POST": PRODUCER}
    body = ENQUEUE_BATCH

    @extend_schema(
        operation_id="tasks_enqueue_batch",
        parameters=TRACE_HEADERS,
        request=EnqueueBatchSerializer,
        responses={
            201: inline_serializer("TaskBatchResult", {"results": TaskSerializer(many=True)}),
            200: inline_serializer("TaskBatchExisting", {"results": TaskSerializer(many=True)}),
            **errors(BODY_ERRORS, NOT_FOUND),
        },
        description=(
            "1..1000 tasks in one transaction: any invalid item is a 400 (with `fields` "
            "such as `tasks[3].priority`) and nothing is stored. 201 when any task was "
            "created, else 200."
        ),
        tags=["tasks"],
    )
    def post(self, request: Request, name: str) -> Response:
        return self.serve_drf(request, name=name)

    @staticmethod
    def handle(request: HttpRequest, key: ApiKey, data: dict[str, Any], **context: Any) -> Answer:
        trace = tracing.from_headers(request.META)
        results = services.enqueue(
            context["queue"], [to_spec(item, trace) for item in data["tasks"]]
        )
        created = any(result.created for result in results)
        return (
            {"results": [enqueued_to_dict(result) for result in results]},
            status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )


class TaskDetailView(TaskLookupMixin, APIView):
    roles = {"GET": PRODUCER, "DELETE": PRODUCER}

    @extend_schema(
        operation_id="tasks_retrieve",
        responses={200: TaskSerializer, **errors(NOT_FOUND)},
        tags=["tasks"],
    )
    def get(self, request: Request, name: str, task_id: str) -> Response:
        return Response(task_to_dict(self.get_task(self.get_queue())))

    @extend_schema(
        operation_id="tasks_cancel",
        responses={
            200: TaskSerializer,
            **errors(NOT_FOUND, {409: error("`invalid_state`: executing or finished")}),
        },
        description="Cancel a pending, claimed or retry task.",
        tags=["tasks"],
    )
    def delete(self, request: Request, name: str, task_id: str) -> Response:
        task = services.cancel(
            parse_task_id(task_id), queue=self.get_queue(), actor=of_request(request)
        )
        return Response(task_to_dict(task))


class TaskEventsView(TaskLookupMixin, APIView):
    roles = {"GET": PRODUCER}

    @extend_schema(
        operation_id="tasks_events",
        parameters=PAGE_PARAMS,
        responses={
            200: page_of(TaskEventSerializer, "TaskEventPage"),
            **errors(NOT_FOUND, BAD_QUERY),
        },
        tags=["tasks"],
    )
    def get(self, request: Request, name: str, task_id: str) -> Response:
        task = self.get_task(self.get_queue())
        # Cursors on the events' keys (tasks.events): a row, and which of its
        # events.  (A cursor given out before the keys had two values is refused.)
        paginator = KeysetPaginator(request, ordering=["row", "half"])
        page = events.page(task, paginator.ints_after(), paginator.limit)
        return paginator.answer_rows(
            page, lambda event: event.key, lambda rows: TaskEventSerializer(rows, many=True).data
        )


class QueueStatsSerializer(serializers.Serializer[Any]):
    queue = serializers.CharField()
    paused = serializers.BooleanField()
    depth = inline_serializer(
        "QueueDepth",
        {
            name: serializers.IntegerField()
            for name in ["pending", "scheduled", "claimed", "executing", "retry"]
        },
    )
    dlq_depth = serializers.IntegerField()
    throughput_per_second = serializers.FloatField()
    error_rate = serializers.FloatField()
    oldest_pending_age_seconds = serializers.FloatField(allow_null=True)
    keys = serializers.IntegerField(
        help_text="Fairness keys with live tasks, the anonymous key included."
    )


class QueueStatsView(QueueLookupMixin, APIView):
    roles = {"GET": PRODUCER}

    @extend_schema(
        operation_id="queues_stats",
        responses={200: QueueStatsSerializer, **errors(NOT_FOUND)},
        tags=["tasks"],
    )
    def get(self, request: Request, name: str) -> Response:
        return Response(queue_stats(self.get_queue()))


class QueueKeySerializer(serializers.Serializer[Any]):
    key = serializers.CharField(allow_null=True, help_text="null: the anonymous key")
    pending = serializers.IntegerField(help_text="Due pending and claimed tasks")
    executing = serializers.IntegerField()
    retry = serializers.IntegerField()
    oldest_pending_age_seconds = serializers.FloatField(allow_null=True)


class QueueKeysView(QueueLookupMixin, APIView):
    roles = {"GET": PRODUCER}

    @extend_schema(
        operation_id="queues_keys",
        parameters=[
            OpenApiParameter("min_pending", int, description="Keys with at least this pending"),
            *PAGE_PARAMS,
        ],
        responses={
            200: page_of(QueueKeySerializer, "QueueKeyPage"),
            **errors(NOT_FOUND, BAD_QUERY),
        },
        tags=["queues"],
    )
    def get(self, request: Request, name: str) -> Response:
        queue = self.get_queue()
        query = KeysQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        # A cursor is [0, ""] after the anonymous key, [1, key] after a named one.
        paginator = KeysetPaginator(request, ordering=["named", "key"])
        after = paginator.after
        if after is not None and not (after[0] in (0, 1) and isinstance(after[1], str)):
            raise ValidationError({"cursor": ["Not a cursor this list gave out."]})
        rows = stats.queue_keys(
            queue,
            after=(False, None) if after is None else (True, after[1] if after[0] else None),
            min_pending=query.validated_data.get("min_pending", 0),
            limit=paginator.limit + 1,
        )
        return paginator.answer_rows(
            rows,
            lambda row: [0, ""] if row.key is None else [1, row.key],
            lambda page: [row.as_dict() for row in page],
        )
