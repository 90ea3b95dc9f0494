"""API keys: only the SHA-256 of a key is stored."""

from __future__ import annotations

import hashlib
import secrets

from django.db import models

KEY_PREFIX = "tf_"


class Role(models.TextChoices):
    PRODUCER = "producer"
    WORKER = "worker"
    ADMIN = "admin"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class ApiKeyQuerySet(models.QuerySet["ApiKey"]):
    def active(self) -> ApiKeyQuerySet:
        return self.filter(revoked=False)


class ApiKey(models.Model):
    name = models.CharField(max_length=200)
    role = models.CharField(max_length=16, choices=Role.choices)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked = models.BooleanField(default=False)

    objects = ApiKeyQuerySet.as_manager()

    class Meta:
        verbose_name = "API key"
        constraints = [
            models.CheckConstraint(condition=models.Q(role__in=Role.values), name="apikey_role")
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.role})"

    @classmethod
    def issue(cls, name: str, role: str) -> tuple[ApiKey, str]:
        """Create a key; return the row and the key itself, which is never stored."""
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        return cls.objects.create(name=name, role=role, key_hash=hash_key(key)), key
