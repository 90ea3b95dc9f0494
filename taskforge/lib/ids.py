"""Time-ordered task ids (UUID version 7, RFC 9562).

Ids that sort by creation time keep FIFO order among tasks of equal priority
and `scheduled_at` (a batch shares one enqueue time), both in Postgres and in
the Redis buffer, whose ties are broken by member string.  They also keep the
primary-key index's inserts on its right edge instead of spread over it.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

_lock = threading.Lock()
_last_ms = 0
_counter = 0


def uuid7() -> uuid.UUID:
    """A new UUIDv7, strictly increasing within this process.

    Layout: 48-bit Unix time in ms, version 7, a 12-bit counter that orders
    ids of the same millisecond (method 1 of RFC 9562, section 6.2), the
    variant, then 62 random bits.
    """
    global _last_ms, _counter
    with _lock:
        now_ms = time.time_ns() // 1_000_000
        if now_ms > _last_ms:
            _last_ms = now_ms
            _counter = int.from_bytes(os.urandom(2), "big") & 0x3FF  # leave room to count up
        else:
            _counter += 1
            if _counter > 0xFFF:  # 4096 ids in one ms: borrow the next ms
                _last_ms += 1
                _counter = 0
        ms, counter = _last_ms, _counter
    rand_b = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (ms << 80) | (0x7 << 76) | (counter << 64) | (0b10 << 62) | rand_b
    return uuid.UUID(int=value)
