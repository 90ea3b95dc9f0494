"""The /queues/:name/dlq endpoints of API.md."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from dlq import services
from dlq.models import DeadLetterTask
from queues.api.lookup import QueueLookupMixin
from taskforge.api.fields import (
    AnyJSONField,
    QuerySerializer,
    StrictBooleanField,
    StrictSerializer,
    TimeField,
)
from taskforge.api.pagination import KeysetPaginator
from taskforge.api.permissions import ADMIN
from taskforge.api.schema import BAD_QUERY, BODY_ERRORS, NOT_FOUND, errors, page_of
from taskforge.audit.log import of_request
from taskforge.lib.timeutil import isoformat
from tasks.api.serializers import TaskIdField, TaskSerializer, task_to_dict
from tasks.api.views import parse_task_id


class DeadLetterSerializer(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    queue = serializers.CharField()
    payload = AnyJSONField()
    last_error = serializers.CharField(allow_null=True)
    attempts = serializers.IntegerField()
    died_at = TimeField()
    replayed_at = TimeField(allow_null=True)
    replay_count = serializers.IntegerField()

    def to_representation(self, entry: DeadLetterTask) -> dict[str, Any]:
        return {
            "id": str(entry.task_id),
            "queue": entry.queue.name,
            "payload": entry.payload,
            "last_error": entry.last_error,
            "attempts": entry.attempts,
            "died_at": isoformat(entry.died_at),
            "replayed_at": isoformat(entry.replayed_at),
            "replay_count": entry.replay_count,
        }


class DlqQuerySerializer(QuerySerializer):
    died_after = TimeField(required=False)
    died_before = TimeField(required=False)


class BulkReplaySerializer(StrictSerializer):
    ids = serializers.ListField(child=TaskIdField(), max_length=10_000, required=False)
    all = StrictBooleanField(required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("ids" in attrs) == bool(attrs.get("all")):
            raise ValidationError('Give either "ids": [...] or "all": true.')
        return attrs


class DlqListView(QueueLookupMixin, APIView):
    roles = {"GET": ADMIN}

    @extend_schema(
        operation_id="dlq_list",
        parameters=[
            OpenApiParameter("died_after", str, description="ISO 8601 time, exclusive"),
            OpenApiParameter("died_before", str, description="ISO 8601 time, exclusive"),
            OpenApiParameter("limit", int, description="1..500, default 100"),
            OpenApiParameter("cursor", str),
        ],
        responses={
            200: page_of(DeadLetterSerializer, "DeadLetterPage"),
            **errors(NOT_FOUND, BAD_QUERY),
        },
        description="Tasks now dead in the queue, most recently dead first.",
        tags=["dlq"],
    )
    def get(self, request: Request, name: str) -> Response:
        queue = self.get_queue()
        query = DlqQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        entries = (
            DeadLetterTask.objects.dead_now()
            .filter(queue=queue)
            .died_between(
                query.validated_data.get("died_after"), query.validated_data.get("died_before")
            )
        )
        paginator = KeysetPaginator(request, ordering=["-died_at", "-task_id"])

        def render(page: list[DeadLetterTask]) -> Any:
            for entry in page:
                entry.queue = queue
            return DeadLetterSerializer(page, many=True).data

        return paginator.answer(entries, render)


class DlqReplayOneView(QueueLookupMixin, APIView):
    roles = {"POST": ADMIN}

    @extend_schema(
        operation_id="dlq_replay",
        request=None,
        responses={200: TaskSerializer, **errors(NOT_FOUND)},
        description="Back to `pending` with `attempts` 0.",
        tags=["dlq"],
    )
    def post(self, request: Request, name: str, task_id: str) -> Response:
        task = services.replay_one(
            self.get_queue(), str(parse_task_id(task_id)), actor=of_request(request)
        )
        return Response(task_to_dict(task))


class DlqBulkReplayView(QueueLookupMixin, APIView):
    roles = {"POST": ADMIN}

    @extend_schema(
        operation_id="dlq_replay_bulk",
        request=BulkReplaySerializer,
        responses={
            200: inline_serializer("ReplayResult", {"replayed": serializers.IntegerField()}),
            **errors(BODY_ERRORS, NOT_FOUND),
        },
        description='`{"ids": [...]}` or `{"all": true}`; ids not dead are skipped.',
        tags=["dlq"],
    )
    def post(self, request: Request, name: str) -> Response:
        queue = self.get_queue()
        body = BulkReplaySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        if body.validated_data.get("all"):
            replayed = services.replay_all(queue, actor=of_request(request))
        else:
            replayed = services.replay_many(
                queue, body.validated_data["ids"], actor=of_request(request)
            )
        return Response({"replayed": replayed})


class DlqEntryView(QueueLookupMixin, APIView):
    roles = {"DELETE": ADMIN}

    @extend_schema(
        operation_id="dlq_discard",
        responses={204: None, **errors(NOT_FOUND)},
        description="Delete the dead task for good (its GET answers 404 after).",
        tags=["dlq"],
    )
    def delete(self, request: Request, name: str, task_id: str) -> Response:
        services.discard(self.get_queue(), str(parse_task_id(task_id)), actor=of_request(request))
        return Response(status=status.HTTP_204_NO_CONTENT)
