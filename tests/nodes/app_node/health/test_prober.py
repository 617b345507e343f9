"""The prober on trio's autojump clock: a round every interval, a row for every
service whatever it does (answers, hangs past the timeout, refuses, breaks,
crashes), a failing store logged and survived, pruning to the retention; and the
in-process probes of the database replica and the email outbox."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio

from contracts.health import package_version
from crdt import Database, FsyncPolicy
from nodes.app_node.email import EmailKind, EmailMessage, OutboxSender
from nodes.app_node.health import (
    HealthProber,
    app_node_target,
    database_status,
    email_target,
    probe,
)
from p2p.keys import KeyPair

from .fakes import FakeService, MemoryHealthStore, WallClock


async def test_a_service_going_down_and_up_is_a_row_every_interval(autojump_clock) -> None:
    store, ork = MemoryHealthStore(), FakeService("wrk-ork")
    monitor = FakeService("wrk-monitor")
    prober = HealthProber(store, [ork.target, monitor.target, app_node_target()],
                          interval_s=15.0, timeout_s=5.0, clock=WallClock())
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            await nursery.start(prober.run)
            await trio.sleep(20)       # rounds at 0 and 15
            ork.mode = "hang"
            await trio.sleep(15)       # round at 30
            ork.mode = "refuse"
            await trio.sleep(15)       # round at 45
            ork.mode = "up"
            ork.queue_depth = 4
            await trio.sleep(15)       # round at 60
            nursery.cancel_scope.cancel()
    ork_rows = [r for r in store.rows if r.service == "wrk-ork"]
    start = WallClock().start
    assert [r.at - start for r in ork_rows] == pytest.approx([0.0, 15.0, 30.0, 45.0, 60.0])
    assert [(r.reachable, r.up) for r in ork_rows] == [
        (True, True), (True, True), (False, False), (True, False), (True, True)]
    hung, refused = ork_rows[2], ork_rows[3]
    assert hung.error == "no answer within 5 s" and hung.latency_ms == pytest.approx(5000, abs=1)
    assert refused.error.startswith("FORBIDDEN: only app-node")
    assert ork_rows[-1].queue_depth == 4 and ork_rows[-1].last_report_at == 123.0
    assert ork_rows[0].latency_ms == pytest.approx(20, abs=1)
    assert ork_rows[0].version == package_version()
    # The schedule is kept even though the round at 30 s took the whole timeout.
    assert all(r.up for r in store.rows if r.service != "wrk-ork")
    assert len(store.rows) == 15 and prober.statistics().rounds == 5
    assert prober.services == ("wrk-ork", "wrk-monitor", "app-node")


async def test_no_answer_in_any_way_is_a_row_never_a_crash(autojump_clock) -> None:
    service = FakeService()
    for mode, reachable, error in [
        ("gone", False, "CHANNEL_CLOSED: the RPC channel ended"),
        ("crash", False, "ValueError: a bug in the probe"),
        ("hang", False, "no answer within 2 s"),
    ]:
        service.mode = mode
        with trio.fail_after(10):
            row = await probe(service.target, timeout_s=2.0, clock=lambda: 5.0)
        assert (row.reachable, row.error, row.at) == (reachable, error, 5.0)


async def test_a_failing_store_is_logged_once_and_survived(autojump_clock, caplog) -> None:
    store = MemoryHealthStore()
    prober = HealthProber(store, [FakeService().target], interval_s=10.0, timeout_s=1.0,
                          clock=WallClock())
    caplog.set_level(logging.WARNING, logger="nodes.app_node.health._prober")
    store.failing = True
    with trio.fail_after(10):
        await prober.run_once()
        await prober.run_once()
        store.failing = False
        await prober.run_once()
    assert [r.message for r in caplog.records].count(
        "health.store_failed reason=memory store told to fail; rows are lost until it works") == 1
    assert any("health.store_recovered" in r.message for r in caplog.records)
    assert prober.statistics().store_errors == 2 and len(store.rows) == 1


async def test_rows_older_than_the_retention_are_pruned_every_ten_minutes(
        autojump_clock) -> None:
    store, clock = MemoryHealthStore(), WallClock()
    prober = HealthProber(store, [FakeService().target], interval_s=60.0, timeout_s=1.0,
                          retention_s=300.0, clock=clock)
    with trio.fail_after(3600):
        async with trio.open_nursery() as nursery:
            await nursery.start(prober.run)
            await trio.sleep(1230)
            nursery.cancel_scope.cancel()
    assert len(store.pruned) == 3  # at 0, 600 and 1200 s
    assert all(row.at >= clock() - 300.0 - 60.0 for row in store.rows)
    assert len(store.rows) <= 6


def test_a_timeout_longer_than_the_interval_is_refused() -> None:
    with pytest.raises(ValueError):
        HealthProber(MemoryHealthStore(), [], interval_s=5.0, timeout_s=6.0)


async def test_the_database_probe_reports_writers_peers_and_lag(tmp_path: Path) -> None:
    db = await Database.open(tmp_path / "db", KeyPair.generate(), fsync=FsyncPolicy.NEVER)
    try:
        status = database_status(db)
        assert status.service == "database" and status.queue_depth == 0
        assert status.details["writers"] == 1 and status.details["admin"] is True
        assert status.details["peers"] == 0

        class Peer:  # what the replicator knows of a peer: its writers' lengths
            lengths = {db.key: 7}

        class Replicator:
            peers = {b"p" * 32: Peer()}

        behind = database_status(db, Replicator())  # type: ignore[arg-type]
        assert behind.queue_depth == 7 - db.lengths.get(db.key, 0)
        assert behind.details["behind"] == behind.queue_depth
    finally:
        await db.aclose()


async def test_the_email_probe_counts_the_outbox(tmp_path: Path) -> None:
    sender = OutboxSender(tmp_path / "outbox")
    target = email_target(sender)
    status = await target.ask(1.0)
    assert status.queue_depth == 0 and status.last_report_at is None
    for n in range(3):
        await sender.send(EmailMessage(kind=EmailKind.INVITATION, to=["a@example.com"],
                                       subject="hi", text="hello", idempotency_key=f"k{n}"))
    status = await target.ask(1.0)
    assert status.queue_depth == 3 and status.last_report_at is not None
    assert status.details == {"backend": "outbox"}

    class SmtpSender:
        pass

    other = await email_target(SmtpSender()).ask(1.0)
    assert other.queue_depth == 0 and other.details == {"backend": "smtp"}


class FakeOrkRacks:
    """wrk-ork's ``racks.list`` as the workers source calls it (a PeerClient's ``call``)."""

    def __init__(self, racks) -> None:
        self.racks = racks
        self.down = False

    async def call(self, method, params, *, timeout_s=None):
        from contracts.ork import RackList

        assert method.name == "racks.list"
        if self.down:
            await trio.sleep_forever()
        return RackList(racks=self.racks)


def rack(name: str, *, reported=True, silent=False, last=None):
    from contracts.ork import RackInfo

    return RackInfo(key=name.encode().hex().ljust(64, "0"), location="eu-1", name=name,
                    registered_at=1.0, reported=reported, silent=silent, nodes=2, gpus=16,
                    free=8, overlay_network=False, jobs=1, last_report_at=last)


async def test_each_worker_is_a_row_as_wrk_ork_hears_it(autojump_clock) -> None:
    from nodes.app_node.health import workers_source

    store = MemoryHealthStore()
    ork = FakeOrkRacks([rack("h100-a", last=1_799_999_990.0), rack("h100-b", silent=True),
                        rack("new", reported=False)])
    prober = HealthProber(store, [app_node_target()], sources=[workers_source(ork)],
                          interval_s=15.0, timeout_s=5.0, clock=WallClock())
    with trio.fail_after(600):
        await prober.run_once()
        rows = {r.service: r for r in store.rows}
        assert prober.services == ("app-node", "worker h100-a", "worker h100-b", "worker new")
        a, b, new = rows["worker h100-a"], rows["worker h100-b"], rows["worker new"]
        assert a.up and a.last_report_at == 1_799_999_990.0 and a.details["gpus"] == 16
        assert not b.reachable and "silent" in b.error
        assert not new.reachable and new.error == "never reported to wrk-ork"
        # A rack removed from wrk-ork is no longer watched (its rows stay history).
        ork.racks = ork.racks[:1]
        await prober.run_once()
        assert prober.services == ("app-node", "worker h100-a")
        # wrk-ork not answering: no worker rows this round, the last ones kept
        # watched (they go stale: nothing is known of them now), app-node's row still.
        ork.down = True
        before = len(store.rows)
        await prober.run_once()
        assert [r.service for r in store.rows[before:]] == ["app-node"]
        assert prober.services == ("app-node", "worker h100-a")
