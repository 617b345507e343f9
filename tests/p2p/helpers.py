"""Helpers shared by the P2P tests: key pairs and connected secret-stream pairs."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

import trio
import trio.testing

from p2p.errors import HandshakeError
from p2p.keys import KeyPair
from p2p.noise import SecretStream, SecretStreamConfig

ALICE = KeyPair.from_seed(bytes(range(32)))
BOB = KeyPair.from_seed(bytes(range(1, 33)))
MALLORY = KeyPair.from_seed(bytes(range(2, 34)))


async def secret_stream_pair(
    maker=trio.testing.memory_stream_pair,
    *,
    initiator_key: KeyPair = ALICE,
    responder_key: KeyPair = BOB,
    config: SecretStreamConfig | None = None,
) -> tuple[SecretStream, SecretStream]:
    """Handshake over ``maker()``'s pair of streams; return (initiator, responder)."""
    config = config or SecretStreamConfig()
    left, right = maker()
    result: dict[str, SecretStream] = {}

    async def respond() -> None:
        result["responder"] = await SecretStream.responder(right, responder_key, config=config)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(respond)
        result["initiator"] = await SecretStream.initiator(
            left, initiator_key, responder_key.public_key, config=config
        )
    return result["initiator"], result["responder"]


@dataclass
class ClosingResponder:
    """A responder that closes its first ``closes`` sockets unread, as a
    daemon's admission evicts a handshake under a flood, then answers
    handshakes as ``keypair`` and holds each stream open."""

    keypair: KeyPair
    closes: int
    accepted: int = 0
    completed: int = 0

    async def serve(self, listener, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Accept from ``listener`` (a :class:`p2p.net.StreamListener`) until cancelled."""
        async with trio.open_nursery() as nursery:
            task_status.started()
            while True:
                stream, _address = await listener.accept()
                self.accepted += 1
                if self.accepted <= self.closes:
                    await trio.aclose_forcefully(stream)
                else:
                    nursery.start_soon(self._answer, stream)

    async def _answer(self, stream) -> None:
        try:
            secret = await SecretStream.responder(stream, self.keypair)
        except HandshakeError:
            return  # the dialler gave up on it (a key it did not expect): that socket only
        self.completed += 1
        async with secret:
            await trio.sleep_forever()


async def wait_until(condition, *, limit_s: float = 10.0, step_s: float = 0.02) -> None:
    """Poll ``condition`` until it holds, on trio's clock; fail after ``limit_s``.

    For state that changes in other tasks without an event to wait on (a
    connection table, a counter); bounded in time, so it cannot hang a test.

    Under trio's MockClock the bound is ten times longer: virtual time jumps
    whenever every task waits, and a task waiting on a thread (SQLite) counts as
    waiting, so on a loaded machine ten virtual seconds pass in a fraction of a
    real one while one query runs (seen: a worker test's 10 s bound hit in CI).
    """
    if isinstance(trio.lowlevel.current_clock(), trio.testing.MockClock):
        limit_s *= 10
    with trio.fail_after(limit_s):
        while not condition():  # noqa: ASYNC110 - polling state owned by other tasks
            await trio.sleep(step_s)


class Stoppable:
    """A service task the test stops in the middle and starts again on the same
    storage or port: :meth:`stop` returns once its cleanup has run (its lock
    released, its socket closed), which cancelling a scope alone does not wait for.
    """

    def __init__(self) -> None:
        self._scope = trio.CancelScope()
        self._done = trio.Event()

    async def start(self, nursery: trio.Nursery, serve, *args, **kwargs):
        """``nursery.start(serve, *args, **kwargs)``, stoppable; what it started with."""

        async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
            try:
                with self._scope:
                    await serve(*args, task_status=task_status, **kwargs)
            finally:
                self._done.set()

        return await nursery.start(run)

    async def stop(self, limit_s: float = 30.0) -> None:
        self._scope.cancel()
        with trio.fail_after(limit_s):
            await self._done.wait()


async def http_get(address: tuple[str, int], path: str) -> tuple[int, bytes]:
    """GET ``path`` over a real TCP connection; return (status, the whole response)."""
    stream = await trio.open_tcp_stream(*address)
    async with stream:
        request = f"GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
        await stream.send_all(request.encode())
        data = b""
        with trio.fail_after(5):
            while chunk := await stream.receive_some():
                data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, data


def exposed_paths(root: Path) -> list[str]:
    """Every file or folder under ``root`` (itself included) that a group or others
    may read or write (a file: any of their bits; a folder: list or write it; one
    they may only pass through, 0711, keeps its names to itself), as
    ``"<path> 0o644"``, sorted."""
    found = set()
    for folder, folders, files in os.walk(root):
        for name in (".", *folders, *files):
            path = Path(folder) / name
            try:
                info = os.lstat(path)
            except FileNotFoundError:
                continue  # a temporary renamed away while we walked
            if stat.S_ISLNK(info.st_mode):
                continue
            others = 0o066 if stat.S_ISDIR(info.st_mode) else 0o077
            if info.st_mode & others:
                mode = stat.S_IMODE(info.st_mode)
                found.add(f"{path.resolve().relative_to(root.resolve().parent)} {oct(mode)}")
    return sorted(found)
