"""Keyset (cursor) pagination of the API's lists: `{"results": [...], "next": url | null}`.

The cursor and the page cut are `taskforge.lib.keyset`'s, shared with the dashboard.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import urlencode

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Model, QuerySet
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from taskforge.lib import keyset

_M = TypeVar("_M", bound=Model)
_T = TypeVar("_T")

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
    """Paginate a queryset on `ordering`, e.g. `("-created_at", "-id")` (`taskforge.lib.keyset`).

    The last column must be unique (the primary key) so the cut is exact.
    """

    def __init__(self, request: Request, ordering: Sequence[str]) -> None:
        self.request = request
        self.ordering = list(ordering)
        self.limit = parse_limit(request)
        cursor = request.query_params.get("cursor")
        try:
            self.after = None if cursor is None else keyset.decode(cursor, len(self.ordering))
        except keyset.BadCursor as exc:
            raise _bad_cursor() from exc
        self.next_cursor: str | None = None

    def paginate(self, queryset: QuerySet[_M]) -> list[_M]:
        """The page's rows."""
        queryset = queryset.order_by(*self.ordering)
        if self.after is not None:
            try:
                queryset = queryset.filter(keyset.after(self.ordering, self.after))
            except (DjangoValidationError, ValueError, TypeError) as exc:
                # A value of the wrong type for its column: building the lookup
                # raises one of these, depending on the field.
                raise _bad_cursor() from exc
        rows = list(queryset[: self.limit + 1])
        return self.cut(rows, lambda row: keyset.values_of(row, self.ordering))

    def ints_after(self) -> tuple[int, ...] | None:
        """The cursor's values, for a list keyed on integers (None on the first page).

        Raises:
            ValidationError: a value is not an integer.
        """
        if self.after is None:
            return None
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in self.after):
            raise _bad_cursor()
        return tuple(self.after)

    def cut(self, rows: list[_T], key: Callable[[_T], Sequence[Any]]) -> list[_T]:
        """The page of `rows`, the list's next `limit` + 1 (or fewer) items after
        the cursor; `key` gives an item's values on the ordering, for the next cursor."""
        if len(rows) > self.limit:
            rows = rows[: self.limit]
            self.next_cursor = keyset.encode(key(rows[-1]))
        return rows

    def response(self, results: Any) -> Response:
        """The page's answer; `results` is the rendered list (a `many=True`
        serializer's `.data` is one, though its stub says a dict)."""
        return Response({"results": results, "next": self._next_url()})

    def _next_url(self) -> str | None:
        if self.next_cursor is None:
            return None
        params = self.request.query_params.copy()
        params["cursor"] = self.next_cursor
        return (
            self.request.build_absolute_uri(self.request.path) + "?" + urlencode(params, doseq=True)
        )


def _bad_cursor() -> ValidationError:
    return ValidationError({"cursor": [keyset.BadCursor.__doc__]})
