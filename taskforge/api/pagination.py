"""Keyset (cursor) pagination: `{"results": [...], "next": url | null}`.

Pages are cut on the list's ordering columns, so a page costs one index range
scan however deep it is, and rows inserted meanwhile never shift a page.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import urlencode

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Model, Q, QuerySet
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from taskforge.lib.timeutil import parse_time

_M = TypeVar("_M", bound=Model)

DEFAULT_LIMIT = 100
MAX_LIMIT = 500


def parse_limit(request: Request) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return DEFAULT_LIMIT
    # ASCII digits only: str.isdigit() also passes superscripts (which int() refuses)
    # and other scripts' digits.
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_LIMIT:
        raise ValidationError({"limit": [f"Must be an integer from 1 to {MAX_LIMIT}."]})
    return int(raw)


class KeysetPaginator:
    """Paginate a queryset on `ordering`, e.g. `("-created_at", "-id")`.

    The last column must be unique (the primary key) so the cut is exact.
    """

    def __init__(self, request: Request, ordering: Sequence[str]) -> None:
        self.request = request
        self.ordering = list(ordering)
        self.limit = parse_limit(request)
        self.after = self._decode(request.query_params.get("cursor"))
        self.next_values: list[Any] | None = None

    def paginate(self, queryset: QuerySet[_M]) -> list[_M]:
        queryset = queryset.order_by(*self.ordering)
        if self.after is not None:
            try:
                queryset = queryset.filter(self._after_filter(self.after))
            except (DjangoValidationError, ValueError, TypeError) as exc:
                # A value of the wrong type for its column: building the lookup
                # raises one of these, depending on the field.
                raise ValidationError({"cursor": ["Not a cursor this list gave out."]}) from exc
        rows = list(queryset[: self.limit + 1])
        if len(rows) > self.limit:
            rows = rows[: self.limit]
            last = rows[-1]
            self.next_values = [getattr(last, name.lstrip("-")) for name in self.ordering]
        return rows

    def response(self, results: list[Any]) -> Response:
        return Response({"results": results, "next": self._next_url()})

    def _after_filter(self, values: list[Any]) -> Q:
        # (a, b, c) after (x, y, z): a > x OR (a = x AND b > y) OR ...
        condition = Q()
        equal = Q()
        for name, value in zip(self.ordering, values, strict=True):
            field = name.lstrip("-")
            op = "lt" if name.startswith("-") else "gt"
            condition |= equal & Q(**{f"{field}__{op}": value})
            equal &= Q(**{field: value})
        return condition

    def _next_url(self) -> str | None:
        if self.next_values is None:
            return None
        params = self.request.query_params.copy()
        params["cursor"] = self._encode(self.next_values)
        return (
            self.request.build_absolute_uri(self.request.path) + "?" + urlencode(params, doseq=True)
        )

    @staticmethod
    def _encode(values: list[Any]) -> str:
        plain = [
            {"t": v.isoformat()}
            if isinstance(v, datetime)
            else str(v)
            if isinstance(v, uuid.UUID)
            else v
            for v in values
        ]
        return base64.urlsafe_b64encode(json.dumps(plain).encode()).decode().rstrip("=")

    def _decode(self, cursor: str | None) -> list[Any] | None:
        if cursor is None:
            return None
        try:
            padded = cursor + "=" * (-len(cursor) % 4)
            plain = json.loads(base64.urlsafe_b64decode(padded.encode()))
            if not isinstance(plain, list) or len(plain) != len(self.ordering):
                raise ValueError("wrong shape")
            values = [parse_time(v["t"]) if isinstance(v, dict) else v for v in plain]
            if any(
                isinstance(v, bool)
                or not isinstance(v, str | int | datetime)
                or (isinstance(v, str) and "\x00" in v)  # Postgres text cannot hold NUL
                for v in values
            ):
                raise ValueError("wrong value")
            return values
        except (ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:
            raise ValidationError({"cursor": ["Not a cursor this list gave out."]}) from exc
