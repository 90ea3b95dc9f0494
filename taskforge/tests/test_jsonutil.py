from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from taskforge.lib import jsonutil


def stdlib(value, default=None) -> bytes:
    return json.dumps(value, default=default, ensure_ascii=False, separators=(",", ":")).encode()


DOCUMENTS = [
    {"job": "bench", "args": [1, 2, 3], "note": "x" * 40},
    {"nested": {"a": [True, False, None, {"b": []}]}, "empty": {}, "s": ""},
    ["ünïcödé ✓ 日本語", 'quote " backslash \\ newline \n tab \t', "\u2028\u2029", "\x01"],
    [0, -1, 2**63 - 1, -(2**63), 0.5, -0.25, 123456.789, 1e300, 1e16],
    "just a string",
    42,
]


@pytest.mark.parametrize("value", DOCUMENTS)
def test_dumps__same_bytes_as_the_stdlib(value) -> None:
    assert jsonutil.dumps(value) == stdlib(value)


@pytest.mark.parametrize(
    "value",
    [
        10**30,  # past 64 bits: orjson refuses, the stdlib writes it
        {"big": [-(10**25)]},
        {1: "non-string key"},
        [[[[[[]]]]]] * 2,
    ],
)
def test_dumps__falls_back_to_the_stdlib(value) -> None:
    assert jsonutil.dumps(value) == stdlib(value)


def test_dumps__floats_keep_their_values() -> None:
    values = [1.5e-5, 1e-7, 1.7976931348623157e308, 5e-324, 0.1 + 0.2]
    assert json.loads(jsonutil.dumps(values)) == values


def test_dumps__datetimes_and_others_go_to_default() -> None:
    at = datetime(2026, 11, 30, 5, 9, 23, 75089, tzinfo=UTC)
    task_id = uuid.UUID("01a22aca-820b-7218-b3fb-044023db17c6")
    value = {"at": at, "id": task_id, "amount": Decimal("1.10")}
    assert jsonutil.dumps(value, default=str) == stdlib(value, default=str)
    with pytest.raises(TypeError):
        jsonutil.dumps({"at": at})
