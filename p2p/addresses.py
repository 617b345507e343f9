"""Which of a peer's addresses a reader can use, and in what order to dial them.

Theory of operation
-------------------
A peer announces a signed list of addresses (``p2p.dht`` records). Some of
them only mean something to a reader in the right place: ``127.0.0.1`` is the
reader's *own* host, ``169.254.x.y`` and ``fe80::`` only reach the same link,
``10.x.y.z`` only a private network. Records are signed by the announcer, so
nobody on the way can edit them; instead each party drops what the next one
cannot use (never hand a loopback or link-local address to a peer that is not
on it):

* a storing DHT node leaves out of a LOOKUP reply the records with no address
  usable by the asker (it knows where the asker is, relative to itself), and
  out of ``closer`` the contacts the asker could not reach;
* a reader filters the addresses of a record with :func:`usable_by` from where
  it sees the network (the address the DHT observes it at), and dials what is
  left in :func:`order_for_dialer` order: its own host first, then its own
  subnets, then public addresses, then other private ones.

An announcer that listens on a wildcard also lists its interface addresses
(:func:`interface_addresses`, :func:`announceable`), as upstream HyperDHT's
``shareLocalAddress`` does, so peers on its LAN, or on its host, reach it even
when the DHT sees it only from outside (or only over loopback).

Scopes (:class:`Scope`, widest last):

=========== ============================================================
LOOPBACK    127.0.0.0/8, ::1: this host only
LINK_LOCAL  169.254.0.0/16, fe80::/10: this link only
PRIVATE     10/8, 172.16/12, 192.168/16, 100.64/10 (CGNAT), fc00::/7
PUBLIC      every other unicast address
=========== ============================================================

``0.0.0.0``, ``::``, multicast and broadcast addresses are never usable
(:func:`address_scope` returns None for them).

Everything here is pure except :func:`interface_addresses`, which reads the
host's interfaces with the standard library only (no packets are sent).
"""

from __future__ import annotations

import enum
import functools
import ipaddress
import socket
from collections.abc import Iterable, Sequence

__all__ = [
    "Scope",
    "address_scope",
    "announceable",
    "interface_addresses",
    "order_for_dialer",
    "parse_fib_trie",
    "parse_if_inet6",
    "source_group",
    "usable_by",
    "visible_to",
]

Address = tuple[str, int]

_CGNAT = ipaddress.ip_network("100.64.0.0/10")
#: A few hundred distinct hosts at most in practice; bounded anyway.
_CACHE_SIZE = 4096


class Scope(enum.IntEnum):
    """How far an address reaches; a larger value reaches further."""

    #: This host only (127.0.0.0/8, ::1).
    LOOPBACK = 0
    #: This link only (169.254.0.0/16, fe80::/10).
    LINK_LOCAL = 1
    #: A private network (RFC 1918, RFC 6598 CGNAT, RFC 4193 ULA).
    PRIVATE = 2
    #: The internet.
    PUBLIC = 3


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except (ValueError, AttributeError):
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


@functools.lru_cache(maxsize=_CACHE_SIZE)
def address_scope(host: str) -> Scope | None:
    """The scope of an IP address; None if it is not a dialable unicast address.

    Args:
        host: an IPv4 or IPv6 address as text (IPv4-mapped IPv6 counts as IPv4;
            a ``%zone`` suffix is ignored).

    Returns:
        A :class:`Scope`, or None for host names, unspecified, multicast,
        broadcast and reserved addresses. Never raises.
    """
    ip = _ip(host) if isinstance(host, str) else None
    if ip is None or ip.is_unspecified or ip.is_multicast:
        return None
    if ip.is_loopback:
        return Scope.LOOPBACK
    if ip.is_reserved:  # 240.0.0.0/4 and 255.255.255.255; IPv6's ::/8 and the like
        return None
    if ip.is_link_local:
        return Scope.LINK_LOCAL
    if ip in _CGNAT or ip.is_private:
        return Scope.PRIVATE
    return Scope.PUBLIC


def usable_by(addresses: Iterable[Address], viewer_host: str | None) -> list[Address]:
    """The addresses a reader seen at ``viewer_host`` may dial, in their order.

    A reader seen over loopback shares the host with whoever saw it, so it may
    use loopback addresses; one seen over a link-local address may use
    link-local ones; anyone may use private and public addresses (a private
    address may well fail from elsewhere, but it is the only way onto a LAN,
    and :func:`order_for_dialer` tries it last). Addresses that are never
    usable (unspecified, multicast, host names) are dropped.

    Args:
        addresses: ``(host, port)`` pairs, e.g. a record's addresses.
        viewer_host: where the network sees the reader: for a DHT reader its
            observed address (``DhtNode.address[0]``), for a storing node the
            asker's source address. None (not known): the reader is treated as
            remote (no loopback, no link-local).

    Returns:
        The usable addresses, duplicates removed, order kept. Never raises.
    """
    allowed = _allowed_scopes(viewer_host)
    out: list[Address] = []
    for address in addresses:
        try:
            host, port = address
        except (TypeError, ValueError):
            continue
        if address_scope(host) in allowed and (host, port) not in out:
            out.append((host, port))
    return out


def visible_to(host: str, viewer_host: str | None) -> bool:
    """True if a reader seen at ``viewer_host`` may use ``host`` (see :func:`usable_by`)."""
    return address_scope(host) in _allowed_scopes(viewer_host)


_WIDE = frozenset({Scope.PRIVATE, Scope.PUBLIC})
_FROM_LOOPBACK = frozenset({Scope.LOOPBACK, Scope.PRIVATE, Scope.PUBLIC})
_FROM_LINK = frozenset({Scope.LINK_LOCAL, Scope.PRIVATE, Scope.PUBLIC})


def _allowed_scopes(viewer_host: str | None) -> frozenset[Scope]:
    viewer = address_scope(viewer_host) if viewer_host is not None else None
    if viewer is Scope.LOOPBACK:
        return _FROM_LOOPBACK
    if viewer is Scope.LINK_LOCAL:
        return _FROM_LINK
    return _WIDE


def _same_subnet(host: str, own: str) -> bool:
    a, b = _ip(host), _ip(own)
    if a is None or b is None or a.version != b.version:
        return False
    prefix = 24 if a.version == 4 else 64
    return ipaddress.ip_network(f"{b}/{prefix}", strict=False).network_address == \
        ipaddress.ip_network(f"{a}/{prefix}", strict=False).network_address


def order_for_dialer(addresses: Iterable[Address],
                     own_interface_hosts: Sequence[str]) -> list[Address]:
    """Sort addresses so that those fitting the dialer's own network come first.

    Order (stable, so the announcer's order breaks ties): this host (loopback,
    or one of ``own_interface_hosts``); the dialer's own subnets (same /24 for
    IPv4, same /64 for IPv6); public addresses; other private addresses;
    link-local ones. Filter with :func:`usable_by` first: this function drops
    only addresses that are never usable.

    Args:
        addresses: ``(host, port)`` pairs.
        own_interface_hosts: the dialer's interface addresses
            (:func:`interface_addresses`).

    Returns:
        The addresses, best first. Never raises.
    """
    own = set(own_interface_hosts)

    def rank(address: Address) -> int:
        host = address[0]
        scope = address_scope(host)
        if scope is Scope.LOOPBACK or host in own:
            return 0
        if any(_same_subnet(host, mine) for mine in own):
            return 1
        if scope is Scope.PUBLIC:
            return 2
        if scope is Scope.PRIVATE:
            return 3
        return 4

    kept: list[Address] = []
    for address in addresses:
        try:
            host, port = address
        except (TypeError, ValueError):
            continue
        if address_scope(host) is not None and (host, port) not in kept:
            kept.append((host, port))
    return sorted(kept, key=rank)


def source_group(host: str) -> str:
    """The group a source address counts in, for per-source limits.

    IPv4 counts per address (/32); IPv6 per /64, the smallest block a site is
    given (RFC 6177), so one host cannot claim 2**64 separate sources. Anything
    that is not an IP address is its own group.

    Args:
        host: an IP address as text.

    Returns:
        A string naming the group, e.g. ``"192.0.2.7"`` or ``"2001:db8:1:2::/64"``.
    """
    return _source_group(host)


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _source_group(host: str) -> str:
    ip = _ip(host) if isinstance(host, str) else None
    if ip is None:
        return str(host)
    if ip.version == 4:
        return str(ip)
    return str(ipaddress.ip_network(f"{ip}/64", strict=False))


def announceable(
    observed: Address | None,
    local_hosts: Iterable[str],
    port: int,
    *,
    limit: int = 4,
) -> list[Address]:
    """The addresses a node should announce: what others see, then its own.

    Args:
        observed: the address the DHT observes us at (None: not known yet).
        local_hosts: our interface addresses (or the host we are bound to).
        port: the port we listen on (the bound one; the observed port may be
            a NAT's).
        limit: most addresses returned (a DHT record holds 4).

    Returns:
        The observed address (unless it is loopback or link-local and there is
        something wider), then the local addresses widest scope first, then
        loopback ones, without duplicates or unusable addresses, at most
        ``limit``.
    """
    candidates: list[Address] = []
    if observed is not None:
        candidates.append((observed[0], observed[1]))
    candidates += [(host, port) for host in local_hosts]
    seen: list[Address] = []
    for address in candidates:
        if address_scope(address[0]) is not None and address not in seen:
            seen.append(address)
    # Widest scope first; stable, so the observed address leads its scope.
    seen.sort(key=lambda a: -int(address_scope(a[0]) or 0))
    return seen[:limit]


def interface_addresses() -> list[str]:
    """This host's interface addresses that others could reach, widest scope first.

    Loopback, link-local, unspecified and multicast addresses are left out.
    Standard library only: on Linux the kernel's own tables
    (``/proc/net/fib_trie`` for IPv4, ``/proc/net/if_inet6`` for IPv6); else
    the addresses the host name resolves to. No packet is sent.

    Returns:
        Addresses as text, without duplicates; empty if none are found.
        Never raises.
    """
    found: list[str] = []
    found += _linux_ipv4()
    found += _linux_ipv6()
    if not found:
        try:
            infos = socket.getaddrinfo(socket.gethostname(), None)
        except (OSError, UnicodeError):
            infos = []
        found += [str(info[4][0]) for info in infos]
    out: list[str] = []
    for host in found:
        host = host.split("%", 1)[0]
        scope = address_scope(host)
        if scope in (Scope.PRIVATE, Scope.PUBLIC) and host not in out:
            out.append(host)
    out.sort(key=lambda h: -int(address_scope(h) or 0))
    return out


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as file:
            return file.read(1 << 20)  # bounded: these tables are small
    except OSError:
        return ""


def parse_fib_trie(text: str) -> list[str]:
    """The local IPv4 addresses in a ``/proc/net/fib_trie`` dump (``/32 host LOCAL``)."""
    out: list[str] = []
    last: str | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("|--"):
            last = stripped[3:].strip()
        elif stripped.startswith("/32 host LOCAL") and last is not None and last not in out:
            out.append(last)
    return out


def parse_if_inet6(text: str) -> list[str]:
    """The IPv6 addresses in a ``/proc/net/if_inet6`` dump."""
    out: list[str] = []
    for line in text.splitlines():
        fields = line.split()
        if not fields or len(fields[0]) != 32:
            continue
        try:
            ip = ipaddress.IPv6Address(int(fields[0], 16))
        except ValueError:
            continue
        if str(ip) not in out:
            out.append(str(ip))
    return out


def _linux_ipv4() -> list[str]:
    return parse_fib_trie(_read("/proc/net/fib_trie"))


def _linux_ipv6() -> list[str]:
    return parse_if_inet6(_read("/proc/net/if_inet6"))
