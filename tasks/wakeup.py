"""Long-poll wake-ups: one Redis subscriber thread per API process.

A claim that found nothing registers interest in its queues and waits on an
Event.  The dispatcher publishes the ids of queues it just filled on
`tf:wake:<db>`; this process's listener thread sets the Events of every waiter on
those queues, so a waiting claim tries again within milliseconds without
polling Postgres.  While the listener is subscribed (`listening()`), a
waiter that was not woken looks again only every few seconds (a message
lost in a reconnect costs at most that); while it is not, every second.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from taskforge.lib.redisconn import subscriber
from tasks.buffer import get_client, wake_channel

logger = logging.getLogger(__name__)

_RECONNECT_DELAY = 1.0
# Woken besides one claim per task that arrived: a woken claim whose client
# just hung up hands out nothing, and the others would look only on their own.
SPARE_WAKEUPS = 2


class Waiters:
    """Events keyed by queue id; the listener thread sets them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Insertion-ordered: the claims that have waited longest come first.
        self._by_queue: dict[str, dict[threading.Event, None]] = {}
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._subscribed = False

    @contextmanager
    def interest(self, queue_ids: Iterable[str]) -> Iterator[threading.Event]:
        """Register an Event for `queue_ids` for the duration of the block.

        Register before looking for work, so a wake-up that lands between the
        look and the wait is not missed.
        """
        self._ensure_listener()
        event = threading.Event()
        keys = [str(q) for q in queue_ids]
        with self._lock:
            for key in keys:
                self._by_queue.setdefault(key, {})[event] = None
        try:
            yield event
        finally:
            with self._lock:
                for key in keys:
                    events = self._by_queue.get(key)
                    if events is not None:
                        events.pop(event, None)
                        if not events:
                            del self._by_queue[key]

    def notify(self, entries: Iterable[str]) -> None:
        """Wake waiting claims: `<queue-id>` wakes all of the queue's, and
        `<queue-id>:<n>` (n tasks arrived) the n + SPARE_WAKEUPS that have waited
        longest and are not awake already."""
        chosen: list[threading.Event] = []
        with self._lock:
            for entry in entries:
                queue_id, _, count = entry.partition(":")
                events = self._by_queue.get(queue_id)
                if not events:
                    continue
                if not count.isdigit():
                    chosen.extend(events)
                    continue
                budget = int(count) + SPARE_WAKEUPS
                for event in events:
                    if budget <= 0:
                        break
                    if not event.is_set():
                        chosen.append(event)
                        budget -= 1
        for event in chosen:
            event.set()

    def listening(self) -> bool:
        """Is this process's listener subscribed (so wake-ups arrive)?"""
        return self._subscribed and self._pid == os.getpid()

    def _ensure_listener(self) -> None:
        if self._thread is not None and self._thread.is_alive() and self._pid == os.getpid():
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive() or self._pid != os.getpid():
                self._pid = os.getpid()
                self._thread = threading.Thread(
                    target=self._listen, name="taskforge-wakeup", daemon=True
                )
                self._thread.start()

    def _listen(self) -> None:
        while True:
            pubsub = None
            try:
                pubsub = subscriber(get_client())
                pubsub.subscribe(wake_channel())
                self._subscribed = True
                while True:
                    message = pubsub.get_message(timeout=5.0)
                    if message is None:
                        continue
                    data = message.get("data")
                    if isinstance(data, bytes):
                        self.notify(data.decode().split(","))
            except Exception as exc:
                self._subscribed = False
                logger.warning("wakeup.listener_error", extra={"error": repr(exc)})
                time.sleep(_RECONNECT_DELAY)
            finally:
                if pubsub is not None:
                    try:
                        pubsub.close()
                    except Exception:
                        logger.debug("wakeup.close_failed", exc_info=True)


waiters = Waiters()
