"""``cosmicac run app-node`` as a real process: it creates the shared database and
admits the configured writers, serves the API (the first admin signs up and logs in),
and stops on SIGTERM; a busy port is one line and exit 1."""

from __future__ import annotations

import os
import signal
import socket
import subprocess

import httpx
import pytest
import trio

from crdt import inspect_storage
from tests.cli.helpers import process, read_ready

pytestmark = pytest.mark.slow

PASSWORD = "correct horse battery staple"


def clean_env(tmp_path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("COSMICAC_", "REDIS_URL"))}
    env.update({"COSMICAC_APP_NODE__STORAGE": str(tmp_path / "app-node"),
                "COSMICAC_APP_NODE__HOST": "127.0.0.1", "COSMICAC_APP_NODE__PORT": "0",
                "COSMICAC_APP_NODE__HTTP__PORT": "0", "COSMICAC_APP_NODE__FSYNC": "false",
                # scrypt at 16 KiB, not OWASP's 128 MiB: a dozen logins below
                "COSMICAC_APP_NODE__PASSWORD_HASH__LN": "4"})
    env.update(extra)
    return env


async def test_app_node_serves_the_api_and_administers_the_shared_database(tmp_path):
    proxy_key = "ab" * 32
    env = clean_env(tmp_path, COSMICAC_APP_NODE__DATABASE_WRITERS=f'["{proxy_key}"]',
                    COSMICAC_APP_NODE__LIMITS__TRUSTED_PROXIES="127.0.0.1")
    with trio.fail_after(90):
        async with process("run", "app-node", env=env, stdout=subprocess.PIPE) as proc:
            ready = await read_ready(proc.stdout, "app-node")
            key, database = ready.key, ready.fields["database"]
            assert database == key  # app-node created the database: its key is the bootstrap
            async with httpx.AsyncClient(base_url=ready.url("http", "/api"),
                                         timeout=30) as api:
                signup = await api.post("/auth/signup", json={
                    "email": "admin@example.com", "name": "Admin", "password": PASSWORD,
                    "team_name": "ops"})
                assert signup.status_code in (200, 201), signup.text
                login = await api.post("/auth/login", json={
                    "email": "admin@example.com", "password": PASSWORD})
                assert login.status_code == 200, login.text
                token = login.json()["token"]
                me = await api.get("/me", headers={"authorization": f"Bearer {token}"})
                assert me.status_code == 200 and me.json()["user"]["email"] == \
                    "admin@example.com"
                await _bounded_over_a_real_socket(api, token)
            proc.send_signal(signal.SIGTERM)
            assert await proc.wait() == 0
            # the cost set in the environment, and the warning that it is for tests
            assert b"app_node.weak_password_hash" in await proc.stderr.receive_some(1 << 20)
    report = inspect_storage(tmp_path / "app-node" / "db")
    assert report.bootstrap.hex() == key
    admitted = {w.key.hex(): w for w in report.writers if w.admitted}
    assert admitted[key].admin and proxy_key in admitted  # the proxy may write usage


async def _bounded_over_a_real_socket(api: httpx.AsyncClient, token: str) -> None:
    """Through the lean server (``p2p.httpserver``): a big chunked body is cut at
    the limit, deep JSON is a 400, failed logins back off per X-Forwarded-For
    address (127.0.0.1, the test, is a trusted proxy here) with a Retry-After,
    an HTTP/1.0 client is answered and closed, and app-node goes on serving."""
    async def big():
        for _ in range(64):  # 64 MiB, never read whole
            yield b" " * (1024 * 1024)

    try:
        r = await api.post("/auth/login", content=big())
    except httpx.TransportError:
        pass  # app-node may close while the client still sends
    else:
        assert r.status_code == 413 and r.json()["error"]["code"] == "BODY_TOO_LARGE"
    r = await api.post("/auth/login", content=b"[" * 100_000 + b"]" * 100_000)
    assert r.status_code == 400 and r.json()["error"]["code"] == "JSON_TOO_DEEP"
    wrong = {"email": "admin@example.com", "password": "not the password"}
    answers = [await api.post("/auth/login", json=wrong,
                              headers={"X-Forwarded-For": "192.0.2.66"}) for _ in range(7)]
    assert [r.status_code for r in answers] == [401] * 6 + [429]  # the 6th sets a 1 s wait
    assert int(answers[-1].headers["retry-after"]) >= 1
    assert await _http10_get(api.base_url, "/api/me", token) == 200
    r = await api.post("/auth/login", json={**wrong, "password": PASSWORD},
                       headers={"X-Forwarded-For": "198.51.100.7"})
    assert r.status_code == 200  # the owner elsewhere is not locked out
    me = await api.get("/me", headers={"authorization": f"Bearer {token}"})
    assert me.status_code == 200


async def _http10_get(base: httpx.URL, path: str, token: str) -> int:
    """An HTTP/1.0 GET on a raw socket: its status; the server ends the answer by
    closing (read to EOF here, which fails the test's deadline otherwise)."""
    stream = await trio.open_tcp_stream(base.host, base.port)
    async with stream:
        await stream.send_all(f"GET {path} HTTP/1.0\r\nAuthorization: Bearer {token}\r\n"
                              "\r\n".encode())
        answer = b""
        while chunk := await stream.receive_some(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.")
    assert b"transfer-encoding" not in head.lower() and body  # no chunks for HTTP/1.0
    return int(head.split()[1])


async def test_a_busy_http_port_is_one_line_and_exit_1(tmp_path):
    with socket.socket() as busy, trio.fail_after(60):
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        env = clean_env(tmp_path, COSMICAC_APP_NODE__HTTP__PORT=str(busy.getsockname()[1]))
        async with process("run", "app-node", env=env) as proc:
            assert await proc.wait() == 1
            stderr = await proc.stderr.receive_some()
    assert b"cannot serve the API on 127.0.0.1" in stderr
