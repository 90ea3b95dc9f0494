"""The Redis side of dispatch: every key name lives here, and every write to those keys
goes through `Buffer` (its Lua scripts are in `tasks.buffer_scripts`); no other
module names them or runs the scripts (tests/test_architecture.py).

Per queue, with the queue id as hash tag so that every key of a queue sits in
one slot, and each script, pipeline and multi-key command touches one slot
(a Redis Cluster refuses any other; see taskforge.lib.redisconn for
`redis+cluster://` URLs):

- `tf:{<queue-id>}:ready`  sorted set of buffered task ids (status `claimed`
  in Postgres), scored by priority then `scheduled_at` (see `score`).
- `tf:{<queue-id>}:bucket` hash `{tokens, ts}`: the queue's token bucket.
- `tf:{<queue-id>}:epoch`  set by a dispatcher; missing means the keys of
  the queue were lost (a restart without persistence, a FLUSHALL, a cluster
  node that came back empty), and the dispatcher re-buffers the queue at once.
- `tf:{<queue-id>}:running` sorted set of the ids a claim took from a queue
  with `max_concurrency`, scored by when (ms, Redis clock): the slots in use.
  A take adds them; the end of the attempt (ack, nack, lease expiry) or a
  hand-out that did not happen removes them (`release`).
- `tf:{<queue-id>}:counted` present while `running` is known to hold every
  executing task of the queue; a take on a capped queue without it hands
  out nothing until the count is rebuilt from Postgres (tasks.concurrency).
- `tf:{<queue-id>}:counting` held (1 s at most) by the one claim rebuilding
  that count, so a crowd of waiting claims does not all read Postgres.
- `tf:{<queue-id>}:watched` set (for WATCH_SECONDS, and again every second)
  by a dispatcher that found the queue's buffer full and polls it for room,
  refilling it from the backlog in Postgres; removed when it finds room.
  While the mark has more than WATCH_MARGIN_MS to live, an enqueue of tasks
  no more urgent than the buffer's least urgent needs no NOTIFY (`admit`):
  every enqueue into a backlog sent one, and each woke the dispatcher for
  nothing.  A dispatcher that dies leaves a mark that lapses within
  WATCH_SECONDS.

and one pub/sub channel, `tf:wake:<db>`, on which the dispatcher names the queues
it just filled (and a release names the queue it freed a slot of) so
waiting long polls try again at once: `<queue-id>:<n>` when n tasks (or
slots) arrived, which wakes about n waiting claims of each API process
(tasks.wakeup), or a comma-separated list of bare queue ids, which wakes all.
A classic PUBLISH reaches the subscribers of every node of a cluster.

Fairness keys: tasks with one wait in their key's ready set, handed out by
key in turns (`tasks.fair_buffer`, whose `KeyedBuffer` `Buffer` extends); a
queue with no keyed task buffered keeps the keys above and their cost.

Redis is only a buffer: Postgres says what a task's status is.  Losing any
of these keys loses no task; the watchdog's reconcile puts `claimed` tasks
that are missing from their set back in, and rebuilds each capped queue's
running set from its `executing` tasks.
"""

from __future__ import annotations

import enum
import os
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import cast

from django.conf import settings
from redis.cluster import RedisCluster

from taskforge.conf import conf
from taskforge.lib.redisconn import Client, channel, connect
from tasks import fair_buffer
from tasks.buffer_scripts import ADMIT, COUNT, PRUNE, RELEASE, TAKE
from tasks.fair_buffer import NO_KEY_LIMITS, KeyedBuffer, fair_key, prefix, text, weights_version
from tasks.fair_buffer import KeyLimits as KeyLimits  # a take's, named here for its callers


def wake_channel() -> str:
    """Where wake-ups are published: `tf:wake:<db>` (channels are server-wide)."""
    return channel("tf:wake", settings.REDIS_URL)


# priority (1..10) * 1e13 + scheduled_at in ms (~1.8e12 today, < 1e13 until
# year 2286): exact in a double, and orders by priority, then time.
_PRIORITY_WEIGHT = 10**13


# The lane of a queue's buffer that push processes take tasks with an HTTP
# target (the Cloud Tasks API's) from; claims never read it.  Both lanes share
# the queue's token bucket and running set: its rate and cap count them together.
HTTP_LANE = "http"
# The lane of tasks a Cloud Tasks RunTask dispatches now: push processes take it
# first, with no rate limit, cap or pause holding it back.
RUN_LANE = "run"


def ready_key(queue_id: uuid.UUID | str, lane: str = "") -> str:
    return f"tf:{{{queue_id}}}:ready" + (f":{lane}" if lane else "")


def bucket_key(queue_id: uuid.UUID | str) -> str:
    return f"tf:{{{queue_id}}}:bucket"


def epoch_key(queue_id: uuid.UUID | str) -> str:
    """Set by a dispatcher; its absence means the queue's keys were lost."""
    return f"tf:{{{queue_id}}}:epoch"


def running_key(queue_id: uuid.UUID | str) -> str:
    return f"tf:{{{queue_id}}}:running"


def counted_key(queue_id: uuid.UUID | str) -> str:
    return f"tf:{{{queue_id}}}:counted"


def counting_key(queue_id: uuid.UUID | str) -> str:
    return f"tf:{{{queue_id}}}:counting"


def watched_key(queue_id: uuid.UUID | str) -> str:
    return f"tf:{{{queue_id}}}:watched"


# The life of a watched mark (set again every second while a buffer stays
# full), and what must be left of it for an enqueue to skip its NOTIFY.
WATCH_SECONDS = 3.0
WATCH_MARGIN_MS = 1500


# The size of each queue's buffer as this process's last push left it (queue id
# -> (size, time.monotonic())).  For SEEN_SIZE_SECONDS after, an enqueue whose
# tasks keep that size within half the buffer's bound is admitted without asking
# Redis (`admit`): one round trip less per enqueue, 1 of the 3 Redis calls of a
# task that takes the single path.  Other processes' pushes meanwhile may take
# the buffer past what was seen, by what they enqueue within that time: the
# half of the bound left over covers it (the bound is Redis's memory, not a
# rule of hand-out order).
_seen_sizes: dict[str, tuple[int, float]] = {}
SEEN_SIZE_SECONDS = 0.1


def forget_seen_sizes() -> None:
    """Forget the sizes seen (tests: another Redis db, queues reused by name)."""
    _seen_sizes.clear()
    fair_buffer.forget_seen_key_sizes()


class Admission(enum.Enum):
    """What an enqueue does with its due tasks (`Buffer.admit`)."""

    BUFFER = "buffer"  # they fit: straight into the buffer
    WAKE = "wake"  # they stay pending; NOTIFY the dispatchers
    QUIET = "quiet"  # they stay pending; a dispatcher watches the full buffer


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


def score(priority: int, scheduled_at: datetime) -> int:
    """Lower is handed out first: priority, then scheduled_at; ties by id (UUIDv7).

    Exact integer arithmetic, the same as tasks.sql.BUFFER_DUE computes it.
    """
    return priority * _PRIORITY_WEIGHT + (scheduled_at - _EPOCH) // _MS


# What ZPOPMIN/ZPOPMAX answer without a score cast: (member, score) pairs.
_Scored = list[tuple[bytes | str, float]]


@dataclass(frozen=True, slots=True)
class Taken:
    ids: list[str]
    wait_ms: int  # > 0: rate-limited; try again after this long
    full: bool = False  # at max_concurrency: a release wakes the claim
    uncounted: bool = False  # capped, running count unknown: rebuild it, then take again


class Buffer(KeyedBuffer):
    """The per-queue dispatch buffer in Redis."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._take = client.register_script(TAKE)
        self._release = client.register_script(RELEASE)
        self._count = client.register_script(COUNT)
        self._prune = client.register_script(PRUNE)
        self._admit = client.register_script(ADMIT)
        self.register_keyed(client)

    def push(
        self,
        queue_id: uuid.UUID | str,
        items: Iterable[tuple[str, int]],
        *,
        wake: bool = False,
        lane: str = "",
    ) -> int:
        """Add `(task_id, score)` pairs; an id already there keeps its place.

        With `wake`, also tell waiting long polls, in the same round trip.
        """
        mapping = {task_id: task_score for task_id, task_score in items}
        if not mapping:
            return 0
        if lane:
            added = cast(int, self.client.zadd(ready_key(queue_id, lane), mapping, nx=True))
            if wake:
                self.client.publish(wake_channel(), f"{queue_id}:{len(mapping)}")
            return added
        if not wake:
            # ZADD NX answers the number added (redis-py types it int | float | None).
            return cast(int, self.client.zadd(ready_key(queue_id), mapping, nx=True))
        if isinstance(self.client, RedisCluster):
            # A cluster pipeline refuses PUBLISH (it names no key): two round
            # trips, the set first so a woken claim finds the tasks.
            added = cast(int, self.client.zadd(ready_key(queue_id), mapping, nx=True))
            self.client.publish(wake_channel(), f"{queue_id}:{len(mapping)}")
            return added
        pipe = self.client.pipeline(transaction=False)
        pipe.zadd(ready_key(queue_id), mapping, nx=True)
        pipe.zcard(ready_key(queue_id))
        # As many claims as tasks, not every waiting one: a fleet of 1,000
        # idle workers woken for each task was a burst of 1,000 claims.
        pipe.publish(wake_channel(), f"{queue_id}:{len(mapping)}")
        added, size, _ = pipe.execute()
        _seen_sizes[str(queue_id)] = (int(size), time.monotonic())
        return int(added)

    def wake_message(self, queue_id: uuid.UUID | str, count: int) -> tuple[str, str]:
        """The channel and message that wake about `count` claims of the queue."""
        return wake_channel(), f"{queue_id}:{count}"

    def admit(self, queue_id: uuid.UUID | str, count: int, best_score: int) -> Admission:
        """Where an enqueue's `count` due tasks go, the most urgent scoring `best_score`.

        BUFFER when they fit (TASKFORGE_BUFFER_SIZE); otherwise they stay
        pending, QUIET when a dispatcher watches the full buffer (`watch`) and
        none of them is more urgent than its least urgent task, else WAKE (a
        NOTIFY makes a dispatcher swap them in, or start watching).  One round trip,
        or none when this process's last push into the queue, under
        SEEN_SIZE_SECONDS ago, left room for them twice over (`_seen_sizes`).
        """
        seen = _seen_sizes.get(str(queue_id))
        if (
            seen is not None
            and seen[0] + count <= conf.BUFFER_SIZE // 2
            and time.monotonic() - seen[1] < SEEN_SIZE_SECONDS
        ):
            return Admission.BUFFER
        answer = self._admit(
            keys=[ready_key(queue_id), watched_key(queue_id)],
            args=[count, conf.BUFFER_SIZE, best_score, WATCH_MARGIN_MS],
        )
        return {1: Admission.BUFFER, 2: Admission.QUIET}.get(int(answer), Admission.WAKE)

    def watch(self, queue_id: uuid.UUID | str) -> None:
        """Say that a dispatcher polls the queue's full buffer (for WATCH_SECONDS)."""
        self.client.set(watched_key(queue_id), "1", px=int(WATCH_SECONDS * 1000))

    def unwatch(self, queue_id: uuid.UUID | str) -> None:
        """The buffer has room again: enqueues into the queue NOTIFY again."""
        self.client.delete(watched_key(queue_id))

    def take(
        self,
        queue_id: uuid.UUID | str,
        limit: int,
        rate_limit: float | None,
        max_concurrency: int | None = None,
        *,
        lane: str = "",
        keys: KeyLimits | None = None,
    ) -> Taken:
        """Pop up to `limit` ids of a lane in order, as the queue's token bucket and cap allow.

        With a cap (the queue's or its keys'), the ids taken hold a slot each
        until `release`.  The queue's own lane hands out by fairness key
        while keyed tasks are buffered, under `keys`' limits and weights.
        """
        keys = keys or NO_KEY_LIMITS
        version = weights_version(keys.weights)
        args = [
            limit,
            rate_limit or 0,
            max_concurrency or 0,
            "" if lane else "1",
            keys.max_concurrency or 0,
            keys.rate_limit or 0,
            version,
            prefix(queue_id),
        ]
        redis_keys = [
            ready_key(queue_id, lane),
            bucket_key(queue_id),
            running_key(queue_id),
            counted_key(queue_id),
            fair_key(queue_id),
        ]
        ids, wait_ms, state = self._take(keys=redis_keys, args=args)
        if state == 3 and keys.weights:
            self.set_weights(queue_id, keys.weights)
            ids, wait_ms, state = self._take(keys=redis_keys, args=args)
        return Taken([text(i) for i in ids], int(wait_ms), state == 1, state == 2)

    def release(
        self,
        queue_id: uuid.UUID | str,
        task_ids: Sequence[str],
        max_concurrency: int | None,
        key_max_concurrency: int | None = None,
    ) -> int:
        """Free the slots of `task_ids` and of their fairness keys (idempotent).

        Wakes claims if the queue was full, or a key held back by its cap may
        hand out again.
        """
        if not task_ids:
            return 0
        return int(
            self._release(
                keys=[running_key(queue_id)],
                args=[
                    max_concurrency or 0,
                    wake_channel(),
                    str(queue_id),
                    key_max_concurrency or 0,
                    prefix(queue_id),
                    *task_ids,
                ],
            )
        )

    def count(
        self,
        queue_id: uuid.UUID | str,
        task_ids: Sequence[str],
        *,
        mark_ttl_ms: int | None = 0,
        keys: Mapping[str, str | None] | None = None,
    ) -> None:
        """Add executing ids to the running set (and those with a fairness key, per
        `keys`, to their key's count) and mark the count as known.

        `mark_ttl_ms` > 0: the mark lapses after that long (the count is
        rebuilt again then); 0: it stays; None: the mark is not set (more
        ids are to come).
        """
        ttl = -1 if mark_ttl_ms is None else mark_ttl_ms
        flat: list[str] = []
        for task_id in task_ids:
            flat += (task_id, (keys or {}).get(task_id) or "")
        self._count(
            keys=[running_key(queue_id), counted_key(queue_id)],
            args=[ttl, prefix(queue_id), *flat],
        )

    def running(self, queue_id: uuid.UUID | str, *, before_ms: int | None = None) -> list[str]:
        """Ids holding a slot (only those that took it before `before_ms`, Redis clock)."""
        top = "+inf" if before_ms is None else f"({before_ms}"
        members = cast(list[bytes], self.client.zrangebyscore(running_key(queue_id), "-inf", top))
        return [text(member) for member in members]

    def start_counting(self, queue_id: uuid.UUID | str) -> bool:
        """True for the one caller that may rebuild the count now (for 1 s at most)."""
        return bool(self.client.set(counting_key(queue_id), "1", nx=True, px=1000))

    def done_counting(self, queue_id: uuid.UUID | str) -> None:
        self.client.delete(counting_key(queue_id))

    def running_count(self, queue_id: uuid.UUID | str) -> int:
        return int(self.client.zcard(running_key(queue_id)))

    def prune(self, queue_id: uuid.UUID | str, task_ids: Sequence[str], *, before_ms: int) -> int:
        """Free the slots of `task_ids` that were taken before `before_ms` only."""
        if not task_ids:
            return 0
        return int(
            self._prune(keys=[running_key(queue_id)], args=[before_ms, prefix(queue_id), *task_ids])
        )

    def forget_running(self, queue_ids: Iterable[uuid.UUID | str]) -> None:
        """Drop the running sets of queues without a cap (a new cap counts afresh)."""
        pipe = self.client.pipeline(transaction=False)
        for queue_id in queue_ids:
            # One key per DEL: a cluster pipeline refuses a DEL of several keys,
            # even of one slot (it raised, and failed every watchdog tick).
            pipe.delete(running_key(queue_id))
            pipe.delete(counted_key(queue_id))
            pipe.delete(f"{prefix(queue_id)}krun")
            pipe.delete(f"{prefix(queue_id)}ktask")
        pipe.execute()

    def now_ms(self) -> int:
        """The Redis server's clock, in ms (the running set's scores)."""
        seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def present(
        self, queue_id: uuid.UUID | str, task_ids: Sequence[str], *, lane: str = ""
    ) -> list[bool]:
        """Which of `task_ids` are in the queue's set (one round trip)."""
        if not task_ids:
            return []
        scores = self.client.zmscore(ready_key(queue_id, lane), list(task_ids))
        return [value is not None for value in scores]

    def pop_all(self, queue_id: uuid.UUID | str, *, lane: str = "") -> list[str]:
        """Empty a lane of a (paused) queue: its own with every fairness key's, or `lane`."""
        popped = self.client.zpopmin(ready_key(queue_id, lane), 100_000)
        ids = [text(member) for member, _ in cast(_Scored, popped)]
        return ids if lane else ids + self.drain_keyed(queue_id)

    def worst_score(self, queue_id: uuid.UUID | str) -> int | None:
        """Score of the least urgent buffered task, or None when empty."""
        last = self.client.zrange(ready_key(queue_id), -1, -1, withscores=True)
        return int(last[0][1]) if last else None

    def pop_worst(self, queue_id: uuid.UUID | str, count: int) -> list[str]:
        popped = self.client.zpopmax(ready_key(queue_id), count)
        return [text(member) for member, _ in cast(_Scored, popped)]

    def lost_queues(self, queue_ids: Iterable[uuid.UUID | str]) -> list[str]:
        """Mark each queue's slot as known; return the queues whose mark was missing.

        A missing mark means the Redis (or, in a cluster, the node) holding
        that queue's keys lost its data since the last call, or the queue is
        new.  One pipelined round trip (one per node in a cluster).
        """
        keys = [str(q) for q in queue_ids]
        if not keys:
            return []
        stamp = str(time.time())
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.set(epoch_key(key), stamp, nx=True)
        return [key for key, was_missing in zip(keys, pipe.execute(), strict=True) if was_missing]

    def size(self, queue_id: uuid.UUID | str) -> int:
        return int(self.client.zcard(ready_key(queue_id)))

    def wake(self, queue_ids: Iterable[uuid.UUID | str]) -> None:
        """Tell waiting long polls that these queues have work."""
        names = ",".join(str(q) for q in queue_ids)
        if names:
            self.client.publish(wake_channel(), names)

    def forget_queue(self, queue_id: uuid.UUID | str) -> None:
        self.forget_keyed(queue_id)
        self.client.delete(
            ready_key(queue_id),
            ready_key(queue_id, HTTP_LANE),
            ready_key(queue_id, RUN_LANE),
            bucket_key(queue_id),
            running_key(queue_id),
            counted_key(queue_id),
            counting_key(queue_id),
            epoch_key(queue_id),
            watched_key(queue_id),
        )


_local = threading.local()
_pid = 0
_client: Client | None = None
_client_lock = threading.Lock()


def get_client() -> Client:
    """This process's Redis client (one connection pool, rebuilt after fork).

    A `RedisCluster` when REDIS_URL names a cluster (taskforge.lib.redisconn),
    with one such pool per node.  The pool holds up to REDIS_POOL_MAX
    connections; a thread that finds them all in use waits for one (up to
    5 s, then the request answers 503) rather than failing at once: a burst
    of hundreds of claims in one API process is normal, and each holds a
    connection for a round trip or two.
    """
    global _client, _pid
    if _client is None or _pid != os.getpid():
        with _client_lock:
            if _client is None or _pid != os.getpid():
                _client = connect(
                    settings.REDIS_URL,
                    max_connections=settings.REDIS_POOL_MAX,
                    blocking_timeout=5,
                    socket_connect_timeout=2,
                    socket_timeout=5,
                    health_check_interval=30,
                    retry_on_timeout=False,
                )
                _pid = os.getpid()
    return _client


def get_buffer() -> Buffer:
    buffer = getattr(_local, "buffer", None)
    if buffer is None or buffer.client is not get_client():
        buffer = Buffer(get_client())
        _local.buffer = buffer
    return buffer
