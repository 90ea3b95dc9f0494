from __future__ import annotations

import time

from taskforge.lib.ids import uuid7


def test_uuid7__version_variant_and_time() -> None:
    before = time.time_ns() // 1_000_000
    value = uuid7()
    assert value.version == 7
    assert value.variant == "specified in RFC 4122"
    assert abs((value.int >> 80) - before) < 1000


def test_uuid7__strictly_increasing_as_values_and_strings() -> None:
    ids = [uuid7() for _ in range(20_000)]  # many share a millisecond
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    # Redis orders equal scores by member string: the text form must sort the same.
    assert [str(i) for i in ids] == sorted(str(i) for i in ids)
