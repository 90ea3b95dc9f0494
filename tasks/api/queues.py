"""The /queues endpoints of API.md (a queue's tasks, stats and DLQ have their own views)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from queues import services as queue_services
from queues.api.lookup import QueueLookupMixin
from queues.api.serializers import QueueCreateSerializer, QueuePatchSerializer, QueueSerializer
from queues.models import Queue
from taskforge.api.models import Role
from taskforge.api.pagination import KeysetPaginator
from taskforge.api.permissions import ADMIN, ANY_ROLE
from taskforge.api.schema import BODY_ERRORS, NOT_FOUND, error, errors, page_of
from taskforge.audit.log import of_request
from tasks import services


def shown(request: Request, queues: Queue | Sequence[Queue]) -> Any:
    """The queue(s) as the caller may see them: push secrets for admin keys only."""
    reveal = getattr(request.user, "role", None) == Role.ADMIN
    context = {"reveal_push": reveal}
    if isinstance(queues, Queue):
        return QueueSerializer(queues, context=context).data
    return QueueSerializer(queues, many=True, context=context).data


class QueueListView(APIView):
    roles = {"GET": ANY_ROLE, "POST": ADMIN}

    @extend_schema(
        operation_id="queues_list",
        responses={200: page_of(QueueSerializer, "QueuePage"), **errors({400: error("Bad query")})},
        tags=["queues"],
    )
    def get(self, request: Request) -> Response:
        paginator = KeysetPaginator(request, ordering=["name", "id"])
        return paginator.answer(Queue.objects.all(), lambda page: shown(request, page))

    @extend_schema(
        operation_id="queues_create",
        request=QueueCreateSerializer,
        responses={
            201: QueueSerializer,
            **errors(BODY_ERRORS, {409: error("`queue_exists`")}),
        },
        tags=["queues"],
    )
    def post(self, request: Request) -> Response:
        body = QueueCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        queue = queue_services.create_queue(**body.validated_data, actor=of_request(request))
        return Response(shown(request, queue), status=status.HTTP_201_CREATED)


class QueueDetailView(QueueLookupMixin, APIView):
    roles = {"GET": ANY_ROLE, "PATCH": ADMIN, "DELETE": ADMIN}

    @extend_schema(
        operation_id="queues_retrieve",
        responses={200: QueueSerializer, **errors(NOT_FOUND)},
        tags=["queues"],
    )
    def get(self, request: Request, name: str) -> Response:
        return Response(shown(request, self.get_queue()))

    @extend_schema(
        operation_id="queues_update",
        request=QueuePatchSerializer,
        responses={200: QueueSerializer, **errors(BODY_ERRORS, NOT_FOUND)},
        tags=["queues"],
    )
    def patch(self, request: Request, name: str) -> Response:
        queue = self.get_queue()
        body = QueuePatchSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        queue_services.update_queue(queue, **body.validated_data, actor=of_request(request))
        return Response(shown(request, queue))

    @extend_schema(
        operation_id="queues_destroy",
        responses={
            204: None,
            **errors(NOT_FOUND, {409: error("`queue_not_empty`: live or dead tasks remain")}),
        },
        tags=["queues"],
    )
    def delete(self, request: Request, name: str) -> Response:
        services.delete_queue(self.get_queue(), actor=of_request(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


class QueuePauseView(QueueLookupMixin, APIView):
    roles = {"POST": ADMIN}
    paused = True

    @extend_schema(
        request=None,
        responses={200: QueueSerializer, **errors(NOT_FOUND)},
        tags=["queues"],
    )
    def post(self, request: Request, name: str) -> Response:
        queue = queue_services.set_paused(
            self.get_queue(), paused=self.paused, actor=of_request(request)
        )
        return Response(shown(request, queue))


class QueueResumeView(QueuePauseView):
    paused = False


class QueuePurgeView(QueueLookupMixin, APIView):
    roles = {"POST": ADMIN}

    @extend_schema(
        request=None,
        responses={
            200: inline_serializer("PurgeResult", {"cancelled": serializers.IntegerField()}),
            **errors(NOT_FOUND),
        },
        tags=["queues"],
    )
    def post(self, request: Request, name: str) -> Response:
        cancelled = services.purge_queue(self.get_queue(), actor=of_request(request))
        return Response({"cancelled": cancelled})
