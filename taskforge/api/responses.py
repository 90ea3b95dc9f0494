"""The error body of API.md, built in one place."""

from __future__ import annotations

from typing import Any

from django.http import JsonResponse


def error_body(
    code: str, message: str, fields: dict[str, list[str]] | None = None
) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if fields:
        error["fields"] = fields
    return {"error": error}


def error_response(
    status: int, code: str, message: str, fields: dict[str, list[str]] | None = None
) -> JsonResponse:
    return JsonResponse(error_body(code, message, fields), status=status)
