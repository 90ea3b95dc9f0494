"""The /queues/:name/schedules endpoints of API.md (Schedules, v1.1)."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from queues.api.lookup import QueueLookupMixin
from queues.models import MAX_RETRIES_LIMIT, is_queue_name
from taskforge.api.fields import (
    AnyJSONField,
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
    StrictSerializer,
    TimeField,
)
from taskforge.api.pagination import KeysetPaginator
from taskforge.api.permissions import ADMIN
from taskforge.api.schema import BODY_ERRORS, error, errors, page_of
from taskforge.audit.log import of_request
from taskforge.lib import cron
from taskforge.lib.timeutil import isoformat
from tasks import schedules
from tasks.api.serializers import check_payload_size
from tasks.models import Schedule

NOT_FOUND = {404: error("No such queue or schedule (`not_found`).")}
PAGE_PARAMS = [
    OpenApiParameter("limit", int, description="1..500, default 100"),
    OpenApiParameter("cursor", str, description="From the previous page's `next`"),
]


def schedule_to_dict(schedule: Schedule, now: Any = None) -> dict[str, Any]:
    """The Schedule object of API.md; `next_run_at` is the next fire time, paused or not."""
    now = now or timezone.now()
    return {
        "id": str(schedule.id),
        "queue": schedule.queue.name,
        "name": schedule.name,
        "cron": schedule.cron,
        "timezone": schedule.timezone,
        "payload": schedule.payload,
        "priority": schedule.priority,
        "max_retries": schedule.max_retries,
        "paused": schedule.paused,
        "next_run_at": isoformat(schedule.upcoming_run_at(now)),
        "last_run_at": isoformat(schedule.last_run_at),
        "created_at": isoformat(schedule.created_at),
    }


class ScheduleSerializer(serializers.Serializer[Any]):
    """The Schedule object; `to_representation` is `schedule_to_dict`."""

    id = serializers.UUIDField()
    queue = serializers.CharField()
    name = serializers.CharField()
    cron = serializers.CharField()
    timezone = serializers.CharField()
    payload = AnyJSONField()
    priority = serializers.IntegerField(min_value=1, max_value=10)
    max_retries = serializers.IntegerField(allow_null=True)
    paused = serializers.BooleanField()
    next_run_at = TimeField()
    last_run_at = TimeField(allow_null=True)
    created_at = TimeField()

    def to_representation(self, instance: Schedule) -> dict[str, Any]:
        return schedule_to_dict(instance)


class SchedulePatchSerializer(StrictSerializer):
    cron = StrictCharField(
        max_length=200,
        trim_whitespace=False,
        required=False,
        help_text="Standard 5-field cron, or @hourly, @daily, @weekly, @monthly, @yearly.",
    )
    timezone = StrictCharField(
        max_length=64, trim_whitespace=False, required=False, help_text="IANA name; UTC default."
    )
    payload = AnyJSONField(required=False, help_text="Any JSON value but null.")
    priority = StrictIntegerField(min_value=1, max_value=10, required=False)
    max_retries = StrictIntegerField(
        min_value=0,
        max_value=MAX_RETRIES_LIMIT,
        allow_null=True,
        required=False,
        help_text="null: the queue's max_retries.",
    )
    paused = StrictBooleanField(required=False)

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict) and "name" in data and "name" not in self.fields:
            raise serializers.ValidationError(
                {"name": ["A schedule's name cannot change."]}, code="invalid"
            )
        return super().to_internal_value(data)

    def validate_cron(self, value: str) -> str:
        try:
            return cron.validate(value)
        except cron.CronError as exc:
            raise serializers.ValidationError(str(exc)) from exc

    def validate_timezone(self, value: str) -> str:
        try:
            cron.parse_timezone(value)
        except cron.CronError as exc:
            raise serializers.ValidationError(str(exc)) from exc
        return value

    def validate_payload(self, value: Any) -> Any:
        if value is None:
            raise serializers.ValidationError("The payload may be any JSON value but null.")
        check_payload_size(value)
        return value


class ScheduleCreateSerializer(SchedulePatchSerializer):
    # As sent, like a queue name: nothing is trimmed.
    name = StrictCharField(max_length=100, trim_whitespace=False)
    cron = StrictCharField(
        max_length=200,
        trim_whitespace=False,
        help_text="Standard 5-field cron, or @hourly, @daily, @weekly, @monthly, @yearly.",
    )
    payload = AnyJSONField(help_text="Any JSON value but null.")

    def validate_name(self, value: str) -> str:
        if not is_queue_name(value):
            raise serializers.ValidationError(
                "Use 1 to 100 of A-Z a-z 0-9 _ . - , starting with a letter or digit."
            )
        return value


class ScheduleListView(QueueLookupMixin, APIView):
    """A queue's cron schedules: each enqueues one task at every time its expression names."""

    roles = {"GET": ADMIN, "POST": ADMIN}

    @extend_schema(
        operation_id="schedules_list",
        parameters=PAGE_PARAMS,
        responses={
            200: page_of(ScheduleSerializer, "SchedulePage"),
            **errors(NOT_FOUND, {400: error("Bad query")}),
        },
        tags=["schedules"],
    )
    def get(self, request: Request, name: str) -> Response:
        queue = self.get_queue()
        paginator = KeysetPaginator(request, ordering=["name", "id"])
        now = timezone.now()

        def render(page: list[Schedule]) -> list[dict[str, Any]]:
            for schedule in page:
                schedule.queue = queue
            return [schedule_to_dict(s, now) for s in page]

        return paginator.answer(Schedule.objects.filter(queue=queue), render)

    @extend_schema(
        operation_id="schedules_create",
        request=ScheduleCreateSerializer,
        responses={
            201: ScheduleSerializer,
            **errors(
                BODY_ERRORS,
                NOT_FOUND,
                {
                    400: error(
                        "Invalid body (`invalid`, with `fields`: a cron expression or time "
                        "zone that does not parse, among others) or not JSON (`parse_error`)."
                    ),
                    409: error("`schedule_exists`"),
                },
            ),
        },
        tags=["schedules"],
    )
    def post(self, request: Request, name: str) -> Response:
        queue = self.get_queue()
        body = ScheduleCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        schedule = schedules.create_schedule(
            queue, **body.validated_data, actor=of_request(request)
        )
        return Response(schedule_to_dict(schedule), status=status.HTTP_201_CREATED)


class ScheduleDetailView(QueueLookupMixin, APIView):
    """One schedule, named in the path; a PATCH may change any field but `name`."""

    roles = {"GET": ADMIN, "PATCH": ADMIN, "DELETE": ADMIN}

    @extend_schema(
        operation_id="schedules_retrieve",
        responses={200: ScheduleSerializer, **errors(NOT_FOUND)},
        tags=["schedules"],
    )
    def get(self, request: Request, name: str, schedule: str) -> Response:
        found = schedules.get_schedule(self.get_queue(), schedule)
        return Response(schedule_to_dict(found))

    @extend_schema(
        operation_id="schedules_update",
        request=SchedulePatchSerializer,
        responses={
            200: ScheduleSerializer,
            **errors(
                BODY_ERRORS,
                NOT_FOUND,
                {
                    400: error(
                        "Invalid body (`invalid`, with `fields`; `name` cannot change) "
                        "or not JSON (`parse_error`)."
                    )
                },
            ),
        },
        tags=["schedules"],
    )
    def patch(self, request: Request, name: str, schedule: str) -> Response:
        queue = self.get_queue()
        schedules.get_schedule(queue, schedule)  # 404 before 400, as for queues
        body = SchedulePatchSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        changed = schedules.update_schedule(
            queue, schedule, **body.validated_data, actor=of_request(request)
        )
        return Response(schedule_to_dict(changed))

    @extend_schema(
        operation_id="schedules_destroy",
        responses={204: None, **errors(NOT_FOUND)},
        tags=["schedules"],
    )
    def delete(self, request: Request, name: str, schedule: str) -> Response:
        schedules.delete_schedule(self.get_queue(), schedule, actor=of_request(request))
        return Response(status=status.HTTP_204_NO_CONTENT)
