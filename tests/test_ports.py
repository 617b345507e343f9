"""tests/ports.py: a port handed out is free and no other caller gets it while
its reservation lives, even when the random draw lands on it again."""

from __future__ import annotations

import os
import random
import socket
import time

import pytest

from tests import ports


@pytest.fixture
def reservations(tmp_path, monkeypatch):
    monkeypatch.setattr(ports, "RESERVATIONS", tmp_path)
    return tmp_path


@pytest.fixture
def same_draw(monkeypatch):
    """Every draw first lands on one port, then anywhere (as random would)."""
    draws = iter([27_000, 27_000, 27_000])
    real = random.randrange
    monkeypatch.setattr(ports.random, "randrange", lambda a, b: next(draws, None) or real(a, b))


def test_a_port_drawn_twice_goes_to_one_caller_only(reservations, same_draw):
    first = ports.free_port()
    second = ports.free_port()
    assert first == 27_000 and second != first
    assert {p.name for p in reservations.iterdir()} == {str(first), str(second)}


def test_a_stale_reservation_is_taken_over(reservations, same_draw):
    stale = reservations / "27000"
    stale.touch()
    old = time.time() - ports.RESERVED_FOR_S - 1
    os.utime(stale, (old, old))
    assert ports.free_port() == 27_000
    assert time.time() - stale.stat().st_mtime < ports.RESERVED_FOR_S


def test_a_bound_port_is_skipped_and_its_reservation_released(reservations, monkeypatch):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        bound = holder.getsockname()[1]
        draws = iter([bound - 1])  # the block bound-1..bound+1 holds the bound port
        real = random.randrange
        monkeypatch.setattr(ports.random, "randrange",
                            lambda a, b: next(draws, None) or real(a, b))
        monkeypatch.setattr(ports, "_ephemeral_first", lambda: 65_000)
        base = ports.free_ports(3)
    assert base != bound - 1
    assert not (reservations / str(bound - 1)).exists()
    assert not (reservations / str(bound)).exists()
    assert {p.name for p in reservations.iterdir()} == {str(base + i) for i in range(3)}
