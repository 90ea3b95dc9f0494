"""The one request parser: strict JSON, as API.md's conventions require."""

from __future__ import annotations

import codecs
import json
from typing import Any

from rest_framework.exceptions import ParseError, ValidationError
from rest_framework.parsers import JSONParser


class _Refused(ValueError):
    pass


def _object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _Refused(f"Duplicate key {key[:100]!r} in a JSON object.")
        result[key] = value
    return result


def _refuse_constant(name: str) -> Any:
    raise _Refused(f"{name} is not valid JSON.")


def _parse_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise _Refused(f"Number {text[:40]} is out of range.")
    return value


def loads(text: str) -> Any:
    """Parse JSON refusing what Python's json module lets through.

    Duplicate keys, NaN/Infinity and numbers that overflow a double are
    refused; a typo'd duplicate key must not silently override the first.

    Raises:
        ValueError: the text is not such JSON.
    """
    return json.loads(
        text,
        object_pairs_hook=_object_without_duplicates,
        parse_constant=_refuse_constant,
        parse_float=_parse_float,
    )


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


class StrictJSONParser(JSONParser):
    """JSON bodies only; anything not strictly valid is `parse_error` or `invalid`."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        parser_context = parser_context or {}
        encoding = parser_context.get("encoding", "utf-8")
        try:
            text = codecs.getreader(encoding)(stream).read()
        except (UnicodeDecodeError, LookupError) as exc:
            raise ParseError("The body is not valid UTF-8.") from exc
        try:
            data = loads(text)
        except (_Refused, json.JSONDecodeError) as exc:
            raise ParseError(f"The body is not valid JSON: {exc}") from exc
        except RecursionError as exc:
            raise ParseError("The body is not valid JSON: it is nested too deeply.") from exc
        except ValueError as exc:
            # int() past Python's digit limit; its message is advice for Python programmers.
            raise ParseError("The body is not valid JSON: an integer has too many digits.") from exc
        bad = find_bad_string(data)
        if bad is not None:
            field = bad or "non_field_errors"
            raise ValidationError(
                {field: ["Strings must be valid Unicode without NUL characters."]}
            )
        return data
