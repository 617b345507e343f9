"""The CLI's one request (cli/_http.py) against real sockets on 127.0.0.1: answers of
any status come back, everything else (refused, silent, garbage, too large) is
``Unreachable`` with a reason, never a traceback."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from cli import _http
from cli._http import Unreachable, request


@contextmanager
def _server(answer: Callable[[socket.socket, bytes], None]) -> Iterator[str]:
    """A one-connection-at-a-time server; ``answer(conn, request_bytes)`` replies."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                received = b""
                while b"\r\n\r\n" not in received:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    received += chunk
                head, _, body = received.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(body) < length:
                    body += conn.recv(65536)
                answer(conn, head + b"\r\n\r\n" + body)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
        listener.close()
        thread.join(10)


def _reply(status: str, body: bytes) -> Callable[[socket.socket, bytes], None]:
    seen: list[bytes] = []

    def answer(conn: socket.socket, got: bytes) -> None:
        seen.append(got)
        conn.sendall(f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n"
                     f"Content-Type: application/json\r\nConnection: close\r\n\r\n"
                     .encode() + body)

    answer.seen = seen  # type: ignore[attr-defined]
    return answer


def test_a_request_carries_its_method_headers_query_and_json_body():
    answer = _reply("201 Created", b'{"id": "j-1"}')
    with _server(answer) as base:
        got = request("POST", f"{base}/api/jobs", headers={"authorization": "Bearer t"},
                      json_body={"name": "a b"}, params={"team_id": "x&y"})
    assert got.status == 201 and got.ok and got.json() == {"id": "j-1"}
    sent = answer.seen[0]  # type: ignore[attr-defined]
    assert sent.startswith(b"POST /api/jobs?team_id=x%26y HTTP/1.1\r\n")
    assert b"\r\nAuthorization: Bearer t\r\n" in sent
    assert json.loads(sent.partition(b"\r\n\r\n")[2]) == {"name": "a b"}


def test_a_refusal_is_an_answer_with_its_body():
    body = b'{"error": {"code": "NOT_FOUND", "message": "no job j-2"}}'
    with _server(_reply("404 Not Found", body)) as base:
        got = request("GET", f"{base}/api/jobs/j-2")
    assert (got.status, got.reason, got.ok, got.json()["error"]["code"]) == (
        404, "Not Found", False, "NOT_FOUND")


@pytest.mark.parametrize("behaviour", ["refused", "silent", "garbage", "too large", "cut"])
def test_no_answer_is_unreachable_with_a_reason(behaviour, monkeypatch):
    def silent(conn: socket.socket, got: bytes) -> None:
        conn.recv(1)  # until the client gives up

    def garbage(conn: socket.socket, got: bytes) -> None:
        conn.sendall(b"\x16\x03\x01 not http at all\r\n\r\n")

    def cut(conn: socket.socket, got: bytes) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"a\"")

    monkeypatch.setattr(_http, "MAX_ANSWER", 1000)
    answers = {"silent": silent, "garbage": garbage, "cut": cut,
               "too large": _reply("200 OK", b"x" * 2000)}
    if behaviour == "refused":
        with socket.socket() as unused:
            unused.bind(("127.0.0.1", 0))
            port = unused.getsockname()[1]
        with pytest.raises(Unreachable, match="refused"):
            request("GET", f"http://127.0.0.1:{port}/api/me", timeout=1)
        return
    with _server(answers[behaviour]) as base, pytest.raises(Unreachable) as raised:
        request("GET", f"{base}/api/me", timeout=0.5)
    assert str(raised.value)
