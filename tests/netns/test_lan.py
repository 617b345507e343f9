"""LAN discovery between two hosts of one segment (the topology's bridge), with no DHT
anywhere: a `cosmicac beam --listen --lan` on one host, a `cosmicac beam KEY --lan` on
the other finds it by its signed multicast beacon and pipes through."""

from __future__ import annotations

import hashlib
import os
import subprocess

import pytest

from tests.netns.test_relay_scenario import COSMICAC, LISTENING, wait_for_line
from tests.netns.topology import RELAY, WORKER, Topology

pytestmark = [pytest.mark.netns, pytest.mark.slow]


def test_two_hosts_meet_on_the_lan_with_no_dht_and_pipe_through(topology: Topology,
                                                                 tmp_path):
    data = tmp_path / "data"
    data.write_bytes(os.urandom(256 << 10))
    err = tmp_path / "listener.err"
    listener = topology.popen(WORKER, [COSMICAC, "beam", "--listen", "--lan"],
                              stdin=data.open("rb"),
                              stdout=(tmp_path / "listener.out").open("wb"),
                              stderr=err.open("wb"))
    key = wait_for_line(err, LISTENING)[1]
    assert "announced on the LAN" in err.read_text()
    (tmp_path / "empty").write_bytes(b"")
    with (tmp_path / "empty").open("rb") as stdin, (tmp_path / "got").open("wb") as stdout:
        result = topology.run(RELAY, [COSMICAC, "beam", key, "--lan"], stdin=stdin,
                              stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert hashlib.sha256((tmp_path / "got").read_bytes()).digest() == \
        hashlib.sha256(data.read_bytes()).digest()
    assert listener.wait(timeout=30) == 0


def test_without_a_listener_the_dialler_says_nobody_answered_on_the_lan(topology: Topology,
                                                                       tmp_path):
    result = topology.run(RELAY, [COSMICAC, "beam", "ab" * 32, "--lan"],
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=60)
    assert result.returncode == 1
    assert "answered on the LAN within 5 s" in result.stderr
