"""The Redis side of dispatch: every key name and Lua script lives here.

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

per task, `tf:{<task-id>}:hb`, a capped list of its recent heartbeat times
(a diagnostic for the dashboard, see `workers.heartbeats`),

and one pub/sub channel, `tf:wake`, on which the dispatcher names the queues
it just filled so waiting long polls try again at once.  A classic PUBLISH
reaches the subscribers of every node of a cluster.

Redis is only a buffer: Postgres says what a task's status is.  Losing any
of these keys loses no task; the watchdog's reconcile puts `claimed` tasks
that are missing from their set back in.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import cast

from django.conf import settings
from redis.cluster import RedisCluster

from taskforge.lib.redisconn import Client, connect

WAKE_CHANNEL = "tf:wake"

# priority (1..10) * 1e13 + scheduled_at in ms (~1.8e12 today, < 1e13 until
# year 2286): exact in a double, and orders by priority, then time.
_PRIORITY_WEIGHT = 10**13


def ready_key(queue_id: uuid.UUID | str) -> str:
    return f"tf:{{{queue_id}}}:ready"


def bucket_key(queue_id: uuid.UUID | str) -> str:
    return f"tf:{{{queue_id}}}:bucket"


def epoch_key(queue_id: uuid.UUID | str) -> str:
    """Set by a dispatcher; its absence means the queue's keys were lost."""
    return f"tf:{{{queue_id}}}:epoch"


def heartbeats_key(task_id: uuid.UUID | str) -> str:
    """Capped list of a task's recent heartbeat times (workers.heartbeats)."""
    return f"tf:{{{task_id}}}:hb"


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


def score(priority: int, scheduled_at: datetime) -> int:
    """Lower is handed out first: priority, then scheduled_at; ties by id (UUIDv7).

    Exact integer arithmetic, the same as tasks.sql.BUFFER_DUE computes it.
    """
    return priority * _PRIORITY_WEIGHT + (scheduled_at - _EPOCH) // _MS


# KEYS[1] ready set, KEYS[2] bucket; ARGV[1] how many at most, ARGV[2] rate
# per second (0: unlimited).  Returns {ids, wait_ms}: wait_ms > 0 when the
# bucket is empty and tells when the next token is due.
#
# A bucket of capacity R refilled at R/s hands out at most R*T + R tasks over
# any T seconds (API.md).  Time comes from the Redis server, so every API
# process shares one clock.
_TAKE = """
if redis.replicate_commands then redis.replicate_commands() end
local want = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
if rate <= 0 then
  local popped = redis.call('ZPOPMIN', KEYS[1], want)
  local ids = {}
  for i = 1, #popped, 2 do ids[#ids + 1] = popped[i] end
  return {ids, 0}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local state = redis.call('HMGET', KEYS[2], 'tokens', 'ts')
local tokens = tonumber(state[1])
local ts = tonumber(state[2])
if tokens == nil or ts == nil then
  tokens = rate
  ts = now
end
if now > ts then
  tokens = math.min(rate, tokens + (now - ts) * rate / 1000)
end
local take = math.min(want, math.floor(tokens))
local ids = {}
if take >= 1 then
  local popped = redis.call('ZPOPMIN', KEYS[1], take)
  for i = 1, #popped, 2 do ids[#ids + 1] = popped[i] end
  tokens = tokens - #ids
end
redis.call('HSET', KEYS[2], 'tokens', tostring(tokens), 'ts', tostring(now))
redis.call('PEXPIRE', KEYS[2], 3600000)
if #ids == 0 and tokens < 1 then
  return {ids, math.ceil((1 - tokens) * 1000 / rate)}
end
return {ids, 0}
"""


# What ZPOPMIN/ZPOPMAX answer without a score cast: (member, score) pairs.
_Scored = list[tuple[bytes | str, float]]


@dataclass(frozen=True, slots=True)
class Taken:
    ids: list[str]
    wait_ms: int  # > 0: rate-limited; try again after this long


class Buffer:
    """The per-queue dispatch buffer in Redis."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._take = client.register_script(_TAKE)

    def push(
        self, queue_id: uuid.UUID | str, items: Iterable[tuple[str, int]], *, wake: bool = False
    ) -> int:
        """Add `(task_id, score)` pairs; an id already there keeps its place.

        With `wake`, also tell waiting long polls, in the same round trip.
        """
        mapping = {task_id: task_score for task_id, task_score in items}
        if not mapping:
            return 0
        if not wake:
            # ZADD NX answers the number added (redis-py types it int | float | None).
            return cast(int, self.client.zadd(ready_key(queue_id), mapping, nx=True))
        if isinstance(self.client, RedisCluster):
            # A cluster pipeline refuses PUBLISH (it names no key): two round
            # trips, the set first so a woken claim finds the tasks.
            added = cast(int, self.client.zadd(ready_key(queue_id), mapping, nx=True))
            self.client.publish(WAKE_CHANNEL, str(queue_id))
            return added
        pipe = self.client.pipeline(transaction=False)
        pipe.zadd(ready_key(queue_id), mapping, nx=True)
        pipe.publish(WAKE_CHANNEL, str(queue_id))
        added, _ = pipe.execute()
        return int(added)

    def take(self, queue_id: uuid.UUID | str, limit: int, rate_limit: int | None) -> Taken:
        """Pop up to `limit` ids in order, as the queue's token bucket allows."""
        ids, wait_ms = self._take(
            keys=[ready_key(queue_id), bucket_key(queue_id)], args=[limit, rate_limit or 0]
        )
        return Taken([_text(i) for i in ids], int(wait_ms))

    def remove(self, queue_id: uuid.UUID | str, task_ids: Sequence[str]) -> int:
        if not task_ids:
            return 0
        return int(self.client.zrem(ready_key(queue_id), *task_ids))

    def present(self, queue_id: uuid.UUID | str, task_ids: Sequence[str]) -> list[bool]:
        """Which of `task_ids` are in the queue's set (one round trip)."""
        if not task_ids:
            return []
        scores = self.client.zmscore(ready_key(queue_id), list(task_ids))
        return [value is not None for value in scores]

    def pop_all(self, queue_id: uuid.UUID | str, limit: int = 100_000) -> list[str]:
        popped = self.client.zpopmin(ready_key(queue_id), limit)
        return [_text(member) for member, _ in cast(_Scored, popped)]

    def worst_score(self, queue_id: uuid.UUID | str) -> int | None:
        """Score of the least urgent buffered task, or None when empty."""
        last = self.client.zrange(ready_key(queue_id), -1, -1, withscores=True)
        return int(last[0][1]) if last else None

    def pop_worst(self, queue_id: uuid.UUID | str, count: int) -> list[str]:
        popped = self.client.zpopmax(ready_key(queue_id), count)
        return [_text(member) for member, _ in cast(_Scored, popped)]

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
            self.client.publish(WAKE_CHANNEL, names)

    def forget_queue(self, queue_id: uuid.UUID | str) -> None:
        self.client.delete(ready_key(queue_id), bucket_key(queue_id), epoch_key(queue_id))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


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
