"""proto3 JSON as Cloud Tasks' REST clients send it (API-cloudtasks.md "Conventions").

Requests may name fields in lowerCamelCase or snake_case; enums come as names
or numbers; Durations as "<seconds>s"; Timestamps as RFC 3339; bytes as
base64 (standard or URL-safe, padding optional).  Every reader here names the
field it refuses by its path from the request's top (`task.httpRequest.url`)
and raises `errors.invalid`; answers use camelCase, standard base64, and
enums as numbers or names (`Output`).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from cloudtasks.errors import RpcError, invalid
from taskforge.lib import jsonutil

_CAMEL = re.compile(r"_([a-z0-9])")
_SNAKE = re.compile(r"([A-Z])")
_DURATION = re.compile(r"^(-?)(\d{1,12})(?:\.(\d{1,9}))?s$")
_TIMESTAMP = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})$"
)


def camel(name: str) -> str:
    return _CAMEL.sub(lambda m: m.group(1).upper(), name)


def snake(name: str) -> str:
    return _SNAKE.sub(lambda m: "_" + m.group(1).lower(), name)


def parse_body(raw: bytes) -> dict[str, Any]:
    """A request body as a JSON object; empty is `{}`.

    Raises:
        RpcError: not a JSON object, duplicate keys, too deep.
    """
    if not raw.strip():
        return {}
    try:
        value = jsonutil.loads(raw)
    except ValueError as exc:
        raise invalid("body", f"The body is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise invalid("body", "The body must be a JSON object.")
    return value


def fields(
    value: Any, path: str, known: Iterable[str], *, ignored: Iterable[str] = ()
) -> dict[str, Any]:
    """An object's fields by camelCase name; unknown names refused, `ignored` dropped.

    `path` is the object's own path ("" at the top, else "task." etc.).
    """
    where = path.rstrip(".") or "body"
    if not isinstance(value, dict):
        raise invalid(where, f"'{where}' must be an object.")
    known_set, ignored_set = set(known), set(ignored)
    found: dict[str, Any] = {}
    for key, item in value.items():
        name = camel(key) if "_" in key else key
        if name in ignored_set:
            continue
        if name not in known_set:
            raise invalid(f"{path}{key}", f"Unknown field {key!r}.")
        if name in found:
            raise invalid(f"{path}{name}", f"Field {name!r} is given twice.")
        found[name] = item
    return found


def string(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise invalid(field, f"'{field}' must be a string.")
    return value


def integer(value: Any, field: str, low: int, high: int) -> int:
    """An int32/int64 (a JSON number or a decimal string) within low..high."""
    if isinstance(value, str) and re.fullmatch(r"-?\d{1,20}", value):
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(field, f"'{field}' must be an integer.")
    if not low <= value <= high:
        raise invalid(field, f"'{field}' must be between {low} and {high}.")
    return value


def number(value: Any, field: str, low: float, high: float, *, low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid(field, f"'{field}' must be a number.")
    if value > high or value < low or (low_open and value == low):
        raise invalid(field, f"'{field}' is out of range.")
    return float(value)


def duration(value: Any, field: str, low: float, high: float) -> float:
    """A Duration ("0.5s") in seconds within low..high, kept to the millisecond."""
    match = _DURATION.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise invalid(field, f'\'{field}\' must be a duration such as "10s" or "0.5s".')
    seconds = int(match.group(2)) + int((match.group(3) or "0").ljust(9, "0")) / 1e9
    if match.group(1):
        seconds = -seconds
    if not low <= seconds <= high:
        raise invalid(field, f"'{field}' must be between {low:g}s and {high:g}s.")
    return round(seconds, 3)


def timestamp(value: Any, field: str) -> datetime:
    """An RFC 3339 time, kept to the microsecond."""
    match = _TIMESTAMP.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise invalid(field, f"'{field}' must be an RFC 3339 time such as 2030-01-01T00:00:00Z.")
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    try:
        moment = datetime(
            int(year),
            int(month),
            int(day),
            int(hour),
            int(minute),
            int(second),
            int((fraction or "0")[:6].ljust(6, "0")),
            tzinfo=UTC,
        )
        if zone not in ("Z", "z"):
            sign = 1 if zone[0] == "+" else -1
            offset = timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6]))
            moment -= sign * offset
    except (ValueError, OverflowError) as exc:
        raise invalid(field, f"'{field}' is not a valid time.") from exc
    return moment


def bytes_(value: Any, field: str) -> bytes:
    """base64, standard or URL-safe, padding optional."""
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9+/_-]*={0,2}", value):
        raise invalid(field, f"'{field}' must be base64.")
    text = value.rstrip("=").replace("-", "+").replace("_", "/")
    if len(text) % 4 == 1:
        raise invalid(field, f"'{field}' is not valid base64.")
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise invalid(field, f"'{field}' is not valid base64.") from exc


def enum(value: Any, field: str, names: tuple[str, ...], *, zero_ok: bool = True) -> str:
    """An enum given by name or number; `names[i]` is the name of number i."""
    if isinstance(value, str) and value in names:
        name = value
    elif isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(names):
        name = names[value]
    else:
        raise invalid(field, f"'{field}' must be one of {', '.join(names[1:])}.")
    if not zero_ok and name == names[0]:
        raise invalid(field, f"'{field}' must be one of {', '.join(names[1:])}.")
    return name


@dataclass(frozen=True, slots=True)
class Output:
    """How an answer writes enums: numbers when the call asked `enum-encoding=int`."""

    enum_numbers: bool

    def enum(self, name: str, names: tuple[str, ...]) -> str | int:
        return names.index(name) if self.enum_numbers else name


def show_duration(seconds: float) -> str:
    text = f"{seconds:.3f}".rstrip("0").rstrip(".")
    return f"{text}s"


def show_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def show_bytes(data: bytes) -> str:
    return base64.b64encode(data).decode()


def bad_query(name: str, message: str) -> RpcError:
    return invalid(name, message)
