"""The daemons' clients share one TLS context that still verifies servers."""

import ssl

import httpx

from nodes.entry.daemon import open_client
from nodes.entry.settings import EntrySettings
from nodes.kit.tls import client_tls
from nodes.monitor.loki import _open_client


def _context_of(client: httpx.AsyncClient) -> ssl.SSLContext:
    return client._transport._pool._ssl_context  # httpx's pool keeps the one it was given


async def test_one_context_for_every_client_and_it_verifies_certificates_and_names():
    context = client_tls()
    assert context is client_tls()
    assert context.verify_mode is ssl.CERT_REQUIRED and context.check_hostname
    async with _open_client(5.0) as loki, open_client(EntrySettings()) as entry:
        assert _context_of(loki) is context
        assert _context_of(entry) is context
