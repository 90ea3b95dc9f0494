"""Lists of IP networks given as text (`TASKFORGE_PUSH_*_NETWORKS`), and membership.

A list is comma-separated CIDRs (`127.0.0.0/8,::1/128`).  Each IPv4 network
also stands for its IPv4-mapped IPv6 form (`::ffff:127.0.0.0/104`): a socket
connected to `::ffff:127.0.0.1` reaches 127.0.0.1.  A list is parsed once per
text (settings rarely change; tests change them with the settings fixture).
"""

from __future__ import annotations

import functools
import ipaddress

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@functools.lru_cache(maxsize=32)
def parse(text: str) -> tuple[Network, ...]:
    """The networks of a comma-separated list of CIDRs, with the mapped forms added.

    Raises:
        ValueError: an entry is not a network in CIDR form (the message names it).
    """
    networks: list[Network] = []
    for entry in text.split(","):
        entry = entry.strip()
        if not entry:
            continue
        try:
            network = ipaddress.ip_network(entry, strict=True)
        except ValueError as exc:
            raise ValueError(
                f"{entry!r} is not a network in CIDR form (such as 127.0.0.0/8 or ::1/128): {exc}"
            ) from None
        networks.append(network)
        if isinstance(network, ipaddress.IPv4Network):
            networks.append(
                ipaddress.IPv6Network(f"::ffff:{network.network_address}/{96 + network.prefixlen}")
            )
    return tuple(networks)


def address(value: str | Address) -> Address:
    """An address from its text (an IPv6 zone, `%eth0`, is dropped).

    Raises:
        ValueError: not an IP address.
    """
    if isinstance(value, ipaddress.IPv4Address | ipaddress.IPv6Address):
        return value
    return ipaddress.ip_address(value.partition("%")[0])


def within(ip: Address, networks: tuple[Network, ...]) -> bool:
    """Whether `ip` is in one of `networks`."""
    return any(ip.version == network.version and ip in network for network in networks)
