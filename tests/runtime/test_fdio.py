"""runtime.fdio: a reader that waits before it reads, a writer that never waits."""

from __future__ import annotations

import os
import pty

import pytest
import trio
import trio.testing

from runtime.fdio import FdReader, write_now


def _pipe() -> tuple[int, int]:
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    os.set_blocking(write_fd, False)
    return read_fd, write_fd


async def test_a_reader_waits_for_data_then_reads_it_once():
    read_fd, write_fd = _pipe()
    stream = trio.lowlevel.FdStream(read_fd)
    reader = FdReader(stream.fileno())
    got: list[bytes] = []
    try:
        async def read_one() -> None:
            got.append(await reader.receive_some(64))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_one)
            await trio.testing.wait_all_tasks_blocked()
            assert got == []  # nothing yet: the reader waits
            os.write(write_fd, b"k")
        assert got == [b"k"]
        os.write(write_fd, b"x" * 100)
        assert await reader.receive_some(64) == b"x" * 64  # a full read...
        assert await reader.receive_some(64) == b"x" * 36  # ...reads first next time
        os.close(write_fd)
        assert await reader.receive_some(64) == b""  # end of input
    finally:
        await stream.aclose()


async def test_closing_the_owning_stream_wakes_a_waiting_reader():
    read_fd, write_fd = _pipe()
    stream = trio.lowlevel.FdStream(read_fd)
    reader = FdReader(stream.fileno())
    errors: list[BaseException] = []

    async def read_one() -> None:
        try:
            await reader.receive_some(64)
        except trio.ClosedResourceError as exc:
            errors.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_one)
        await trio.testing.wait_all_tasks_blocked()
        await stream.aclose()
    assert len(errors) == 1
    os.close(write_fd)


async def test_a_terminal_without_its_process_reads_as_broken():
    master, slave = pty.openpty()
    os.set_blocking(master, False)
    stream = trio.lowlevel.FdStream(master)
    try:
        os.write(slave, b"bye\n")
        os.close(slave)
        reader = FdReader(stream.fileno())
        with pytest.raises(trio.BrokenResourceError):
            for _ in range(3):  # the line first, then EIO
                await reader.receive_some(64)
    finally:
        await stream.aclose()


async def test_write_now_takes_what_fits_and_never_waits():
    read_fd, write_fd = _pipe()
    try:
        total = 0
        for _ in range(10_000):
            written = write_now(write_fd, b"y" * 65536)
            if written == 0:
                break
            total += written
        assert written == 0 and total > 0  # full: nothing taken, no wait
        assert len(os.read(read_fd, 1 << 20)) > 0
        os.close(read_fd)
        with pytest.raises(trio.BrokenResourceError):
            write_now(write_fd, b"z")  # EPIPE: nobody reads any more
    finally:
        os.close(write_fd)
    with pytest.raises(trio.ClosedResourceError):
        write_now(write_fd, b"z")


async def test_a_descriptor_epoll_refuses_is_read_directly():
    fd = os.open(os.devnull, os.O_RDONLY | os.O_NONBLOCK)
    try:
        reader = FdReader(fd)
        with trio.fail_after(5):
            assert await reader.receive_some(64) == b""  # EPERM from epoll: read, end
            assert await reader.receive_some(64) == b""
    finally:
        os.close(fd)
