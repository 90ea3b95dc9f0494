"""Bearer API keys: `Authorization: Bearer <key>`, looked up by SHA-256."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import Q
from django.utils import timezone
from rest_framework.authentication import BaseAuthentication
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request

from taskforge.api import revocation
from taskforge.api.models import ApiKey, hash_key
from taskforge.audit.log import Actor
from taskforge.lib.ttlcache import TTLCache

# last_used_at is for operators ("is this key still used?"); writing it on
# every request would turn each read into a write, so it is coarse.
LAST_USED_RESOLUTION = timedelta(minutes=1)


# Valid keys are remembered per process: every request would otherwise pay a
# query for the same row.  An entry counts only while the revocation epoch it
# was read in is current and the revocation listener is subscribed
# (`taskforge.api.revocation`), so a revoked key stops working in every
# process within a second.  KEY_CACHE_SECONDS bounds the rest: were the
# revocation's message lost on its way to a subscribed process (Redis
# unreachable from where the key was revoked), the key works there no longer.
# Unknown keys are never cached.
KEY_CACHE_SECONDS = 5.0
_key_cache: TTLCache[tuple[ApiKey, int]] = TTLCache(KEY_CACHE_SECONDS)


def _lookup(key_hash: str) -> ApiKey | None:
    epoch = revocation.listener.trusted_epoch()
    hit = _key_cache.get(key_hash)
    if hit is not None and epoch is not None and hit[1] == epoch:
        return hit[0]
    # Read after taking the epoch: a revocation that commits meanwhile moves
    # the epoch on, and this entry is not used again.
    api_key = ApiKey.objects.active().filter(key_hash=key_hash).first()
    if api_key is None or epoch is None:
        _key_cache.forget(key_hash)
    else:
        _key_cache.put(key_hash, (api_key, epoch))
    return api_key


def forget_cached_keys() -> None:
    """Drop every remembered key (tests, and after revoking in this process)."""
    _key_cache.clear()


class ApiPrincipal:
    """The caller behind a valid key, as `request.user`."""

    is_authenticated = True
    is_anonymous = False

    def __init__(self, key: ApiKey) -> None:
        self.key = key
        self.role = key.role

    @property
    def audit_actor(self) -> Actor:
        """Who acts in the audit log (taskforge.audit.log.of_request)."""
        return Actor.api_key(self.key.name)

    def __str__(self) -> str:
        return f"apikey:{self.key.name}"


class ApiKeyAuthentication(BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[ApiPrincipal, ApiKey] | None:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None
        scheme, _, key = header.partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            raise AuthenticationFailed("Use 'Authorization: Bearer <api key>'.")
        api_key = _lookup(hash_key(key))
        if api_key is None:
            raise AuthenticationFailed("Unknown or revoked API key.")
        self._touch(api_key)
        return ApiPrincipal(api_key), api_key

    def authenticate_header(self, request: Any) -> str:
        return 'Bearer realm="taskforge"'

    @staticmethod
    def _touch(api_key: ApiKey) -> None:
        now = timezone.now()
        stale = now - LAST_USED_RESOLUTION
        if api_key.last_used_at is None or api_key.last_used_at < stale:
            # Compare-and-set: concurrent requests write it once.
            ApiKey.objects.filter(
                Q(last_used_at__isnull=True) | Q(last_used_at__lt=stale), pk=api_key.pk
            ).update(last_used_at=now)
            api_key.last_used_at = now
