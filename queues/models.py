"""Queues: named lanes with their own retry budget, rate limit, concurrency cap,
push target and pause flag."""

from __future__ import annotations

import re
import uuid

from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q

from taskforge.lib.names import as_sent_problem

QUEUE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"
_QUEUE_NAME_RE = re.compile(QUEUE_NAME_PATTERN)
MAX_RETRIES_LIMIT = 100
MAX_CONCURRENCY_LIMIT = 100_000
# Fairness keys (API.md "Fairness keys (v1.2)"): a key's length in code points,
# a weight's range, and how many weights a queue may list.
FAIRNESS_KEY_MAX_LENGTH = 200
KEY_WEIGHT_MAX = 100
KEY_WEIGHTS_MAX_ENTRIES = 1000


def fairness_key_problem(text: str) -> str | None:
    """Why `text` cannot be a fairness key (1..200 code points taken as sent), or None."""
    if not 1 <= len(text) <= FAIRNESS_KEY_MAX_LENGTH:
        return f"A fairness key is 1 to {FAIRNESS_KEY_MAX_LENGTH} characters."
    return as_sent_problem(text)


def is_queue_name(text: str) -> bool:
    """True for a name a queue can have (API.md: 1..100 of A-Z a-z 0-9 _ . -)."""
    return _QUEUE_NAME_RE.fullmatch(text) is not None


class Queue(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(
        max_length=100, unique=True, validators=[RegexValidator(QUEUE_NAME_PATTERN)]
    )
    max_retries = models.PositiveSmallIntegerField(
        default=3, validators=[MinValueValidator(0), MaxValueValidator(MAX_RETRIES_LIMIT)]
    )
    # Tasks handed out per second across all API processes; NULL is unlimited.
    # A fraction (0.5: one every 2 s) comes from the Cloud Tasks API; the native
    # API still takes an integer >= 1 (API.md v1.2).
    rate_limit = models.FloatField(null=True, blank=True)
    # Tasks executing at once across all API processes; NULL is unlimited.
    # Enforced in Redis by the claim's take (tasks.buffer, tasks.concurrency).
    max_concurrency = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_CONCURRENCY_LIMIT)],
    )
    # NULL: workers pull the tasks (/workers/claim); else the push target
    # (queues.push: {"url", "timeout_seconds", "headers"}) the push processes
    # deliver them to, and claims skip the queue.
    push = models.JSONField(null=True, blank=True, default=None)
    paused = models.BooleanField(default=False)
    # NULL: the deployment's retry rule; else queues.retrypolicy's JSON form.
    retry_policy = models.JSONField(null=True, blank=True, default=None)
    # Cloud Tasks' maxAttempts when `max_retries` cannot say it (-1: unlimited, or
    # above 101; `max_retries` then holds its cap); NULL: max_retries + 1.
    max_attempts = models.IntegerField(null=True, blank=True)
    # When the queue was last purged (Cloud Tasks' purgeTime).
    purged_at = models.DateTimeField(null=True, blank=True)
    # Cloud Tasks' stackdriverLoggingConfig.samplingRatio: stored and shown only.
    logging_sampling_ratio = models.FloatField(null=True, blank=True)
    # Fairness keys (API.md v1.2): weights by key ({"key": 1..100}), and the
    # cap and rate each key gets on top of the queue's own (NULL: none).
    key_weights = models.JSONField(default=dict, blank=True)
    key_max_concurrency = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_CONCURRENCY_LIMIT)],
    )
    key_rate_limit = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(max_retries__gte=0, max_retries__lte=MAX_RETRIES_LIMIT),
                name="queue_max_retries_range",
            ),
            models.CheckConstraint(
                condition=Q(rate_limit__isnull=True) | Q(rate_limit__gt=0),
                name="queue_rate_limit_positive",
            ),
            models.CheckConstraint(
                condition=Q(max_concurrency__isnull=True)
                | Q(max_concurrency__gte=1, max_concurrency__lte=MAX_CONCURRENCY_LIMIT),
                name="queue_max_concurrency_range",
            ),
            models.CheckConstraint(
                condition=Q(key_max_concurrency__isnull=True)
                | Q(key_max_concurrency__gte=1, key_max_concurrency__lte=MAX_CONCURRENCY_LIMIT),
                name="queue_key_max_concurrency_range",
            ),
            models.CheckConstraint(
                condition=Q(key_rate_limit__isnull=True) | Q(key_rate_limit__gt=0),
                name="queue_key_rate_limit_positive",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def attempts_allowed(self) -> int:
        """Cloud Tasks' maxAttempts: -1 (unlimited) or how many attempts a task gets."""
        return self.max_attempts if self.max_attempts is not None else self.max_retries + 1

    @property
    def shown_max_retries(self) -> int | None:
        """`max_retries` as answers show it: null when maxAttempts is unlimited or over 101."""
        if self.max_attempts is not None and (self.max_attempts < 0 or self.max_attempts > 101):
            return None
        return self.max_retries

    @property
    def is_push(self) -> bool:
        """Are this queue's tasks delivered by the push processes (not claimed)?"""
        return self.push is not None
