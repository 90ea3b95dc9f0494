"""A queue's push target (API.md v1.1 `push`): what it may say, and how requests are signed.

`Queue.push` is NULL (workers pull) or the JSON object `parse` accepts:
`{"url", "timeout_seconds", "headers"}`, stored with its defaults filled in.
The push processes (`workers.pusher`) deliver the tasks of such queues; this
module is the one place that says what a target may be, so the API, the
admin, `createqueue` and the pusher agree, and what of it anyone but an admin
key may see (`redacted`, `unredacted`, `scrubbed`: API.md v1.2 "Secrets in push
settings").

Where a request may go (API.md "Security (v1.2)"): never to an address in
TASKFORGE_PUSH_BLOCKED_NETWORKS unless it is in TASKFORGE_PUSH_ALLOWED_NETWORKS
(`address_allowed`).  Where a URL is set, `check_url` refuses one whose host
is a literal address so blocked; at delivery the sender checks the address it
connects to (`workers.destinations`).  Both are functions of a URL or an
address, not of a queue, so a task's own target can be checked the same way.

The signature a receiver verifies: `TaskForge-Signature: t=<unix seconds>,
v1=<hex HMAC-SHA256 of "<t>.<body bytes>">` keyed with
TASKFORGE_PUSH_SIGNING_SECRET (`signature`; receivers check it with the SDK's
`taskforge_client.push.verify_signature`, docs/push.md).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from yarl import URL

from taskforge.conf import conf
from taskforge.lib import netblocks

DEFAULT_TIMEOUT_SECONDS = 30
MAX_TIMEOUT_SECONDS = 1800
MAX_HEADERS = 20
MAX_URL_LENGTH = 2048
MAX_HEADER_VALUE_LENGTH = 8192

# Headers a queue may not set: hop-by-hop ones (RFC 9110 7.6.1), and those the
# push process writes itself for the request to be well-formed (API.md).
FORBIDDEN_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "host",
    }
)

# The headers every push request carries; they win over a queue's header of the same name.
TASK_ID_HEADER = "TaskForge-Task-Id"
QUEUE_HEADER = "TaskForge-Queue"
ATTEMPT_HEADER = "TaskForge-Attempt"
SIGNATURE_HEADER = "TaskForge-Signature"

# An HTTP field name (RFC 9110 5.1: a token).
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# Control characters a field value may not hold (HTAB is allowed).
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
# A part of a host in a numeric IPv4 form (decimal, octal 0..., hex 0x...), as
# URL parsers and the C library read it ("ends in a number": WHATWG URL 3.5).
_NUMBER = re.compile(r"0[xX][0-9a-fA-F]*|[0-9]+")
_FIELDS = frozenset({"url", "timeout_seconds", "headers"})


class InvalidPush(ValueError):
    """A push target TaskForge refuses; the message says why, for a person."""


class DestinationNotAllowed(InvalidPush):
    """A push URL whose host is an address push requests may not reach."""


@dataclass(frozen=True, slots=True)
class PushTarget:
    url: str
    timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS
    headers: dict[str, str] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "timeout_seconds": self.timeout_seconds,
            "headers": dict(self.headers),
        }


def parse(value: Any) -> PushTarget:
    """The target an API body's `push` object describes.

    Raises:
        InvalidPush: not an object of the documented form.
    """
    if not isinstance(value, dict):
        raise InvalidPush("Expected null or an object with 'url'.")
    unknown = sorted(set(value) - _FIELDS)
    if unknown:
        raise InvalidPush(f"Unknown field {unknown[0]!r}.")
    if "url" not in value:
        raise InvalidPush("'url' is required.")
    return _target(value, check_url(value["url"]))


def target_of(stored: Any) -> PushTarget | None:
    """The target of a queue's stored `push` value (None: the queue is pulled).

    The URL is taken as stored, its destination not judged: the rules or the
    settings may have changed since it was set, and the sender checks the
    address it connects to anyway.
    """
    if stored is None:
        return None
    return _target(stored, str(stored["url"]))


def _target(value: dict[str, Any], url: str) -> PushTarget:
    return PushTarget(
        url=url,
        timeout_seconds=_timeout(value.get("timeout_seconds", DEFAULT_TIMEOUT_SECONDS)),
        headers=_headers(value.get("headers", {})),
    )


def check_url(value: Any) -> str:
    """A push URL as given, if TaskForge may send requests to it (where a URL is set).

    Besides its form: a host that is a literal address (`10.0.0.5`,
    `[fd00::5]`) must be one `address_allowed` allows; a host in another
    numeric IPv4 form (`2130706433`, `0x7f000001`, `0177.0.0.1`, `127.1`) is
    refused, naming the address it stands for.  A host name is judged at
    each delivery, by the address it resolves to then.

    Raises:
        InvalidPush: not an http(s) URL with a host, or one with spaces or
            control characters.
        DestinationNotAllowed: its host is a blocked address.
    """
    url = _url(value)
    host = _host(url)
    ip = _literal_address(host)
    if ip is not None and not address_allowed(ip):
        raise DestinationNotAllowed(
            f"'url': push requests may not be sent to {ip} "
            "(TASKFORGE_PUSH_BLOCKED_NETWORKS; TASKFORGE_PUSH_ALLOWED_NETWORKS allows exceptions)."
        )
    return url


def address_allowed(address: str | netblocks.Address) -> bool:
    """Whether a push request may connect to `address`: not in a blocked network,
    or in an allowed one (each IPv4 network also in its IPv4-mapped IPv6 form).

    Raises:
        ValueError: `address` is not an IP address.
    """
    ip = netblocks.address(address)
    if netblocks.within(ip, netblocks.parse(conf.PUSH_ALLOWED_NETWORKS)):
        return True
    return not netblocks.within(ip, netblocks.parse(conf.PUSH_BLOCKED_NETWORKS))


def _host(url: str) -> str:
    """The host a URL's request connects to, as the HTTP client reads it (IDNA applied:
    full-width digits are read as the ASCII ones)."""
    try:
        host = URL(url).raw_host
    except (ValueError, UnicodeError) as exc:
        raise InvalidPush("'url' is not a valid URL.") from exc
    if not host:
        raise InvalidPush("'url' must name a host.")
    return host


def _literal_address(host: str) -> netblocks.Address | None:
    """The address a host is literally (None: a name to resolve).

    Raises:
        InvalidPush: a numeric IPv4 form other than the dotted quad.
    """
    if ":" in host:
        try:
            return netblocks.address(host)
        except ValueError as exc:
            raise InvalidPush(f"'url': {host!r} is not an IPv6 address.") from exc
    parts = host.split(".")
    if len(parts) > 1 and not parts[-1]:
        parts.pop()  # a trailing dot
    if not _NUMBER.fullmatch(parts[-1]):
        return None
    try:
        return ipaddress.IPv4Address(host)
    except ValueError:
        pass
    meant = _ipv4_number(parts)
    raise InvalidPush(
        f"'url': the host {host!r} is not an IPv4 address in dotted-quad form (a.b.c.d)"
        + (f"; it would mean {meant}." if meant else ".")
    )


def _ipv4_number(parts: list[str]) -> ipaddress.IPv4Address | None:
    """The address a legacy numeric IPv4 host names (`inet_aton`'s forms), or None."""
    if len(parts) > 4 or not all(_NUMBER.fullmatch(part) for part in parts):
        return None
    numbers = []
    for part in parts:
        if part[:2].lower() == "0x":
            numbers.append(int(part[2:] or "0", 16))
        elif len(part) > 1 and part.startswith("0"):
            if not set(part) <= set("01234567"):
                return None
            numbers.append(int(part, 8))
        else:
            numbers.append(int(part))
    *head, last = numbers
    if any(n > 255 for n in head) or last >= 256 ** (4 - len(head)):
        return None
    value = last
    for index, n in enumerate(head):
        value += n << (8 * (3 - index))
    return ipaddress.IPv4Address(value)


def _url(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidPush("'url' must be an http or https URL.")
    if len(value) > MAX_URL_LENGTH:
        raise InvalidPush(f"'url' is longer than {MAX_URL_LENGTH} characters.")
    # A space, a tab or any control character (C0, DEL, C1), or other white space:
    # URL parsers drop or split on them, so the URL sent would not be the one shown.
    if any(char.isspace() or unicodedata.category(char) == "Cc" for char in value):
        raise InvalidPush("'url' may not contain spaces, tabs or control characters.")
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 (raises ValueError for a port out of range)
    except ValueError as exc:
        raise InvalidPush("'url' is not a valid URL.") from exc
    if parts.scheme not in ("http", "https"):
        raise InvalidPush("'url' must start with http:// or https://.")
    if not parts.hostname:
        raise InvalidPush("'url' must name a host.")
    if parts.fragment:
        raise InvalidPush("'url' may not have a fragment (#...).")
    return value


def _timeout(value: Any) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (isinstance(value, float) and not value.is_integer())
    ):
        raise InvalidPush("'timeout_seconds' must be an integer.")
    if not 1 <= value <= MAX_TIMEOUT_SECONDS:
        raise InvalidPush(f"'timeout_seconds' must be between 1 and {MAX_TIMEOUT_SECONDS}.")
    return int(value)


def _headers(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise InvalidPush("'headers' must be an object of header names to string values.")
    if len(value) > MAX_HEADERS:
        raise InvalidPush(f"'headers' may hold at most {MAX_HEADERS} headers.")
    seen: set[str] = set()
    for name, text in value.items():
        if not _TOKEN.fullmatch(name):
            raise InvalidPush(f"Header name {name!r} is not a valid HTTP header name.")
        lower = name.lower()
        if lower in FORBIDDEN_HEADERS:
            raise InvalidPush(
                f"Header {name!r} may not be set (TaskForge sets it, or it is hop-by-hop)."
            )
        if lower in seen:
            raise InvalidPush(f"Header {name!r} is given twice.")
        seen.add(lower)
        if not isinstance(text, str):
            raise InvalidPush(f"Header {name!r}: the value must be a string.")
        if _CONTROL.search(text):
            raise InvalidPush(
                f"Header {name!r}: the value may not contain CR, LF or control characters."
            )
        if len(text) > MAX_HEADER_VALUE_LENGTH:
            raise InvalidPush(
                f"Header {name!r}: the value is longer than {MAX_HEADER_VALUE_LENGTH}."
            )
        try:
            text.encode("latin-1")
        except UnicodeEncodeError as exc:
            raise InvalidPush(f"Header {name!r}: the value must be Latin-1 text.") from exc
    return dict(value)


def display_url(url: str) -> str:
    """The URL without what may be a secret (user info, query): for pages and logs."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def signature(secret: str, body: bytes, timestamp: int) -> str:
    """The `TaskForge-Signature` value of a request body sent at `timestamp` (Unix seconds)."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


# Redaction (API.md v1.2 "Secrets in push settings") ---------------------------------
#
# A target's header values and its URL's user info and query may be credentials.
# Admin keys get them through the API; everyone and everything else (producer and
# worker keys, the dashboard, Django admin, the audit log, the logs) sees the
# target as `redacted` makes it.  A form shows that form and takes it back
# (`unredacted`), so a value left as shown keeps the stored secret.

REDACTED = "[redacted]"
# Pieces of a secret shorter than this are not scrubbed out of free text: they
# would cut up every error excerpt (an `X-Env: a` header) and hide nothing.
MIN_SCRUBBED_CHARS = 4


def redacted(stored: Any) -> Any:
    """A stored `push` value as anyone but an admin key sees it: each header value
    `[redacted]`, the URL as `scheme://host[:port]/path`.  Idempotent; None and
    values that are not targets are returned as they are (an audit entry's old value)."""
    if not isinstance(stored, dict):
        return stored
    shown = dict(stored)
    if "url" in stored:
        shown["url"] = _redacted_url(stored["url"])
    if isinstance(stored.get("headers"), dict):
        shown["headers"] = dict.fromkeys(stored["headers"], REDACTED)
    return shown


def _redacted_url(url: Any) -> str:
    if not isinstance(url, str):
        return REDACTED
    try:
        return display_url(url)
    except ValueError:  # not a URL TaskForge stores; say nothing of it
        return REDACTED


def unredacted(posted: PushTarget, stored: Any) -> PushTarget:
    """The target a form means when it sends back what `redacted` showed it.

    A header value `[redacted]` keeps the stored value of that header (names
    compare as HTTP does, without case); a URL equal to the stored one as shown
    keeps the stored URL, user info and query included.  Anything typed anew
    replaces what was stored.

    Raises:
        InvalidPush: a `[redacted]` header value with no stored value to keep.
    """
    before = target_of(stored) if isinstance(stored, dict) else None
    url = posted.url
    if before is not None and url == _redacted_url(before.url):
        url = before.url
    kept = {name.lower(): value for name, value in (before.headers if before else {}).items()}
    headers: dict[str, str] = {}
    for name, value in posted.headers.items():
        if value == REDACTED:
            if name.lower() not in kept:
                raise InvalidPush(
                    f"Header {name!r}: {REDACTED} keeps a stored value, and there is none; "
                    "type the value."
                )
            value = kept[name.lower()]
        headers[name] = value
    return PushTarget(url=url, timeout_seconds=posted.timeout_seconds, headers=headers)


def scrubbed(text: str, target: PushTarget) -> str:
    """`text` (an error, a log field) without the target's secrets: its header values
    and its URL's user info and query, as written and as percent-encoding changes
    them (an HTTP library quotes the URL it names in its errors)."""
    parts = urlsplit(target.url)
    pieces = [*target.headers.values(), parts.username, parts.password, parts.query]
    # Each query value too (not the names: `token` is no secret), in case the
    # library reorders or re-encodes the query it shows.
    pieces.extend(pair.partition("=")[2] for pair in parts.query.split("&"))
    secrets: set[str] = set()
    for piece in pieces:
        if not piece:
            continue
        plain = unquote(piece)
        secrets.update({piece, plain, quote(plain, safe="!$&'()*+,;=:@/?~")})
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= MIN_SCRUBBED_CHARS:
            text = text.replace(secret, REDACTED)
    return text
