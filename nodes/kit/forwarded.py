"""Who the client is behind reverse proxies: ``X-Forwarded-For``, trusted hop by hop.

A daemon behind the door (``nodes/entry``, ``deploy/Caddyfile``) sees every
request come from the door's address. The door says who its client was in
``X-Forwarded-For``; but so can any client, by sending the header itself. So
the header is read only when the TCP peer is a *trusted proxy* (an address or
CIDR the operator named), and then walked from the right: each proxy appends
the address it saw, so the rightmost entries were written by our own proxies
and the first untrusted one, reading right to left, is the client. Anything to
its left was written by the client (or a proxy of the client's) and is never
believed. This is the rule of Caddy's ``trusted_proxies`` with
``client_ip_headers X-Forwarded-For`` and of nginx's ``real_ip_recursive on``.

Used by app-node's rate limits and login throttle (the client's address) and
by the entry point (what it appends). Pure functions: no I/O.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator
from pydantic_settings import NoDecode

from p2p.daemon import split_list

__all__ = ["ProxyList", "TrustedProxies", "client_address", "forwarded_for"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: Entries of ``X-Forwarded-For`` read at most (a longer chain is a client's
#: invention: our own proxies add one each).
MAX_HOPS = 32


def _parse_ip(text: str) -> IPAddress | None:
    try:
        address = ipaddress.ip_address(text.strip())
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped  # ::ffff:10.0.0.1 is 10.0.0.1
    return address


class TrustedProxies:
    """The addresses and networks whose ``X-Forwarded-For`` is believed.

    Args:
        entries: IP addresses or CIDRs (``127.0.0.1``, ``10.0.0.0/8``, ``::1``).

    Raises:
        ValueError: an entry that is neither, naming it.
    """

    def __init__(self, entries: Iterable[str] = ()) -> None:
        networks: list[IPNetwork] = []
        for entry in entries:
            try:
                networks.append(ipaddress.ip_network(entry.strip(), strict=False))
            except ValueError:
                raise ValueError(f"trusted proxy {entry!r} is not an IP address or CIDR "
                                 "(e.g. 127.0.0.1 or 10.0.0.0/8)") from None
        self.networks: tuple[IPNetwork, ...] = tuple(networks)

    def __bool__(self) -> bool:
        return bool(self.networks)

    def __contains__(self, address: object) -> bool:
        if isinstance(address, str):
            address = _parse_ip(address)
        if not isinstance(address, ipaddress.IPv4Address | ipaddress.IPv6Address):
            return False
        return any(address in network for network in self.networks)


def _check_proxies(value: tuple[str, ...]) -> tuple[str, ...]:
    TrustedProxies(value)  # raises naming the bad entry
    return tuple(part.strip() for part in value)


#: A settings field: IP addresses or CIDRs, as a JSON array or comma-separated.
ProxyList = Annotated[tuple[str, ...], NoDecode, BeforeValidator(split_list),
                      AfterValidator(_check_proxies)]


def _hops(values: Sequence[bytes | str]) -> list[str]:
    hops: list[str] = []
    for value in values:
        text = value.decode("latin-1") if isinstance(value, bytes) else value
        hops.extend(part.strip() for part in text.split(","))
    return hops


def client_address(peer: str | None, forwarded: Sequence[bytes | str],
                   trusted: TrustedProxies) -> str | None:
    """The client's address: ``peer``, or what trusted proxies say it was.

    Args:
        peer: the TCP peer's address (None: unknown, e.g. a Unix socket).
        forwarded: every ``X-Forwarded-For`` header value, in order.
        trusted: the proxies whose header is believed.

    Returns:
        The rightmost address of the chain ``forwarded + [peer]`` that is not a
        trusted proxy; the leftmost trusted one if all are (a request made by a
        proxy's host itself); ``peer`` when the peer is not trusted, whatever
        the header says. An entry that is not an IP address ends the walk: the
        hop to its right (a trusted proxy) is the client, since nothing it
        vouched for can be read.
    """
    if peer is None:
        return None
    peer_ip = _parse_ip(peer)
    if peer_ip is None or peer_ip not in trusted:
        return str(peer_ip) if peer_ip is not None else peer
    current = peer_ip
    hops = _hops(forwarded)
    for hop in reversed(hops[-MAX_HOPS:]):
        address = _parse_ip(hop)
        if address is None:
            break
        current = address
        if address not in trusted:
            break
    return str(current)


def forwarded_for(peer: str | None, forwarded: Sequence[bytes | str],
                  trusted: TrustedProxies) -> str | None:
    """The ``X-Forwarded-For`` a proxy sends on: the chain it may believe, plus ``peer``.

    From an untrusted peer: ``peer`` alone (a client's own header is dropped,
    so it can never pose as a proxy's word). From a trusted one: the header's
    entries it vouched for (the walk of :func:`client_address`, from the client
    to the right) followed by ``peer``. None when the peer is unknown.
    """
    if peer is None:
        return None
    peer_ip = _parse_ip(peer)
    if peer_ip is None or peer_ip not in trusted:
        return str(peer_ip) if peer_ip is not None else peer
    kept: list[str] = []
    for hop in reversed(_hops(forwarded)[-MAX_HOPS:]):
        address = _parse_ip(hop)
        if address is None:
            break
        kept.append(str(address))
        if address not in trusted:
            break
    return ", ".join([*reversed(kept), str(peer_ip)])
