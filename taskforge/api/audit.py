"""GET /audit (API.md v1.1): the audit log, newest first, for admin keys."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from taskforge.api.fields import QuerySerializer, TimeField
from taskforge.api.pagination import KeysetPaginator
from taskforge.api.permissions import ADMIN
from taskforge.api.schema import BAD_QUERY, errors, page_of
from taskforge.audit.models import Action, ActorKind, AuditEntry
from taskforge.lib.timeutil import isoformat


class AuditEntrySerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    at = TimeField()
    actor = inline_serializer(
        "AuditActor",
        {
            "kind": serializers.ChoiceField(choices=ActorKind.choices),
            "name": serializers.CharField(),
        },
    )
    action = serializers.ChoiceField(choices=Action.values)
    queue = serializers.CharField(allow_null=True)
    target = serializers.CharField(allow_null=True)
    details = serializers.DictField()

    def to_representation(self, entry: AuditEntry) -> dict[str, Any]:
        return entry_to_dict(entry)


def entry_to_dict(entry: AuditEntry) -> dict[str, Any]:
    return {
        "id": entry.pk,
        "at": isoformat(entry.at),
        "actor": {"kind": entry.actor_kind, "name": entry.actor_name},
        "action": entry.action,
        "queue": entry.queue,
        "target": entry.target,
        "details": entry.details,
    }


class AuditQuerySerializer(QuerySerializer):
    """Query parameters of GET /audit (all optional)."""

    action = serializers.ChoiceField(choices=Action.values, required=False)
    # Exact names, as sent.
    actor = serializers.CharField(max_length=200, trim_whitespace=False, required=False)
    queue = serializers.CharField(max_length=100, trim_whitespace=False, required=False)
    after = TimeField(required=False)
    before = TimeField(required=False)


class AuditListView(APIView):
    roles = {"GET": ADMIN}

    @extend_schema(
        operation_id="audit_list",
        parameters=[
            OpenApiParameter("action", str, enum=Action.values),
            OpenApiParameter("actor", str, description="The actor's name, exactly"),
            OpenApiParameter("queue", str, description="The queue's name (deleted queues too)"),
            OpenApiParameter("after", str, description="ISO 8601 time, exclusive"),
            OpenApiParameter("before", str, description="ISO 8601 time, exclusive"),
            OpenApiParameter("limit", int, description="1..500, default 100"),
            OpenApiParameter("cursor", str, description="From the previous page's `next`"),
        ],
        responses={200: page_of(AuditEntrySerializer, "AuditPage"), **errors(BAD_QUERY)},
        description="Operator actions, newest first; entries are never deleted.",
        tags=["audit"],
    )
    def get(self, request: Request) -> Response:
        query = AuditQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        filters: dict[str, Any] = {}
        for key, lookup in [
            ("action", "action"),
            ("actor", "actor_name"),
            ("queue", "queue"),
            ("after", "at__gt"),
            ("before", "at__lt"),
        ]:
            if key in query.validated_data:
                filters[lookup] = query.validated_data[key]
        paginator = KeysetPaginator(request, ordering=["-at", "-id"])
        return paginator.answer(
            AuditEntry.objects.filter(**filters), lambda page: map(entry_to_dict, page)
        )
