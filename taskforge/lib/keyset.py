"""Keyset (cursor) pagination: one cursor format and one "after" condition.

A page is cut on the list's ordering columns, so it costs one index range
scan however deep it is, and rows inserted meanwhile never shift a page.  The
API's lists (`taskforge.api.pagination`) and the dashboard's
(`dashboard.queries`) both page this way, with the same cursors.

A cursor is the last row's values of the ordering columns, as URL-safe base64
of a JSON list (a time as `{"t": iso}`, a UUID as its text).
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db.models import Model, Q

from taskforge.lib import jsonutil
from taskforge.lib.timeutil import parse_time


class BadCursor(ValueError):
    """Not a cursor this list gave out."""


def encode(values: Sequence[Any]) -> str:
    plain = [
        {"t": v.isoformat()}
        if isinstance(v, datetime)
        else str(v)
        if isinstance(v, uuid.UUID)
        else v
        for v in values
    ]
    return base64.urlsafe_b64encode(json.dumps(plain).encode()).decode().rstrip("=")


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return {"t": value.isoformat()}
    return str(value) if isinstance(value, uuid.UUID) else value


def decode(cursor: str, width: int) -> list[Any]:
    """The `width` values of a cursor.

    Raises:
        BadCursor: not base64 of a JSON list of that many plain values (nested
            no deeper than jsonutil.MAX_DEPTH, like any JSON TaskForge reads),
            or a string that is not valid Unicode without NUL (a `\\ud800`
            escape decodes to a lone surrogate, which no column can hold).
    """
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        plain = jsonutil.loads(base64.urlsafe_b64decode(padded.encode()))
        if not isinstance(plain, list) or len(plain) != width:
            raise ValueError("wrong shape")
        values = [parse_time(v["t"]) if isinstance(v, dict) else v for v in plain]
    except (ValueError, TypeError, KeyError, binascii.Error, UnicodeDecodeError) as exc:
        raise BadCursor() from exc
    if any(
        isinstance(v, bool)
        or not isinstance(v, str | int | datetime)
        or (isinstance(v, str) and not _is_text(v))
        for v in values
    ):
        raise BadCursor()
    return values


def _is_text(value: str) -> bool:
    """Text Postgres can hold: valid Unicode (no lone surrogate) without NUL."""
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return "\x00" not in value


def values_of(row: Model, ordering: Sequence[str]) -> list[Any]:
    """`row`'s values on `ordering` (e.g. `["-created_at", "-id"]`)."""
    return [getattr(row, name.lstrip("-")) for name in ordering]


def cursor_of(row: Model, ordering: Sequence[str]) -> str:
    """The cursor that continues after `row` on `ordering`."""
    return encode(values_of(row, ordering))


def after(ordering: Sequence[str], values: Sequence[Any]) -> Q:
    """Rows after `values` on `ordering`, whose last column must be unique.

    `(a, b) < (x, y)` is written `a <= x AND (a < x OR b < y)`: the first half
    bounds the index range, the second drops the ties already shown.
    """
    lexicographic = Q()
    equal = Q()
    for name, value in zip(ordering, values, strict=True):
        field = name.lstrip("-")
        op = "lt" if name.startswith("-") else "gt"
        lexicographic |= equal & Q(**{f"{field}__{op}": value})
        equal &= Q(**{field: value})
    first = ordering[0]
    bound = Q(**{f"{first.lstrip('-')}__{'lte' if first.startswith('-') else 'gte'}": values[0]})
    return bound & lexicographic
