"""Pieces of the OpenAPI document shared by every view."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiResponse, inline_serializer
from rest_framework import serializers


class ErrorDetailSerializer(serializers.Serializer[Any]):
    code = serializers.CharField()
    message = serializers.CharField()
    # Declared fields leave the class body for _declared_fields, so this one does not
    # replace Serializer.fields; the stubs cannot know.
    fields = serializers.DictField(  # type: ignore[assignment]
        child=serializers.ListField(child=serializers.CharField()), required=False
    )


class ErrorSerializer(serializers.Serializer[Any]):
    error = ErrorDetailSerializer()


def error(description: str) -> OpenApiResponse:
    return OpenApiResponse(ErrorSerializer, description=description)


def page_of(
    serializer: type[serializers.Serializer[Any]], name: str
) -> serializers.Serializer[Any]:
    return inline_serializer(
        name=name,
        fields={
            "results": serializer(many=True),
            "next": serializers.URLField(allow_null=True),
        },
    )


# The errors any authenticated endpoint can answer.
COMMON_ERRORS = {
    401: error("Missing or unknown API key (`unauthenticated`)."),
    403: error("The key's role may not call this endpoint (`forbidden`)."),
    500: error("Unexpected error (`internal`)."),
    503: error("Postgres or Redis is unavailable (`unavailable`)."),
}
BODY_ERRORS = {
    400: error("Invalid body (`invalid`, with `fields`) or not JSON (`parse_error`)."),
    413: error("Body over TASKFORGE_MAX_REQUEST_BYTES (`payload_too_large`)."),
    415: error("Body is not application/json (`unsupported_media_type`)."),
}
NOT_FOUND = {404: error("No such queue or task (`not_found`).")}
BAD_QUERY = {400: error("A query parameter is empty, unparseable or out of range (`invalid`).")}


def errors(*groups: dict[int, OpenApiResponse]) -> dict[int, OpenApiResponse]:
    merged: dict[int, OpenApiResponse] = {}
    for group in (COMMON_ERRORS, *groups):
        merged.update(group)
    return merged


class ApiKeyScheme(OpenApiAuthenticationExtension):
    target_class = "taskforge.api.authentication.ApiKeyAuthentication"
    name = "apiKey"

    def get_security_definition(self, auto_schema: object) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "`Authorization: Bearer <key>`; keys come from "
            "`manage.py createapikey NAME --role producer|worker|admin`.",
        }
