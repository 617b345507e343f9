"""Requests as bytes, and the events the core should make of them (shared by the tests)."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st


@dataclass(frozen=True)
class Sent:
    """One request the tests send: how it is framed, and what the server should see."""

    method: str
    target: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    chunked: bool
    close: bool

    def encode(self) -> bytes:
        lines = [b"%s %s HTTP/1.1\r\n" % (self.method.encode(), self.target),
                 b"Host: test\r\n"]
        lines += [b"%s: %s\r\n" % (name, value) for name, value in self.headers]
        if self.chunked:
            lines.append(b"Transfer-Encoding: chunked\r\n")
        elif self.body or self.method == "POST":
            lines.append(b"Content-Length: %d\r\n" % len(self.body))
        if self.close:
            lines.append(b"Connection: close\r\n")
        lines.append(b"\r\n")
        if self.chunked:
            # The body in pieces of 1..7 bytes, then the last chunk.
            step = 1 + len(self.body) % 7
            for offset in range(0, len(self.body), step):
                piece = self.body[offset:offset + step]
                lines.append(b"%x\r\n%s\r\n" % (len(piece), piece))
            lines.append(b"0\r\n\r\n")
        else:
            lines.append(self.body)
        return b"".join(lines)


_token = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=12)
_value = st.binary(max_size=40).map(
    lambda b: bytes(c for c in b if 0x21 <= c <= 0x7E) or b"v")
_target = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789/%._-=&",
                  max_size=30).map(lambda s: ("/" + s.replace("%", "%25")).encode())


@st.composite
def sent_requests(draw: st.DrawFn, *, close: bool = False) -> Sent:
    method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE"]))
    body = draw(st.binary(max_size=300)) if method in ("POST", "PUT") else b""
    names = draw(st.lists(_token.filter(lambda n: n not in (
        "host", "content-length", "transfer-encoding", "connection", "expect", "upgrade")),
        max_size=5, unique=True))
    headers = tuple((name.encode(), draw(_value)) for name in names)
    chunked = bool(body) and draw(st.booleans())
    return Sent(method, draw(_target), headers, body, chunked, close)


@st.composite
def conversations(draw: st.DrawFn) -> list[Sent]:
    """1..4 requests on one connection; the last one may close it."""
    requests = draw(st.lists(sent_requests(), min_size=1, max_size=4))
    if draw(st.booleans()):
        last = requests[-1]
        requests[-1] = Sent(last.method, last.target, last.headers, last.body,
                            last.chunked, close=True)
    return requests


@st.composite
def splits(draw: st.DrawFn, data: bytes) -> list[bytes]:
    """``data`` cut at arbitrary points."""
    cuts = sorted(set(draw(st.lists(st.integers(0, len(data)), max_size=12))))
    pieces, start = [], 0
    for cut in [*cuts, len(data)]:
        if cut > start:
            pieces.append(data[start:cut])
            start = cut
    return pieces
