"""nodes/kit/telemetry.py: off without a monitor; with one, the daemon's log records
(with their job) reach wrk-monitor over the swarm, the handler goes when the
daemon stops, the metrics count, a drop episode warns once; and each daemon's
``telemetry`` settings parse from its environment."""

from __future__ import annotations

import logging

import pytest
import trio

from nodes.app_node.settings import AppNodeSettings
from nodes.k8s_worker.settings import WorkerSettings
from nodes.kit.telemetry import TelemetrySettings, start_telemetry, telemetry_host
from nodes.monitor._buffer import LogBuffer
from nodes.monitor.service import MonitorService
from nodes.ork.settings import OrkSettings
from nodes.proxy_inference.settings import ProxySettings
from p2p.daemon import ConfigError, ProcessMetrics, load_settings
from p2p.keys import KeyPair

MONITOR = KeyPair.generate()
STEPS = logging.getLogger("nodes.ork.service")


async def until(condition, step: float = 0.01, limit: int = 10_000) -> None:
    """Wait (in virtual time) for ``condition``, at most ``limit`` steps."""
    for _ in range(limit):
        if condition():
            return
        await trio.sleep(step)
    raise AssertionError("condition never held")


def shipper_handlers() -> list[logging.Handler]:
    return [h for h in logging.getLogger().handlers if type(h).__name__ == "ShipperHandler"]


def sample(metrics: ProcessMetrics, name: str) -> float | None:
    return metrics.registry.get_sample_value(name)


async def test_without_a_monitor_telemetry_is_off(nursery) -> None:
    metrics = ProcessMetrics()
    shipper = await start_telemetry(telemetry_host(nursery, metrics), object(),
                                    TelemetrySettings(), service="wrk-ork")
    assert shipper is None
    assert shipper_handlers() == []
    assert sample(metrics, "telemetry_records_pending") is None


async def test_records_reach_the_monitor_with_their_job_and_the_handler_goes_at_stop(
        autojump_clock, caplog) -> None:
    from tests.p2p.swarm.helpers import FAST_STREAMS, memory_swarm_net

    caplog.set_level(logging.INFO)
    service = MonitorService(LogBuffer(), allow_any_pusher=True)
    metrics = ProcessMetrics()
    with trio.fail_after(60):
        async with memory_swarm_net() as net:
            await net.start(MONITOR, connection=FAST_STREAMS, services=[service])
            swarm = await net.start(connection=FAST_STREAMS)
            async with trio.open_nursery() as daemon:
                shipper = await start_telemetry(
                    telemetry_host(daemon, metrics), swarm,
                    TelemetrySettings(monitor=MONITOR.public_key, level="info"),
                    service="wrk-ork")
                assert shipper is not None and len(shipper_handlers()) == 1
                assert any(r.msg.startswith("telemetry.started") for r in caplog.records)
                STEPS.info("pending: no free GPUs", extra={"job_id": "j-1", "replica": 0})
                STEPS.debug("below the level: not shipped", extra={"job_id": "j-1"})

                def steps() -> list:
                    return [r for _, r in service.buffer.records() if r.job_id == "j-1"]

                await until(lambda: steps())
                [record] = steps()
                assert (record.text, record.replica, record.service, record.source,
                        record.level) == ("pending: no free GPUs", 0, "wrk-ork", "System",
                                          logging.INFO)
                # pending is 0 once the batch is taken; sent counts it on the ack.
                await until(lambda: shipper.pending == 0 and shipper.sent >= 1)
                assert sample(metrics, "telemetry_records_sent_total") == shipper.sent
                assert sample(metrics, "telemetry_connected") == 1.0
                assert sample(metrics, "telemetry_records_dropped_total") == 0
                daemon.cancel_scope.cancel()
            assert shipper_handlers() == []
            assert sample(metrics, "telemetry_records_pending") is None
            STEPS.info("after the stop", extra={"job_id": "j-1"})
            assert shipper.pending == 0


async def test_a_drop_episode_warns_once_and_is_counted(autojump_clock, caplog) -> None:
    from tests.p2p.swarm.helpers import memory_swarm_net

    caplog.set_level(logging.INFO)
    metrics = ProcessMetrics()
    with trio.fail_after(60):
        async with memory_swarm_net() as net:  # wrk-monitor never starts
            swarm = await net.start()
            async with trio.open_nursery() as daemon:
                shipper = await start_telemetry(
                    telemetry_host(daemon, metrics), swarm,
                    TelemetrySettings(monitor=MONITOR.public_key, max_records=50),
                    service="wrk-ork")
                assert shipper is not None
                for i in range(200):
                    STEPS.info("step %d", i, extra={"job_id": "j-2"})
                await trio.sleep(3)
                for i in range(200):
                    STEPS.info("more %d", i)
                await trio.sleep(3)
                warnings = [r for r in caplog.records if r.msg.startswith("telemetry.dropping")]
                assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
                assert shipper.pending == 50 and shipper.dropped >= 350
                assert sample(metrics, "telemetry_records_dropped_total") == shipper.dropped
                assert sample(metrics, "telemetry_records_pending") == 50
                assert sample(metrics, "telemetry_connected") == 0.0
                daemon.cancel_scope.cancel()


async def test_a_proxy_without_metrics_ships_to_the_listed_address(autojump_clock) -> None:
    from tests.p2p.swarm.helpers import FAST_STREAMS, memory_swarm_net

    service = MonitorService(LogBuffer(), allow_any_pusher=True)
    with trio.fail_after(60):
        async with memory_swarm_net() as net:
            monitor = await net.start(MONITOR, connection=FAST_STREAMS, services=[service])
            swarm = await net.start(connection=FAST_STREAMS)
            async with trio.open_nursery() as daemon:
                shipper = await start_telemetry(
                    telemetry_host(daemon, None), swarm,
                    TelemetrySettings(monitor=MONITOR.public_key,
                                      monitor_addresses=[monitor.address]),
                    service="proxy-inference")
                assert shipper is not None
                shipper.offer(shipper_record())
                await until(lambda: shipper.sent >= 1)
                daemon.cancel_scope.cancel()


def shipper_record():
    from contracts.monitor import make_record

    return make_record("hello", service="proxy-inference", job_id="j-3")


# -- settings -------------------------------------------------------------------------------


KEY = MONITOR.public_key.hex()


@pytest.mark.parametrize("cls, prefix, required", [
    (OrkSettings, "COSMICAC_ORK__", {}),
    (WorkerSettings, "K8S_COMMON_CONFIG__", {"ORK": KeyPair.generate().public_key.hex()}),
    (ProxySettings, "COSMICAC_PROXY__", {}),
])
def test_telemetry_settings_come_from_the_environment(tmp_path, cls, prefix, required) -> None:
    environ = {f"{prefix}STORAGE": str(tmp_path),
               **{f"{prefix}{k}": v for k, v in required.items()},
               f"{prefix}TELEMETRY__MONITOR": KEY,
               f"{prefix}TELEMETRY__MONITOR_ADDRESSES": "127.0.0.1:49743,10.0.0.5:49743",
               f"{prefix}TELEMETRY__MAX_RECORDS": "5000",
               f"{prefix}TELEMETRY__LEVEL": "WARNING"}
    telemetry = load_settings(cls, environ=environ).telemetry
    assert telemetry == TelemetrySettings(
        monitor=MONITOR.public_key, monitor_addresses=(("127.0.0.1", 49743), ("10.0.0.5", 49743)),
        max_records=5000, level="warning")
    off = load_settings(cls, environ={f"{prefix}STORAGE": str(tmp_path),
                                      **{f"{prefix}{k}": v for k, v in required.items()}})
    assert off.telemetry.monitor is None


@pytest.mark.parametrize("name, value, key", [
    ("TELEMETRY__MONTOR", KEY, "telemetry"),
    ("TELEMETRY__MONITOR", "not-a-key", "telemetry.monitor"),
    ("TELEMETRY__MAX_RECORDS", "0", "telemetry.max_records"),
], ids=["misspelt", "not-a-key", "zero-records"])
def test_a_bad_telemetry_setting_names_its_key(tmp_path, name, value, key) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(OrkSettings, environ={"COSMICAC_ORK__STORAGE": str(tmp_path),
                                            f"COSMICAC_ORK__{name}": value})
    assert key in str(caught.value)


def test_app_node_ships_to_the_monitor_it_reads_logs_from(tmp_path) -> None:
    base = {"COSMICAC_APP_NODE__STORAGE": str(tmp_path),
            "COSMICAC_APP_NODE__MONITOR": KEY,
            "COSMICAC_APP_NODE__MONITOR_ADDRESSES": "127.0.0.1:49743"}
    shipping = load_settings(AppNodeSettings, environ=base).telemetry_settings()
    assert shipping.monitor == MONITOR.public_key
    assert shipping.monitor_addresses == (("127.0.0.1", 49743),)
    quiet = load_settings(AppNodeSettings, environ={
        **base, "COSMICAC_APP_NODE__TELEMETRY__SHIP": "false",
        "COSMICAC_APP_NODE__TELEMETRY__MAX_RECORDS": "10"})
    assert quiet.telemetry_settings().monitor is None and quiet.monitor == MONITOR.public_key
    no_monitor = load_settings(AppNodeSettings,
                               environ={"COSMICAC_APP_NODE__STORAGE": str(tmp_path)})
    assert no_monitor.telemetry_settings().monitor is None
    with pytest.raises(ConfigError):  # no second key: the section has no monitor
        load_settings(AppNodeSettings, environ={**base, "COSMICAC_APP_NODE__TELEMETRY__MONITOR":
                                                KEY})
