"""OIDC ID tokens for push requests (API-cloudtasks.md "OIDC tokens").

A task with `oidcToken` carries a fresh RS256 ID token on each attempt,
signed with the deployment's key (`SigningKey`), made on first need and
shared by every process through Postgres.  Receivers verify it against
`/.well-known/jwks.json` (served by cloudtasks.views) with any standard
library.  Signing uses `cryptography` directly: a JWT is three base64url
parts, and the service needs nothing more of a JWT library.
"""

from __future__ import annotations

import base64
import os
import secrets
import threading
import time
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from django.db import IntegrityError, transaction

from taskforge.conf import conf
from taskforge.lib import jsonutil
from workers import sql
from workers.models import SigningKey

TOKEN_SECONDS = 3600
KEY_BITS = 2048
CLAIMS = ("aud", "email", "email_verified", "exp", "iat", "iss", "sub")

_lock = threading.Lock()
_key: tuple[str, rsa.RSAPrivateKey] | None = None


def issuer() -> str:
    """TASKFORGE_OIDC_ISSUER, else http://<TASKFORGE_BIND> with a wildcard host as localhost."""
    if conf.OIDC_ISSUER:
        return conf.OIDC_ISSUER.rstrip("/")
    bind = os.environ.get("TASKFORGE_BIND", "0.0.0.0:8080")  # nosec B104 - read, not bound
    host, _, port = bind.rpartition(":")
    if host in ("", "0.0.0.0", "::", "[::]", "*"):  # nosec B104 - a wildcard's name
        host = "localhost"
    return f"http://{host}:{port}"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def signing_key() -> tuple[str, rsa.RSAPrivateKey]:
    """The newest key (kid, private key), made and stored on first need."""
    global _key
    with _lock:
        if _key is not None:
            return _key
        row = SigningKey.objects.order_by("-created_at", "-id").first()
        if row is None:
            private = rsa.generate_private_key(public_exponent=65537, key_size=KEY_BITS)
            pem = private.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ).decode()
            try:
                with transaction.atomic():
                    # Two processes making the first key at once: a lock on the
                    # table's first row decides; the loser reads the winner's.
                    with transaction.get_connection().cursor() as cursor:
                        cursor.execute(sql.LOCK_SIGNING_KEYS)
                    row = SigningKey.objects.order_by("-created_at", "-id").first()
                    if row is None:
                        row = SigningKey.objects.create(kid=secrets.token_hex(8), private_pem=pem)
            except IntegrityError:
                row = SigningKey.objects.order_by("-created_at", "-id").first()
            assert row is not None
        private_key = serialization.load_pem_private_key(row.private_pem.encode(), password=None)
        assert isinstance(private_key, rsa.RSAPrivateKey)
        _key = (row.kid, private_key)
        return _key


def forget() -> None:
    """Read the key again at next use (tests)."""
    global _key
    with _lock:
        _key = None


def mint(*, audience: str, email: str, now: float | None = None) -> str:
    """A fresh ID token for one attempt."""
    kid, key = signing_key()
    issued = int(now if now is not None else time.time())
    header = {"alg": "RS256", "typ": "JWT", "kid": kid}
    claims = {
        "iss": issuer(),
        "aud": audience,
        "sub": email,
        "email": email,
        "email_verified": True,
        "iat": issued,
        "exp": issued + TOKEN_SECONDS,
    }
    signing_input = f"{_b64(jsonutil.dumps(header))}.{_b64(jsonutil.dumps(claims))}"
    signature = key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
    return f"{signing_input}.{_b64(signature)}"


def jwks() -> dict[str, Any]:
    """Every key whose tokens may still be valid, as a JWK Set."""
    keys = []
    for row in SigningKey.objects.order_by("-created_at", "-id"):
        public = serialization.load_pem_private_key(
            row.private_pem.encode(), password=None
        ).public_key()
        assert isinstance(public, rsa.RSAPublicKey)
        numbers = public.public_numbers()
        keys.append(
            {
                "kty": "RSA",
                "kid": row.kid,
                "use": "sig",
                "alg": "RS256",
                "n": _b64(numbers.n.to_bytes((numbers.n.bit_length() + 7) // 8, "big")),
                "e": _b64(numbers.e.to_bytes((numbers.e.bit_length() + 7) // 8, "big")),
            }
        )
    return {"keys": keys}


def configuration() -> dict[str, Any]:
    """The OpenID Provider metadata receivers read."""
    iss = issuer()
    return {
        "issuer": iss,
        "jwks_uri": f"{iss}/.well-known/jwks.json",
        "id_token_signing_alg_values_supported": ["RS256"],
        "response_types_supported": ["id_token"],
        "subject_types_supported": ["public"],
        "claims_supported": list(CLAIMS),
    }
