"""The one request parser: strict JSON, as API.md's conventions require."""

from __future__ import annotations

import re
from typing import Any

from rest_framework.exceptions import ParseError, ValidationError
from rest_framework.parsers import JSONParser

from taskforge.lib import jsonutil


def find_bad_string(value: Any, path: str = "") -> str | None:
    """Return the path of the first string Postgres jsonb cannot store, if any.

    That is a string (or object key) holding NUL or an unpaired surrogate.
    """
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            if not _storable(item):
                return where
        elif isinstance(item, dict):
            for key, child in item.items():
                if not _storable(key):
                    return f"{where}.{_escape(key)}" if where else _escape(key)
                stack.append((f"{where}.{key}" if where else key, child))
        elif isinstance(item, list):
            stack.extend((f"{where}[{i}]", child) for i, child in enumerate(item))
    return None


def _escape(key: str) -> str:
    """`key` for an error path, with NUL and lone surrogates as `\\uXXXX` escapes.

    Echoing them raw would put an unencodable string into the error response.
    """
    return "".join(
        f"\\u{ord(char):04x}" if char == "\x00" or "\ud800" <= char <= "\udfff" else char
        for char in key
    )


def _storable(text: str) -> bool:
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# The only way into a parsed string for NUL or a lone surrogate is a `\u` escape:
# JSON refuses a raw control character in a string and UTF-8 cannot carry a
# surrogate.  A body without such an escape needs no walk (a matching escaped
# backslash, `\\u0000`, only costs the walk).
_MAYBE_UNSTORABLE = re.compile(rb"\\u(?:0000|[dD][89a-fA-F])")


def parse_body(data: bytes) -> Any:
    """A request body as strict JSON (DRF's parser and the hot views' both).

    Raises: ParseError (400 `parse_error`), ValidationError (400 `invalid`: a
    string Postgres cannot store).
    """
    try:
        value = jsonutil.loads(data)
    except jsonutil.Refused as exc:
        raise ParseError(f"The body is not valid JSON: {exc}") from exc
    bad = find_bad_string(value) if _MAYBE_UNSTORABLE.search(data) else None
    if bad is not None:
        field = bad or "non_field_errors"
        raise ValidationError({field: ["Strings must be valid Unicode without NUL characters."]})
    return value


class StrictJSONParser(JSONParser):
    """JSON bodies only; anything not strictly valid is `parse_error` or `invalid`."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        # The body's size was bounded before it was read (middleware.BodyLimitMiddleware).
        return parse_body(stream.read() if stream is not None else b"")
