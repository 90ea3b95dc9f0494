"""For a push target (a receiver of TaskForge's push delivery): check a request's signature.

TaskForge signs each push request when `TASKFORGE_PUSH_SIGNING_SECRET` is set:
`TaskForge-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body bytes>">`.
A receiver checks it over the raw body, before parsing it:

    from taskforge_client.push import verify_signature

    if not verify_signature(secret, request.headers.get("TaskForge-Signature", ""), body):
        return 401

Standard library only, like the rest of the SDK.
"""

from __future__ import annotations

import hashlib
import hmac
import time

SIGNATURE_HEADER = "TaskForge-Signature"
# How far the signing time may be from the receiver's clock (replays of old requests fail).
DEFAULT_TOLERANCE_SECONDS = 300


def verify_signature(
    secret: str,
    header: str,
    body: bytes,
    *,
    now: float | None = None,
    tolerance: float = DEFAULT_TOLERANCE_SECONDS,
) -> bool:
    """Does `header` (the TaskForge-Signature value) sign `body` with `secret`, recently?"""
    fields = dict(part.strip().split("=", 1) for part in header.split(",") if "=" in part)
    try:
        timestamp = int(fields["t"])
    except (KeyError, ValueError):
        return False
    if abs((time.time() if now is None else now) - timestamp) > tolerance:
        return False
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return hmac.compare_digest(mac.hexdigest(), fields.get("v1", ""))
