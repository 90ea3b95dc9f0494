"""The fairness keys' part of the Redis dispatch structure (API.md "Fairness keys (v1.2)").

`tasks.buffer`'s `Buffer` extends `KeyedBuffer`; every key named here is one
of its queue's (same hash tag), and no other module names them or runs their
Lua (`tasks.fair_buffer_scripts`; tests/test_architecture.py).

Fairness keys (API.md "Fairness keys (v1.2)").  Tasks with a fairness key
wait in their key's own ready set; the queue's `ready` set stays the
anonymous key's, and a queue none of whose buffered tasks has a key keeps
exactly the v1 keys and cost.  With the same hash tag:

- `tf:{<queue-id>}:fair` hash, present while keyed tasks may be buffered:
  the take then hands out by key (tasks.buffer_scripts.FAIR_POP).  Field
  `a`: the ring the anonymous key is in.  Removed by a take that finds no
  key with buffered tasks.
- `tf:{<queue-id>}:k:<key>` sorted set: the key's buffered task ids, scored
  as `ready` (priority, then scheduled_at); at most TASKFORGE_BUFFER_SIZE,
  like the anonymous key's, the rest waits `pending` in Postgres.
- `tf:{<queue-id>}:ring:<p>` (p = 1..10) sorted set of the keys whose most
  urgent buffered task has priority p (member '' for the anonymous key),
  scored by virtual time (stride scheduling: +1/weight per task handed out;
  a key joins at the ring's least time).
- `tf:{<queue-id>}:cpark` set of keys held back by key_max_concurrency, out
  of their ring until a slot of theirs frees; `tf:{<queue-id>}:rpark`
  sorted set of keys held back by key_rate_limit, scored by when (ms, Redis
  clock) their next token is due; `tf:{<queue-id>}:kb:<key>` that key's
  bucket ("tokens ts", expiring once full again).
- `tf:{<queue-id>}:krun` hash key -> its tasks holding a slot, and
  `tf:{<queue-id>}:ktask` hash task id -> key (so a release by id frees
  the key's slot), kept with `running` while key_max_concurrency is set.
- `tf:{<queue-id>}:kw` hash key -> weight and `tf:{<queue-id>}:kwv` its
  version: key_weights as the take reads them (written when a take finds
  another version, `set_weights`).

Scripts name these keys from the queue's prefix (one slot: a cluster
allows it).  Losing them loses no task: each keyed `claimed` task is
pushed back by the reconcile, per-key counts are rebuilt with the running
count, and a lost bucket is set from Postgres (tasks.reconcile.restore_key_rates).
"""

from __future__ import annotations

import json
import math
import time
import uuid
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from taskforge.conf import conf
from taskforge.lib.redisconn import Client
from tasks.fair_buffer_scripts import (
    ADMIT_KEYED,
    DRAIN_KEYED,
    FORGET_KEYED,
    KEY_TOKENS,
    PUSH_KEYED,
    WEIGHTS,
)


def prefix(queue_id: uuid.UUID | str) -> str:
    """The start of every key of the queue (its hash tag included)."""
    return f"tf:{{{queue_id}}}:"


def key_ready_key(queue_id: uuid.UUID | str, key: str) -> str:
    """The ready set of one fairness key's tasks."""
    return f"tf:{{{queue_id}}}:k:{key}"


def fair_key(queue_id: uuid.UUID | str) -> str:
    """Present while the queue hands out by fairness key."""
    return f"tf:{{{queue_id}}}:fair"


# key_weights -> the version the take compares with `kwv` (the map itself
# as last seen, so that a version is not recomputed per claim).
_weight_versions: dict[int, tuple[Mapping[str, int], str]] = {}


def weights_version(weights: Mapping[str, int] | None) -> str:
    """A short version of a key_weights map ('' for none)."""
    if not weights:
        return ""
    seen = _weight_versions.get(id(weights))
    if seen is not None and seen[0] is weights:
        return seen[1]
    text = json.dumps(sorted(weights.items()), ensure_ascii=False)
    version = f"{zlib.crc32(text.encode()):08x}{len(weights)}"
    if len(_weight_versions) > 10_000:
        _weight_versions.clear()
    _weight_versions[id(weights)] = (weights, version)
    return version


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """A queue's fairness settings as the take applies them."""

    max_concurrency: int | None = None
    rate_limit: float | None = None
    weights: Mapping[str, int] | None = None


NO_KEY_LIMITS = KeyLimits()

# (queue id, key) -> (the key's set size as this process's last push left it,
# time.monotonic()): `admit_keyed` skips Redis for a key seen with room twice
# over within SEEN_SIZE_SECONDS, as `tasks.buffer` does for the anonymous key.
_seen_key_sizes: dict[tuple[str, str], tuple[int, float]] = {}
SEEN_SIZE_SECONDS = 0.1
SEEN_KEYS_MAX = 100_000


def forget_seen_key_sizes() -> None:
    _seen_key_sizes.clear()


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class KeyedBuffer:
    """The fairness keys' writes and reads of a queue's buffer."""

    client: Client

    def register_keyed(self, client: Client) -> None:
        self._admit_keyed = client.register_script(ADMIT_KEYED)
        self._push_keyed = client.register_script(PUSH_KEYED)
        self._drain_keyed = client.register_script(DRAIN_KEYED)
        self._forget_keyed = client.register_script(FORGET_KEYED)
        self._weights = client.register_script(WEIGHTS)
        self._key_tokens = client.register_script(KEY_TOKENS)

    def wake_message(self, queue_id: uuid.UUID | str, count: int) -> tuple[str, str]:
        """The channel and message that wake about `count` claims of the queue."""
        raise NotImplementedError

    def push_keyed(
        self,
        queue_id: uuid.UUID | str,
        items: Iterable[tuple[str, int, str]],
        *,
        wake: bool = False,
    ) -> int:
        """Add `(task_id, score, fairness_key)` triples to their keys' ready sets.

        An id already there keeps its place; a key that had none joins its
        ring (tasks.fair_buffer_scripts.PUSH_KEYED).  With `wake`, also tell
        waiting long polls, in the same round trip.  Remembers each key's size
        for `admit_keyed`.
        """
        flat: list[str | int] = []
        for task_id, task_score, key in items:
            flat += (task_id, task_score, key)
        if not flat:
            return 0
        added = 0
        # Chunks keep each script's arguments well under Lua's unpack limit.
        step = 3 * 2000
        for i in range(0, len(flat), step):
            chunk = flat[i : i + step]
            channel, message = self.wake_message(queue_id, len(chunk) // 3) if wake else ("", "")
            answer = self._push_keyed(
                keys=[fair_key(queue_id)], args=[prefix(queue_id), channel, message, *chunk]
            )
            added += int(answer[0])
            keys = list(dict.fromkeys(str(key) for key in chunk[2::3]))
            now = time.monotonic()
            if len(_seen_key_sizes) > SEEN_KEYS_MAX:
                _seen_key_sizes.clear()
            for key, size in zip(keys, answer[1:], strict=True):
                _seen_key_sizes[(str(queue_id), key)] = (int(size), now)
        return added

    def admit_keyed(self, queue_id: uuid.UUID | str, counts: Mapping[str, int]) -> set[str]:
        """The fairness keys whose `counts[key]` due tasks fit in their ready sets now.

        One round trip, or none for keys this process's last push left, under
        SEEN_SIZE_SECONDS ago, with room for them twice over (as `Buffer.admit`).
        """
        if not counts:
            return set()
        admitted: set[str] = set()
        now = time.monotonic()
        half = conf.BUFFER_SIZE // 2
        keys = []
        for key, count in counts.items():
            seen = _seen_key_sizes.get((str(queue_id), key))
            if seen is not None and seen[0] + count <= half and now - seen[1] < SEEN_SIZE_SECONDS:
                admitted.add(key)
            else:
                keys.append(key)
        if not keys:
            return admitted
        args: list[str | int] = [prefix(queue_id), conf.BUFFER_SIZE]
        for key in keys:
            args += (key, counts[key])
        answer = self._admit_keyed(keys=[fair_key(queue_id)], args=args)
        return admitted | {key for key, fits in zip(keys, answer, strict=True) if int(fits)}

    def key_sizes(self, queue_id: uuid.UUID | str, keys: Sequence[str]) -> list[int]:
        """How many tasks each fairness key has in its ready set (one round trip)."""
        if not keys:
            return []
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.zcard(key_ready_key(queue_id, key))
        return [int(size) for size in pipe.execute()]

    def set_weights(self, queue_id: uuid.UUID | str, weights: Mapping[str, int]) -> None:
        """Write the queue's key_weights where the take reads them."""
        args: list[str | int] = [weights_version(weights)]
        for key, weight in weights.items():
            args += (key, weight)
        self._weights(keys=[f"{prefix(queue_id)}kw", f"{prefix(queue_id)}kwv"], args=args)

    def present_keyed(
        self, queue_id: uuid.UUID | str, tasks: Sequence[tuple[str, str]]
    ) -> list[bool]:
        """Which `(task_id, fairness key)` are in their key's ready set (one round trip)."""
        if not tasks:
            return []
        pipe = self.client.pipeline(transaction=False)
        for task_id, key in tasks:
            pipe.zscore(key_ready_key(queue_id, key), task_id)
        return [value is not None for value in pipe.execute()]

    def restore_key_tokens(
        self, queue_id: uuid.UUID | str, tokens: Mapping[str, float], rate: float
    ) -> None:
        """Set the buckets of keys of a queue of `key_rate_limit` `rate` to at most `tokens`."""
        if not tokens:
            return
        burst = max(1, math.ceil(rate))
        args: list[str | float | int] = [prefix(queue_id), math.ceil(burst * 1000 / rate) + 1000]
        for key, value in tokens.items():
            args += (key, value)
        self._key_tokens(keys=[fair_key(queue_id)], args=args)

    def drain_keyed(self, queue_id: uuid.UUID | str) -> list[str]:
        """Empty every fairness key's ready set (a paused queue); their ids."""
        members: list[Any] = self._drain_keyed(keys=[fair_key(queue_id)], args=[prefix(queue_id)])
        return [text(member) for member in members]

    def forget_keyed(self, queue_id: uuid.UUID | str) -> None:
        """Delete the queue's fairness keys (a deleted queue)."""
        self._forget_keyed(keys=[fair_key(queue_id)], args=[prefix(queue_id)])
