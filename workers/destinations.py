"""Where a push request may connect: the push sender's aiohttp connector (API.md Security v1.2).

The rule is `queues.push.address_allowed`; this module applies it to the
address each connection is actually made to, through aiohttp's public hooks:

- `GuardedResolver` wraps aiohttp's default resolver: a host name is resolved
  at each new connection (the connector keeps no DNS cache) and the blocked
  addresses are dropped from the answer; when none is left, the lookup fails
  with `DestinationNotAllowed` and nothing is connected.  The connector
  connects to the addresses that answer holds, so no second lookup can give
  another one (DNS rebinding).
- `guarded_socket`, the connector's socket factory, sees the address of every
  connection attempt (a literal address in the URL never reaches a resolver)
  and refuses a blocked one before a socket exists.

Either way the request fails with an `aiohttp.ClientConnectorError` whose
`os_error` is the `DestinationNotAllowed`; `refused_destination` finds it.
"""

from __future__ import annotations

import socket
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from queues import push


class DestinationNotAllowed(OSError):
    """A push request would connect to an address it may not reach."""

    def __init__(self, addresses: list[str]) -> None:
        self.addresses = addresses
        super().__init__(f"destination not allowed: {', '.join(addresses)}")


class GuardedResolver(AbstractResolver):
    """aiohttp's default resolver, answering only addresses push requests may reach."""

    def __init__(self, inner: AbstractResolver | None = None) -> None:
        self._inner = inner if inner is not None else DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        answers = await self._inner.resolve(host, port, family)
        allowed = [answer for answer in answers if push.address_allowed(answer["host"])]
        if not allowed:
            raise DestinationNotAllowed(list(dict.fromkeys(a["host"] for a in answers)))
        return allowed

    async def close(self) -> None:
        await self._inner.close()


def guarded_socket(addr_info: tuple[Any, ...]) -> socket.socket:
    """A socket for one connection attempt (aiohappyeyeballs' AddrInfoType), if its
    address may be reached; as aiohttp would make it otherwise."""
    family, type_, proto, _, sockaddr = addr_info
    if not push.address_allowed(sockaddr[0]):
        raise DestinationNotAllowed([sockaddr[0]])
    return socket.socket(family=family, type=type_, proto=proto)


def connector(
    limit: int, resolver: AbstractResolver | None = None
) -> tuple[aiohttp.TCPConnector, GuardedResolver]:
    """A connector for push requests, and its resolver (the caller closes it after the
    connector: a connector does not close a resolver it was given)."""
    guarded = GuardedResolver(resolver)
    return (
        aiohttp.TCPConnector(
            limit=limit,
            resolver=guarded,
            # Resolved at each new connection: a cached answer would be checked
            # once and connected to for a minute.
            use_dns_cache=False,
            socket_factory=guarded_socket,
        ),
        guarded,
    )


def refused_destination(exc: BaseException) -> DestinationNotAllowed | None:
    """The `DestinationNotAllowed` a failed request ended with, if it did."""
    if isinstance(exc, aiohttp.ClientConnectorError) and isinstance(
        exc.os_error, DestinationNotAllowed
    ):
        return exc.os_error
    return None
