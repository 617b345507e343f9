"""ray_wait: reading ``ray status`` and the two bounded waits (trio's autojump clock)."""

from __future__ import annotations

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from agents.inference.runtimes.ray_wait import (
    ClusterView,
    RayWaitTimeout,
    main,
    parse_ray_status,
    split_address,
    wait_for_cluster,
    wait_reachable,
)

# Ray 2.x, two 8-GPU nodes (layout of `ray status` in Ray's observability docs).
RAY2_TWO_NODES = """\
======== Autoscaler status: 2026-12-01 10:00:00.000000 ========
Node status
---------------------------------------------------------------
Active:
 1 node_4f1cbd0d3a8a5a6e0b4d0b4c1b3e1f0a9c8d7e6f5a4b3c2d1e0f9a8b
 1 node_a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d
Pending:
 (no pending nodes)
Recent failures:
 (no failures)

Resources
---------------------------------------------------------------
Total Usage:
 0.0/208.0 CPU
 0.0/16.0 GPU
 0B/1.60TiB memory
 0B/186.26GiB object_store_memory

Total Demands:
 (no resource demands)
"""

# Ray 1.x wording (Ray's docs, cli-sdk.rst): "Healthy:" and "Usage:", no GPUs.
RAY1_CPU_ONLY = """\
======== Autoscaler status: 2021-10-12 13:10:21.035674 ========
Node status
---------------------------------------------------------------
Healthy:
 1 ray.head.default
 2 ray.worker.cpu
Pending:
 (no pending nodes)
Recent failures:
 (no failures)

Resources
---------------------------------------------------------------
Usage:
 0.0/10.0 CPU
 0.00/70.437 GiB memory
 0.00/10.306 GiB object_store_memory

Demands:
 (no resource demands)
"""


@pytest.mark.parametrize(
    ("text", "view"),
    [(RAY2_TWO_NODES, ClusterView(nodes=2, gpus=16.0)),
     (RAY1_CPU_ONLY, ClusterView(nodes=3, gpus=0.0)),
     ("Active:\n (no active nodes)\n", ClusterView(nodes=0, gpus=None)),
     ("ConnectionError: Could not find any running Ray instance.\n", ClusterView(None, None)),
     ("", ClusterView(None, None))],
)
def test_ray_status_is_read_for_nodes_and_gpus(text: str, view: ClusterView) -> None:
    assert parse_ray_status(text) == view


@given(st.text())
def test_parse_ray_status_never_raises(text: str) -> None:
    view = parse_ray_status(text)
    assert view.nodes is None or view.nodes >= 0


def test_a_view_satisfies_only_when_both_were_read() -> None:
    assert ClusterView(2, 16.0).satisfies(2, 16)
    assert not ClusterView(2, 8.0).satisfies(2, 16)
    assert not ClusterView(1, 16.0).satisfies(2, 16)
    assert not ClusterView(None, 16.0).satisfies(1, 16)


def status_script(outputs: list[tuple[int, str]]):
    calls = []

    async def run() -> tuple[int, str]:
        calls.append(trio.current_time())
        return outputs[min(len(calls), len(outputs)) - 1]

    return run, calls


async def test_wait_for_cluster_returns_once_every_node_joined(autojump_clock) -> None:
    one = RAY2_TWO_NODES.replace(" 1 node_a2b3", " 0 node_a2b3").replace("16.0 GPU", "8.0 GPU")
    run, calls = status_script([(1, "ConnectionError"), (0, one), (0, RAY2_TWO_NODES)])
    start = trio.current_time()
    view = await wait_for_cluster(run, nodes=2, gpus=16, timeout_s=60, interval_s=2)
    assert view == ClusterView(2, 16.0)
    assert len(calls) == 3 and calls[-1] - start == pytest.approx(4.0)


async def test_wait_for_cluster_times_out_saying_what_it_saw(autojump_clock) -> None:
    run, calls = status_script([(0, RAY1_CPU_ONLY)])
    start = trio.current_time()
    with pytest.raises(RayWaitTimeout) as caught:
        await wait_for_cluster(run, nodes=2, gpus=16, timeout_s=30, interval_s=2)
    assert trio.current_time() - start == pytest.approx(30.0)
    assert "wanted 2 nodes and 16 GPUs" in str(caught.value)
    assert "nodes=3 gpus=0.0" in str(caught.value) and "Healthy:" in str(caught.value)
    assert 14 <= len(calls) <= 16


async def test_wait_reachable_retries_until_a_connection_succeeds(autojump_clock) -> None:
    attempts = []

    class Closed:
        closed = False

        async def aclose(self) -> None:
            Closed.closed = True

    async def connect(host: str, port: int):
        attempts.append((host, port))
        if len(attempts) < 3:
            raise ConnectionRefusedError(111, "Connection refused")
        return Closed()

    await wait_reachable("10.90.0.1", 6379, timeout_s=60, interval_s=1, connect=connect)
    assert attempts == [("10.90.0.1", 6379)] * 3 and Closed.closed


async def test_wait_reachable_times_out_with_the_last_error(autojump_clock) -> None:
    async def hang(host: str, port: int):
        await trio.sleep_forever()

    with pytest.raises(RayWaitTimeout, match="connect timed out after 5s"):
        await wait_reachable("10.90.0.1", 6379, timeout_s=20, interval_s=1, connect=hang)

    async def refuse(host: str, port: int):
        raise ConnectionRefusedError(111, "Connection refused")

    with pytest.raises(RayWaitTimeout, match=r"10\.90\.0\.1:6379 not reachable after 20s: "
                                             "Connection refused"):
        await wait_reachable("10.90.0.1", 6379, timeout_s=20, interval_s=1, connect=refuse)


def test_addresses_split_with_ipv6_brackets() -> None:
    assert split_address("10.0.0.1:6379") == ("10.0.0.1", 6379)
    assert split_address("[fd00::1]:6380") == ("fd00::1", 6380)
    for bad in ("10.0.0.1", ":6379", "h:0", "h:port"):
        with pytest.raises(ValueError):
            split_address(bad)


def test_main_refuses_bad_arguments_with_exit_2(capsys) -> None:
    for argv in (["--address", "nowhere", "--reachable", "--timeout-s", "1"],
                 ["--address", "h:1", "--timeout-s", "1"],
                 ["--address", "h:1", "--reachable", "--timeout-s", "0"]):
        with pytest.raises(SystemExit) as caught:
            main(argv)
        assert caught.value.code == 2


def test_main_exits_1_when_nothing_listens(capsys) -> None:
    # Port 1 on loopback: nothing listens there, the refusal is immediate.
    code = main(["--address", "127.0.0.1:1", "--reachable", "--timeout-s", "0.2",
                 "--interval-s", "0.1"])
    assert code == 1
    assert "127.0.0.1:1 not reachable after 0.2s" in capsys.readouterr().err
