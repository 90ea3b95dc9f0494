"""Keyset (cursor) pagination of the API's lists: `{"results": [...], "next": url | null}`.

The cursor and the page cut are `taskforge.lib.keyset`'s, shared with the dashboard.

A page is bounded in memory (API.md "Security (v1.2)"): it holds at most
`limit` items, and the item whose compact JSON takes the page's items past
`MAX_PAGE_BYTES` is its last (`next` continues after it).  Rows are read in
chunks on the list's own ordering, each chunk sized from what the page has
room left for, and each item is encoded as soon as its chunk is rendered, so
a list of 500 tasks with 256 KiB payloads never holds more than a chunk of
rows and the page's bytes (about 4 MiB), never the 131 MB the whole list
would take, twice over.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar
from urllib.parse import urlencode

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Model, QuerySet
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from taskforge.api.renderers import Rendered, render_json
from taskforge.lib import keyset

_M = TypeVar("_M", bound=Model)
_T = TypeVar("_T")

DEFAULT_LIMIT = 100
MAX_LIMIT = 500
# A page stops after the item that takes its items' JSON past this (API.md).
MAX_PAGE_BYTES = 4 * 1024 * 1024
# Rows read before the page knows how large its items are: 20 tasks of the largest
# payload and result (256 KiB each) are ~10 MB of rows, and 20 small rows take one query.
FIRST_CHUNK_ROWS = 20


def parse_limit(request: Request) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return DEFAULT_LIMIT
    # ASCII digits only: str.isdigit() also passes superscripts (which int() refuses)
    # and other scripts' digits.  The length first: int() refuses more than 4,300
    # digits with a ValueError (and leading zeros count).
    digits = raw.lstrip("0") if raw.isascii() and raw.isdigit() else ""
    if not digits or len(digits) > len(str(MAX_LIMIT)) or int(digits) > MAX_LIMIT:
        raise ValidationError({"limit": [f"Must be an integer from 1 to {MAX_LIMIT}."]})
    return int(digits)


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
        # The page so far, while it is read (`_chunks` sizes its reads from them).
        self._items: list[bytes] = []
        self._size = 0

    def answer(
        self, queryset: QuerySet[_M], render: Callable[[list[_M]], Iterable[Any]]
    ) -> Response:
        """The page of `queryset` after the cursor; `render` turns a chunk of rows
        into their items (in order), so a lookup per chunk can serve all of them."""
        return self._answer(
            self._chunks(queryset), lambda row: keyset.values_of(row, self.ordering), render
        )

    def answer_rows(
        self,
        rows: list[_T],
        key: Callable[[_T], Sequence[Any]],
        render: Callable[[list[_T]], Iterable[Any]],
    ) -> Response:
        """The page of `rows`, the list's next `limit` + 1 (or fewer) items after the
        cursor, already read; `key` gives an item's values on the ordering."""
        return self._answer(iter([rows]), key, render)

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

    def _answer(
        self,
        chunks: Iterator[list[_T]],
        key: Callable[[_T], Sequence[Any]],
        render: Callable[[list[_T]], Iterable[Any]],
    ) -> Response:
        items = self._items
        last: _T | None = None
        more = False
        for chunk in chunks:
            for row, item in zip(chunk, render(chunk), strict=True):
                if len(items) == self.limit or self._size > MAX_PAGE_BYTES:
                    more = True  # a row after the page's last: `next` leads to it
                    break
                encoded = render_json(item)
                items.append(encoded)
                self._size += len(encoded)
                last = row
            if more:
                break
        next_url = None
        if more and last is not None:
            next_url = self._next_url(keyset.encode(key(last)))
        body = b'{"results":[' + b",".join(items) + b'],"next":' + render_json(next_url) + b"}"
        return Response(Rendered(body))

    def _chunks(self, queryset: QuerySet[_M]) -> Iterator[list[_M]]:
        """The rows after the cursor, in chunks; each is read once the page took the
        one before, and sized by what the page still has room for."""
        queryset = queryset.order_by(*self.ordering)
        values = self.after
        rows = FIRST_CHUNK_ROWS
        while True:
            # One row past the page's room: it tells whether there is a next page.
            want = min(self.limit - len(self._items) + 1, rows)
            chunk = list(self._after(queryset, values)[:want])
            yield chunk
            if len(chunk) < want:
                return
            values = keyset.values_of(chunk[-1], self.ordering)
            # As many rows as the bytes left hold at the items' mean size so far (+1).
            left = MAX_PAGE_BYTES - self._size
            mean = self._size / max(len(self._items), 1)
            rows = max(1, math.ceil(left / max(mean, 1))) + 1 if left >= 0 else 1

    def _after(self, queryset: QuerySet[_M], values: Sequence[Any] | None) -> QuerySet[_M]:
        if values is None:
            return queryset
        try:
            return queryset.filter(keyset.after(self.ordering, values))
        except (DjangoValidationError, ValueError, TypeError) as exc:
            # A cursor's value of the wrong type for its column: building the lookup
            # raises one of these, depending on the field.
            raise _bad_cursor() from exc

    def _next_url(self, cursor: str) -> str:
        params = self.request.query_params.copy()
        params["cursor"] = cursor
        return (
            self.request.build_absolute_uri(self.request.path) + "?" + urlencode(params, doseq=True)
        )


def _bad_cursor() -> ValidationError:
    return ValidationError({"cursor": [keyset.BadCursor.__doc__]})
