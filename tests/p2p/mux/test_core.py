"""The sans-IO mux core: two cores piped into each other, and a state machine."""


from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from p2p.mux import (
    MuxConfig,
    MuxCore,
    MuxUsageError,
)
from p2p.mux._core import ChannelPhase
from p2p.mux._frames import MESSAGE_OVERHEAD_BYTES
from tests.examples import examples

SMALL = MuxConfig(initial_window_bytes=1024, max_message_bytes=512, max_send_buffer_bytes=4096)
#: The smallest budget SMALL's window allows (two windows): channels compete for it.
TIGHT = MuxConfig(
    initial_window_bytes=1024, max_message_bytes=512, max_send_buffer_bytes=4096,
    receive_budget_bytes=2048,
)


# ---------------------------------------------------------------------------
# Core, no trio


def transfer(src: MuxCore, dst: MuxCore) -> list:
    return dst.receive_data(src.data_to_send())


def test_core_pair_opens_by_listener_and_moves_a_message():
    a, b = MuxCore(SMALL), MuxCore(SMALL)
    b.listen("echo")
    ca = a.open("echo", b"1")
    transfer(a, b)
    cb = b.accept_nowait("echo")
    assert cb is not None and cb.phase is ChannelPhase.OPEN
    transfer(b, a)
    assert ca.phase is ChannelPhase.OPEN and ca.send_credit == 1024
    a.send_message(ca, b"hi")
    transfer(a, b)
    assert b.receive_message(cb) == b"hi"
    assert b.receive_message(cb) is None


def test_core_close_frees_the_number_only_after_close_went_both_ways():
    a, b = MuxCore(SMALL), MuxCore(SMALL)
    b.listen("p")
    ca = a.open("p")
    transfer(a, b)
    cb = b.accept_nowait("p")
    transfer(b, a)
    a.close(ca)
    assert a.channel_count == 1
    transfer(a, b)
    assert cb.phase is ChannelPhase.FREED and b.channel_count == 0
    transfer(b, a)
    assert a.channel_count == 0
    assert a.open("p").local == ca.local  # the number is reused


class CorePairMachine(RuleBasedStateMachine):
    """Random open/send/consume/end/close orders on a pair of cores."""

    def __init__(self) -> None:
        super().__init__()
        self.cores = [MuxCore(TIGHT), MuxCore(TIGHT)]
        for core in self.cores:
            core.listen("p0")
        self.channels: list[tuple[int, object]] = []  # (side, ChannelState)
        self.sent_seq: dict[tuple[int, int], int] = {}
        self.recv_seq: dict[tuple[int, int], int] = {}
        self.sent_bytes: dict[tuple[int, int], int] = {}
        self.recv_bytes: dict[tuple[int, int], int] = {}

    def _deliver(self, side: int, cut: int | None = None) -> None:
        src, dst = self.cores[side], self.cores[1 - side]
        data = src.data_to_send()
        if cut is not None and data:
            cut %= len(data) + 1
            dst.receive_data(data[:cut])
            dst.receive_data(data[cut:])
        else:
            dst.receive_data(data)
        for core_side, core in enumerate(self.cores):
            for proto in ("p0",):
                while (accepted := core.accept_nowait(proto)) is not None:
                    self.channels.append((core_side, accepted))

    @rule(side=st.integers(0, 1), proto=st.sampled_from(["p0", "p1"]), cid=st.binary(max_size=1))
    def open(self, side, proto, cid):
        core = self.cores[side]
        try:
            chan = core.open(proto, cid)
        except MuxUsageError as exc:
            assert exc.code == "DUPLICATE_CHANNEL"
            return
        self.channels.append((side, chan))

    @rule(side=st.integers(0, 1), cut=st.integers(0, 10_000))
    def deliver(self, side, cut):
        self._deliver(side, cut)

    @initialize(n=st.integers(1, 3))
    def open_some_pairs(self, n):
        for i in range(n):
            self.channels.append((0, self.cores[0].open("p0", bytes([100 + i]))))
        self._deliver(0)
        self._deliver(1)

    @precondition(lambda self: self.channels)
    @rule(i=st.integers(0, 1000), size=st.one_of(st.integers(0, 40), st.integers(0, 512)),
          repeat=st.integers(1, 8))
    def send(self, i, size, repeat):
        sendable = [
            (side, chan) for side, chan in self.channels
            if chan.phase is ChannelPhase.OPEN and not chan.sent_end and not chan.sent_close
        ]
        if not sendable:
            return
        side, chan = sendable[i % len(sendable)]
        for _ in range(repeat):
            self._send_one(side, chan, size)

    def _send_one(self, side, chan, size):
        core = self.cores[side]
        if not core.can_send(chan, size):
            return
        key = id(chan)  # numbers are reused; the record object is not
        seq = self.sent_seq.get(key, 0)
        self.sent_seq[key] = seq + 1
        header = f"{side}:{chan.local}:{chan.remote}:{seq}:".encode()
        payload = (header + b"." * size)[: max(size, len(header))]
        if len(payload) > core.max_send_bytes(chan) or not core.can_send(chan, len(payload)):
            self.sent_seq[key] = seq
            return
        core.send_message(chan, payload)
        self.sent_bytes[id(chan)] = self.sent_bytes.get(id(chan), 0) + len(payload)

    @precondition(lambda self: self.channels)
    @rule(i=st.integers(0, 1000), repeat=st.integers(1, 8))
    def consume_some(self, i, repeat):
        readable = [n for n, (_side, chan) in enumerate(self.channels) if chan.inbox]
        if readable:
            for _ in range(repeat):
                self.consume(readable[i % len(readable)])

    def consume(self, i):
        side, chan = self.channels[i % len(self.channels)]
        msg = self.cores[side].receive_message(chan)
        if msg is None:
            return
        peer_side, peer_local, my_local, seq = msg.split(b":")[:4]
        assert int(peer_side) == 1 - side
        assert int(my_local) == chan.local
        assert int(peer_local) == chan.remote
        key = id(chan)  # one receiving record hears one sender
        expected = self.recv_seq.get(key, 0)
        assert int(seq) == expected, "messages arrive in order, none lost"
        self.recv_seq[key] = expected + 1
        self.recv_bytes[key] = self.recv_bytes.get(key, 0) + len(msg)

    @precondition(lambda self: self.channels)
    @rule(i=st.integers(0, 1000))
    def end(self, i):
        side, chan = self.channels[i % len(self.channels)]
        self.cores[side].send_end(chan)

    @precondition(lambda self: self.channels)
    @rule(i=st.integers(0, 1000))
    def close(self, i):
        side, chan = self.channels[i % len(self.channels)]
        self.cores[side].close(chan)

    @rule()
    def settle_and_check_byte_accounting(self):
        for _ in range(4):
            self._deliver(0)
            self._deliver(1)
        for side, chan in self.channels:
            if chan.app_closed:
                continue
            # drain everything that arrived on this channel
            while True:
                before = chan.inbox_bytes
                self.consume(self.channels.index((side, chan)))
                if chan.inbox_bytes == before:
                    break
        for _ in range(4):
            self._deliver(0)
            self._deliver(1)
        for side, chan in self.channels:
            if chan.phase is not ChannelPhase.OPEN or chan.app_closed or chan.got_close:
                continue
            peer = self.cores[1 - side]
            peer_chan = next(
                (c for s, c in self.channels if s == 1 - side and c.local == chan.remote
                 and c.remote == chan.local and c.phase is ChannelPhase.OPEN),
                None,
            )
            if peer_chan is None or peer_chan.app_closed:
                continue
            assert peer is not None
            sent = self.sent_bytes.get(id(peer_chan), 0)
            assert chan.bytes_received == peer_chan.bytes_sent == sent
        if not any(core.outgoing_bytes for core in self.cores):
            # Nothing in flight: the sender's view of the budget is the receiver's,
            # and the receiver's budget is split into granted, buffered, unreported.
            budget = TIGHT.receive_budget_bytes
            for side in (0, 1):
                rx, tx = self.cores[side], self.cores[1 - side]
                assert tx.send_budget == rx.flow.budget.allowed
                owed = rx.flow.budget.unreported
                assert rx.flow.budget.allowed + rx.buffered_bytes + owed == budget

    @invariant()
    def credit_is_never_negative_and_buffers_stay_within_window_and_budget(self):
        for _side, chan in self.channels:
            assert chan.send_credit >= 0
            assert chan.recv.allowed >= 0
            assert 0 <= chan.inbox_bytes <= chan.window
        for side, core in enumerate(self.cores):
            assert core.failed is None
            assert 0 <= core.buffered_bytes <= core.buffered_bytes_peak
            assert core.buffered_bytes_peak <= TIGHT.receive_budget_bytes
            assert core.flow.budget.allowed >= 0 and core.send_budget >= 0
            assert core.flow.budget.unreported < TIGHT.receive_budget_bytes >> 3
            held = [chan for s, chan in self.channels if s == side]
            assert core.buffered_bytes == sum(chan.inbox_bytes for chan in held)
            for chan in held:  # a message costs its length + 64, in either account
                assert chan.inbox_bytes == sum(len(m) + MESSAGE_OVERHEAD_BYTES for m in chan.inbox)


TestCorePairMachine = CorePairMachine.TestCase
TestCorePairMachine.settings = settings(
    max_examples=examples(100), stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
