"""The entry point's decisions without I/O: the route table, header filtering, settings."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodes.entry import EntrySettings, Service, error_body, request_headers, response_headers
from nodes.entry.routes import landing_page, route
from p2p.daemon import ConfigError, load_settings

ROUTES = [
    # (raw path, query, service, target, prefix)
    (b"/api", b"", Service.API, b"/api", b""),
    (b"/api/v1/jobs", b"team=a", Service.API, b"/api/v1/jobs?team=a", b""),
    (b"/api/", b"", Service.API, b"/api/", b""),
    (b"/apis", b"", Service.UI, b"/apis", b""),
    (b"/inference", b"", Service.INFERENCE, b"/", b"/inference"),
    (b"/inference/", b"", Service.INFERENCE, b"/", b"/inference"),
    (b"/inference/v1/chat/completions", b"", Service.INFERENCE, b"/v1/chat/completions",
     b"/inference"),
    (b"/inference/v1/a%2Fb", b"x=%20", Service.INFERENCE, b"/v1/a%2Fb?x=%20", b"/inference"),
    (b"/inferencex/v1", b"", Service.UI, b"/inferencex/v1", b""),
    (b"/monitor", b"", Service.MONITOR, b"/", b"/monitor"),
    (b"/monitor/logs", b"job=1", Service.MONITOR, b"/logs?job=1", b"/monitor"),
    (b"/", b"", Service.UI, b"/", b""),
    (b"/jobs/42", b"", Service.UI, b"/jobs/42", b""),
    (b"/API/v1", b"", Service.UI, b"/API/v1", b""),  # paths are case-sensitive
]


@pytest.mark.parametrize(("path", "query", "service", "target", "prefix"), ROUTES)
def test_each_path_goes_to_its_service_with_its_target(path, query, service, target, prefix):
    forward = route(path, query)
    assert (forward.service, forward.target, forward.prefix) == (service, target, prefix)


@given(st.binary(max_size=64).map(lambda rest: b"/" + rest))
def test_a_stripped_prefix_and_its_target_give_back_the_path(path):
    forward = route(path)
    if forward.service in (Service.INFERENCE, Service.MONITOR):
        rest = path[len(forward.prefix):]
        assert forward.target == (rest or b"/")
        assert path.startswith(forward.prefix) and (rest == b"" or rest.startswith(b"/"))
    else:
        assert forward.target == path and forward.prefix == b""


def test_request_headers_drop_hop_by_hop_ones_and_those_connection_names():
    headers = [(b"host", b"door:5173"), (b"connection", b"keep-alive, X-Secret"),
               (b"x-secret", b"1"), (b"keep-alive", b"timeout=5"), (b"te", b"trailers"),
               (b"transfer-encoding", b"chunked"), (b"upgrade", b"websocket"),
               (b"trailer", b"x"), (b"proxy-authorization", b"Basic x"),
               (b"proxy-connection", b"keep-alive"), (b"expect", b"100-continue"),
               (b"x-forwarded-for", b"6.6.6.6"), (b"x-forwarded-host", b"evil"),
               (b"authorization", b"Bearer sk"), (b"accept", b"a"), (b"accept", b"b")]
    out = request_headers(headers, client="10.0.0.7", scheme="https", prefix=b"/inference")
    assert out == [(b"authorization", b"Bearer sk"), (b"accept", b"a"), (b"accept", b"b"),
                   (b"x-forwarded-for", b"10.0.0.7"), (b"x-forwarded-proto", b"https"),
                   (b"x-forwarded-host", b"door:5173"), (b"x-forwarded-prefix", b"/inference")]


def test_request_headers_without_a_client_or_prefix_add_only_what_is_known():
    out = request_headers([(b"accept", b"*/*")], client=None, scheme="http")
    assert out == [(b"accept", b"*/*"), (b"x-forwarded-proto", b"http")]


def test_response_headers_keep_repeats_and_drop_hop_by_hop_date_and_server():
    headers = [(b"Content-Type", b"text/event-stream"), (b"Set-Cookie", b"a=1"),
               (b"Set-Cookie", b"b=2"), (b"Connection", b"close, X-Private"),
               (b"X-Private", b"1"), (b"Transfer-Encoding", b"chunked"),
               (b"Proxy-Authenticate", b"Basic"), (b"Date", b"yesterday"),
               (b"Server", b"uvicorn"), (b"Content-Length", b"12")]
    assert response_headers(headers) == [
        (b"content-type", b"text/event-stream"), (b"set-cookie", b"a=1"),
        (b"set-cookie", b"b=2"), (b"content-length", b"12")]


def test_errors_are_in_openais_shape_with_the_service():
    error = json.loads(error_body("UPSTREAM_UNREACHABLE", "app-node is down", Service.API))
    assert error == {"error": {"message": "app-node is down", "type": "entry_error",
                               "param": None, "code": "UPSTREAM_UNREACHABLE",
                               "service": "api"}}
    assert "service" not in json.loads(error_body("NOT_FOUND", "no"))["error"]


def test_the_landing_page_links_the_docs_and_escapes_the_host():
    page = landing_page(b"door.example:5173", "https").decode()
    assert 'href="/api/docs"' in page
    assert "https://door.example:5173/inference/v1" in page
    hostile = landing_page(b"<script>x</script>", "http").decode()
    assert "<script>x" not in hostile and "&lt;script&gt;" in hostile


def test_settings_default_to_the_seeds_door_and_normalise_urls(monkeypatch):
    for name in list(os.environ):
        if name.startswith("COSMICAC_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("COSMICAC_ENTRY__INFERENCE_URL", "http://10.0.0.2:49750/")
    monkeypatch.setenv("COSMICAC_ENTRY__MONITOR_URL", "")
    settings = load_settings(EntrySettings, config_file=None, overrides={})
    assert (settings.host, settings.port) == ("127.0.0.1", 5173)
    assert settings.inference_url == "http://10.0.0.2:49750"
    assert settings.monitor_url is None
    assert settings.storage is None  # nothing to keep, nothing locked


@pytest.mark.parametrize("bad", ["ftp://x", "http://", "http://h:99999", "http://h/?q=1",
                                 "127.0.0.1:80"])
def test_a_bad_upstream_url_names_its_key(monkeypatch, bad):
    monkeypatch.setenv("COSMICAC_ENTRY__API_URL", bad)
    with pytest.raises(ConfigError) as failed:
        load_settings(EntrySettings, config_file=None, overrides={})
    assert failed.value.key == "api_url"
    assert failed.value.source == "COSMICAC_ENTRY__API_URL"


def test_our_servers_keep_idle_connections_longer_than_the_entry_point_and_httpx_do():
    """A server closing an idle keep-alive connection first races the proxy's next
    request on it (a reset, seen as UPSTREAM_UNREACHABLE on a POST)."""
    import httpx

    from nodes.entry import EntrySettings
    from p2p.http import KEEP_ALIVE_S

    assert EntrySettings().keepalive_expiry_s < KEEP_ALIVE_S
    assert httpx.Limits().keepalive_expiry < KEEP_ALIVE_S
