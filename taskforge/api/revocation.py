"""Revocation within a second, in every API process (API.md v1.1 Authentication).

Each process remembers valid API keys for a while (`authentication`), and long
polls and event streams hold a request open for many seconds.  Revoking a key
in one process (a `manage.py` command, the Django admin) must reach all of
them: after the revoking transaction commits, `publish()` names the key on a
Redis pub/sub channel, and in every API process one listener thread

- moves the process's `epoch` on, so every remembered key is looked up again
  (`authentication` keeps a key only while the epoch it was read in is current);
- sets the Events of whoever watches that key (a long poll, `watch`), which
  then check the database, the truth, and end.

People are watched the same way (`user:<id>`): a dashboard stream ends when
its user is deactivated, loses staff status, is deleted or logs out.

A message can be lost while the listener is not subscribed (Redis down or
restarting, or a connection that died without a word).  So remembered keys
are trusted only while it is subscribed and Redis answers its pings on the
subscription, the epoch moves on at each (re)subscription, and losing the
subscription wakes every watcher to check the database itself.  Messages are hints: the
database says whether a key is revoked, so a stray message costs one lookup.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_logged_out
from django.db import transaction
from django.db.models.signals import post_delete, post_save

from taskforge.api.models import ApiKey
from taskforge.errors import TaskForgeError
from taskforge.lib import redisconn

logger = logging.getLogger(__name__)

_RECONNECT_DELAY = 0.5
# The listener pings Redis on its subscription this often, and gives the
# subscription up when nothing came back for SILENCE_SECONDS: a connection can
# die without a word (a partition), and messages would be lost unnoticed.
_PING_SECONDS = 0.5
SILENCE_SECONDS = 2.0


class KeyRevoked(TaskForgeError):
    """This API key was revoked."""

    code = "unauthenticated"
    status_code = 401


def key_topic(key_id: int) -> str:
    return f"key:{key_id}"


def user_topic(user_id: object) -> str:
    return f"user:{user_id}"


def channel() -> str:
    """The pub/sub channel; named after REDIS_URL's db, since channels are server-wide."""
    return redisconn.channel("tf:revoked", settings.REDIS_URL)


def _client() -> redisconn.Client:
    return redisconn.connect(settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=2)


class Listener:
    """This process's subscriber: the epoch, and the watchers of each topic."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watchers: dict[str, set[threading.Event]] = {}
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._subscribed = False
        self._heard_at = 0.0
        self.epoch = 0

    def trusted_epoch(self) -> int | None:
        """The current epoch while messages are arriving; None when one may be missed."""
        return self.epoch if self.subscribed() else None

    def subscribed(self) -> bool:
        """Subscribed, and Redis answered on the subscription within SILENCE_SECONDS."""
        self._ensure_started()
        return self._subscribed and time.monotonic() - self._heard_at < SILENCE_SECONDS

    @contextmanager
    def watch(self, topic: str, event: threading.Event) -> Iterator[None]:
        """Set `event` when `topic` is named, or when the subscription is lost."""
        self._ensure_started()
        with self._lock:
            self._watchers.setdefault(topic, set()).add(event)
        try:
            yield
        finally:
            with self._lock:
                events = self._watchers.get(topic)
                if events is not None:
                    events.discard(event)
                    if not events:
                        del self._watchers[topic]

    def deliver(self, topic: str) -> None:
        """A revocation named `topic`: forget remembered keys, wake its watchers."""
        with self._lock:
            self.epoch += 1
            events = list(self._watchers.get(topic, ()))
        for event in events:
            event.set()

    def _lost(self) -> None:
        with self._lock:
            self._subscribed = False
            self.epoch += 1
            events = [event for events in self._watchers.values() for event in events]
        for event in events:
            event.set()

    def _heard(self, message: dict[str, Any]) -> None:
        self._heard_at = time.monotonic()
        if message["type"] == "subscribe":
            with self._lock:
                self.epoch += 1  # anything before this may have been missed
                self._subscribed = True
        elif message["type"] == "message" and isinstance(message["data"], bytes):
            self.deliver(message["data"].decode())

    def _ensure_started(self) -> None:
        if self._thread is not None and self._pid == os.getpid() and self._thread.is_alive():
            return
        with self._lock:
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                self._pid = os.getpid()
                self._subscribed = False  # a forked child has no subscription yet
                self._thread = threading.Thread(
                    target=self._listen, name="taskforge-revocation", daemon=True
                )
                self._thread.start()

    def _listen(self) -> None:
        while True:
            client = None
            try:
                client = _client()
                pubsub = client.pubsub()
                pubsub.subscribe(channel())
                pinged_at = self._heard_at = time.monotonic()
                while True:
                    message = pubsub.get_message(timeout=_PING_SECONDS)
                    now = time.monotonic()
                    if message is not None:
                        self._heard(message)
                    if now - pinged_at >= _PING_SECONDS:
                        pubsub.ping()
                        pinged_at = now
                    if now - self._heard_at >= SILENCE_SECONDS:
                        raise redis.ConnectionError("no answer on the subscription")
            except Exception as exc:
                logger.warning("revocation.listener_error", extra={"error": repr(exc)})
                self._lost()
                time.sleep(_RECONNECT_DELAY)
            finally:
                if client is not None:
                    try:
                        client.close()
                    except Exception:
                        logger.debug("revocation.close_failed", exc_info=True)


listener = Listener()


def publish(topic: str) -> None:
    """Tell every API process that `topic` changed; call it after the change commits.

    If Redis cannot be reached from here, it usually cannot be from the API
    processes either, and a process that is not subscribed trusts nothing it
    remembers.  A process that still is keeps a revoked key at most
    `authentication.KEY_CACHE_SECONDS`; the failure is logged.
    """
    try:
        client = _client()
        try:
            client.publish(channel(), topic)
        finally:
            client.close()
    except redisconn.REDIS_FAILURES as exc:
        logger.warning("revocation.publish_failed", extra={"topic": topic, "error": repr(exc)})


def publish_on_commit(topic: str) -> None:
    transaction.on_commit(lambda: publish(topic))


# Saving a user with any of these (or all fields) may take away dashboard access.
_ACCESS_FIELDS = frozenset({"is_active", "is_staff", "is_superuser", "password"})


def _user_saved(sender: Any, instance: Any, update_fields: Any = None, **kwargs: Any) -> None:
    if update_fields is None or _ACCESS_FIELDS & set(update_fields):
        publish_on_commit(user_topic(instance.pk))


def _user_gone(sender: Any, instance: Any, **kwargs: Any) -> None:
    publish_on_commit(user_topic(instance.pk))


def _logged_out(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    if user is not None:
        publish_on_commit(user_topic(user.pk))


def connect_signals() -> None:
    """Name a user whose dashboard access may have ended (AppConfig.ready)."""
    user_model = get_user_model()
    post_save.connect(_user_saved, sender=user_model, dispatch_uid="taskforge-user-saved")
    post_delete.connect(_user_gone, sender=user_model, dispatch_uid="taskforge-user-gone")
    user_logged_out.connect(_logged_out, dispatch_uid="taskforge-logged-out")


def key_still_valid(key_id: int) -> Callable[[], bool]:
    """A check for a request held open: False once the key is revoked or gone."""
    return lambda: ApiKey.objects.filter(pk=key_id, revoked=False).exists()


@contextmanager
def watch_key(key_id: int | None, event: threading.Event) -> Iterator[Callable[[], bool]]:
    """While the block runs, `event` is set when the key may have been revoked;
    the check it yields says True once the key is revoked (a database lookup,
    made only after such a wake-up)."""
    if key_id is None:
        yield lambda: False
        return
    woken = threading.Event()
    valid = key_still_valid(key_id)

    def revoked() -> bool:
        if not woken.is_set():
            return False
        woken.clear()
        return not valid()

    with listener.watch(key_topic(key_id), woken), listener.watch(key_topic(key_id), event):
        if not listener.subscribed():
            woken.set()  # no messages yet: the first check looks in the database
        yield revoked
