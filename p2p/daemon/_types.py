"""Field types for daemon settings: ports, key lists, address lists, log levels.

Each type accepts what a config file holds (TOML/JSON values), what the
environment holds (strings: a list as a JSON array, exactly as the platform's
``K8S_COMMON_CONFIG__interconnect__relays='["<key>"]'``, or comma-separated),
and what a command line hands over (already parsed values).
"""

from __future__ import annotations

import ipaddress
import json
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field
from pydantic_settings import NoDecode

from ..errors import KeyFormatError
from ..keys import KEY_BYTES, parse_public_key

__all__ = [
    "Address",
    "AddressList",
    "LogFormat",
    "LogLevel",
    "Port",
    "PublicKey",
    "PublicKeyList",
    "StrList",
    "parse_address",
    "split_list",
]

#: A TCP/UDP port; 0 asks the system for a free one (or turns a service off,
#: where the field says so).
Port = Annotated[int, Field(ge=0, le=65535)]


def _lower(value: Any) -> Any:
    return value.strip().lower() if isinstance(value, str) else value


#: The logging level of a daemon (any case).
LogLevel = Annotated[Literal["debug", "info", "warning", "error", "critical"],
                     BeforeValidator(_lower)]
#: ``auto``: readable text on a terminal, JSON lines otherwise.
LogFormat = Annotated[Literal["auto", "text", "json"], BeforeValidator(_lower)]


def split_list(value: Any) -> Any:
    """A list from a JSON array or comma-separated text; other values unchanged.

    Raises:
        ValueError: text that starts like a JSON array but is not one.
    """
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("["):
        try:
            decoded = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"not a JSON array ({exc})") from None
        if not isinstance(decoded, list):
            raise ValueError("not a JSON array")
        return decoded
    return [item.strip() for item in text.split(",") if item.strip()]


def _public_key(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        if len(value) != KEY_BYTES:
            raise ValueError(f"a public key is {KEY_BYTES} bytes, got {len(value)}")
        return bytes(value)
    if not isinstance(value, str):
        raise ValueError(f"a public key is {2 * KEY_BYTES} hex characters")
    try:
        return parse_public_key(value)
    except KeyFormatError as exc:
        raise ValueError(str(exc)) from None


def parse_address(value: Any) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for IPv6), or a ``[host, port]`` pair.

    The host must be an IP address (it is compared and announced as one) and
    the port 1..65535.

    Raises:
        ValueError: with what is wrong.
    """
    if isinstance(value, list | tuple) and len(value) == 2:
        host, port = value
    elif isinstance(value, str):
        host, sep, port_text = value.strip().rpartition(":")
        if not sep or not host:
            raise ValueError(f"expected HOST:PORT, got {value!r}")
        try:
            port = int(port_text)
        except ValueError:
            raise ValueError(f"port must be a number, got {port_text!r}") from None
    else:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    if not isinstance(host, str) or not isinstance(port, int) or isinstance(port, bool):
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        raise ValueError(f"{host!r} is not an IP address") from None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if not 0 < port < 65536:
        raise ValueError(f"port must be between 1 and 65535, got {port}")
    return str(ip), port


#: One 32-byte public key, written as 64 hex characters.
PublicKey = Annotated[bytes, BeforeValidator(_public_key)]
#: Public keys: a JSON array or comma-separated hex keys; kept in order, once each.
PublicKeyList = Annotated[tuple[PublicKey, ...], NoDecode, BeforeValidator(split_list),
                          AfterValidator(lambda keys: tuple(dict.fromkeys(keys)))]
#: One ``host:port`` address.
Address = Annotated[tuple[str, int], BeforeValidator(parse_address)]
#: Addresses: a JSON array or comma-separated ``host:port`` items.
AddressList = Annotated[tuple[Address, ...], NoDecode, BeforeValidator(split_list)]
#: Strings: a JSON array or comma-separated items.
StrList = Annotated[tuple[str, ...], NoDecode, BeforeValidator(split_list)]
