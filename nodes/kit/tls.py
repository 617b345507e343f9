"""The TLS context of a daemon's HTTP clients, built once per process."""

from __future__ import annotations

import functools
import ssl

import httpx

__all__ = ["client_tls"]


@functools.cache
def client_tls() -> ssl.SSLContext:
    """The context httpx would build for a client with ``trust_env=False`` (certifi's
    bundle). httpx builds one per client, reading and parsing the bundle each time
    (20-70 ms of CPU), and the daemons open clients at start and on every
    reconfiguration, most of them to plain HTTP on loopback; one context serves
    every client in the process."""
    return httpx.create_ssl_context(trust_env=False)
