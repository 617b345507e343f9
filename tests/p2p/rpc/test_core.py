"""The sans-IO RPC cores: unit cases and a state machine over client/server sequences."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from p2p.rpc import ProtocolViolation, RpcClientCore, RpcConfig, RpcServerCore, RpcUsageError
from p2p.rpc._messages import (
    MAX_REQUEST_ID,
    Cancel,
    Error,
    Request,
    Response,
    StreamCredit,
    StreamEnd,
    StreamItem,
    StreamRequest,
    decode_message,
    encode_fields,
    encode_message,
)
from tests.examples import examples


def test_ids_wrap_below_2_to_the_32_and_skip_calls_in_flight():
    client = RpcClientCore()
    client._next_id = MAX_REQUEST_ID
    first = client.send_request("m", {})
    assert first == MAX_REQUEST_ID
    assert client.send_request("m", {}) == 0
    client._next_id = MAX_REQUEST_ID  # the next two candidates are both in flight
    assert client.send_request("m", {}) == 1


def test_the_client_table_is_bounded():
    client = RpcClientCore(RpcConfig(max_in_flight_calls=2))
    client.send_request("m", {})
    client.send_stream_request("s", {})
    with pytest.raises(RpcUsageError) as info:
        client.send_request("m", {})
    assert info.value.code == "TOO_MANY_CALLS"


def test_the_server_answers_busy_itself_at_its_bound_and_drops_duplicate_ids():
    server = RpcServerCore(RpcConfig(max_concurrent_calls=1))
    assert server.receive_message(encode_message(Request(1, "m", {}))) == Request(1, "m", {})
    assert server.receive_message(encode_message(Request(1, "m", {}))) is None
    assert server.bad_messages == 1
    assert server.receive_message(encode_message(Request(2, "m", {}))) is None
    (busy,) = server.messages_to_send()
    assert decode_message(busy) == Error(2, "BUSY", "too many concurrent calls; retry later")
    assert server.busy_replies == 1


def test_answers_for_calls_not_running_are_usage_errors():
    server = RpcServerCore()
    for send in (
        lambda: server.send_response(5, {}),
        lambda: server.send_error(5, "X", "x"),
        lambda: server.send_item(5, {}),
        lambda: server.send_end(5),
    ):
        with pytest.raises(RpcUsageError) as info:
            send()
        assert info.value.code == "NOT_RUNNING"


def test_credit_goes_back_in_batches_of_half_the_window():
    client = RpcClientCore(RpcConfig(stream_window_items=4))
    rid = client.send_stream_request("s", {})
    client.messages_to_send()
    for _ in range(4):
        assert isinstance(client.receive_message(encode_message(StreamItem(rid, {}))), StreamItem)
    client.item_taken(rid)
    assert client.messages_to_send() == []
    client.item_taken(rid)
    assert [decode_message(m) for m in client.messages_to_send()] == [StreamCredit(rid, 2)]


# -- state machine -----------------------------------------------------------------

WINDOW = 3
CONFIG = RpcConfig(max_concurrent_calls=3, max_in_flight_calls=4, stream_window_items=WINDOW)

garbage = st.one_of(
    st.binary(max_size=24),
    st.builds(lambda v: msgpack.packb(v), st.lists(st.integers(-2, 2**33), max_size=5)),
)


class RpcCores(RuleBasedStateMachine):
    """A client core and a server core joined by two in-order message queues.

    The client starts, cancels and consumes calls; the server answers, streams
    and fails them; messages are delivered in order, a few at a time; garbage and
    messages of the wrong direction are thrown at both. Checked: neither core
    raises on any input, the tables stay within their bounds, an honest server
    never exceeds a stream's credit, no answer reaches a call after it ended or
    was cancelled, and every unary call gets exactly one answer unless cancelled.
    """

    def __init__(self) -> None:
        super().__init__()
        self.client = RpcClientCore(CONFIG)
        self.server = RpcServerCore(CONFIG)
        self.to_server: list[bytes] = []
        self.to_client: list[bytes] = []
        #: Client model: live calls, rid -> "unary" | "stream".
        self.live: dict[int, str] = {}
        self.ended: set[int] = set()
        self.cancelled: set[int] = set()
        #: Items the client got and has not taken yet, per stream.
        self.unconsumed: dict[int, int] = {}
        #: Server model: admitted calls, rid -> "unary" | "stream".
        self.running: dict[int, str] = {}
        self.rogue = False
        self.answers: dict[int, int] = {}

    def _flush(self) -> None:
        self.to_server.extend(self.client.messages_to_send())
        self.to_client.extend(self.server.messages_to_send())

    # -- client -------------------------------------------------------------

    @precondition(lambda self: self.client.calls_in_flight < CONFIG.max_in_flight_calls)
    @rule(stream=st.booleans())
    def start(self, stream):
        if stream:
            rid = self.client.send_stream_request("s", {"x": 1})
            self.unconsumed[rid] = 0
        else:
            rid = self.client.send_request("u", {"x": 1})
        assert rid not in self.live
        self.live[rid] = "stream" if stream else "unary"
        self.ended.discard(rid)
        self.cancelled.discard(rid)
        self._flush()

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def cancel(self, data):
        rid = data.draw(st.sampled_from(sorted(self.live)))
        self.client.cancel(rid)
        self.client.cancel(rid)  # idempotent
        del self.live[rid]
        self.cancelled.add(rid)
        self._flush()

    @precondition(lambda self: any(n for n in self.unconsumed.values()))
    @rule(data=st.data())
    def take_item(self, data):
        rid = data.draw(st.sampled_from(sorted(r for r, n in self.unconsumed.items() if n)))
        self.unconsumed[rid] -= 1
        self.client.item_taken(rid)
        self._flush()

    # -- server -------------------------------------------------------------

    def _pick_running(self, data, kind):
        ids = sorted(r for r, k in self.running.items() if k == kind)
        return data.draw(st.sampled_from(ids))

    @precondition(lambda self: "unary" in self.running.values())
    @rule(data=st.data(), fail=st.booleans())
    def answer(self, data, fail):
        rid = self._pick_running(data, "unary")
        if fail:
            self.server.send_error(rid, "NOPE", "no")
        else:
            self.server.send_response(rid, {"ok": True})
        del self.running[rid]
        self._flush()

    @precondition(lambda self: "stream" in self.running.values())
    @rule(data=st.data())
    def send_item(self, data):
        rid = self._pick_running(data, "stream")
        if self.server.item_credit(rid) > 0:
            self.server.send_item(rid, {"n": 1})
        else:
            with pytest.raises(RpcUsageError):
                self.server.send_item(rid, {"n": 1})
        self._flush()

    @precondition(lambda self: "stream" in self.running.values())
    @rule(data=st.data(), fail=st.booleans())
    def end_stream(self, data, fail):
        rid = self._pick_running(data, "stream")
        if fail:
            self.server.send_error(rid, "BROKE", "broke")
        else:
            self.server.send_end(rid)
        del self.running[rid]
        self._flush()

    # -- the wire -----------------------------------------------------------

    @precondition(lambda self: self.to_server)
    @rule(n=st.integers(1, 4))
    def deliver_to_server(self, n):
        batch, self.to_server = self.to_server[:n], self.to_server[n:]
        for data in batch:
            ev = self.server.receive_message(data)
            t = type(ev)
            if t is Request or t is StreamRequest:
                assert ev.id not in self.running
                self.running[ev.id] = "stream" if t is StreamRequest else "unary"
            elif t is Cancel:
                assert self.server.is_cancelled(ev.id)
            elif t is StreamCredit:
                assert self.running.get(ev.id) == "stream"
            else:
                assert ev is None
        self._flush()

    @precondition(lambda self: self.to_client)
    @rule(n=st.integers(1, 4))
    def deliver_to_client(self, n):
        batch, self.to_client = self.to_client[:n], self.to_client[n:]
        for data in batch:
            ev = self.client.receive_message(data)
            if ev is None:
                continue
            rid = ev.id
            assert rid in self.live, f"an event for a call that is not live: {ev!r}"
            kind = self.live[rid]
            if isinstance(ev, ProtocolViolation):
                assert self.rogue, "an honest server exceeded a stream's credit"
                del self.live[rid]
                self.cancelled.add(rid)
            elif isinstance(ev, StreamItem):
                assert kind == "stream"
                self.unconsumed[rid] += 1
                assert self.unconsumed[rid] <= WINDOW
            else:
                assert isinstance(ev, (Response, Error, StreamEnd))
                if kind == "unary":
                    assert not isinstance(ev, StreamEnd)
                    self.answers[rid] = self.answers.get(rid, 0) + 1
                del self.live[rid]
                self.ended.add(rid)
        self._flush()

    # -- hostile input ------------------------------------------------------

    @rule(data=garbage, to_server=st.booleans())
    def garbage(self, data, to_server):
        core = self.server if to_server else self.client
        before = core.bad_messages
        try:
            decode_message(data)
            well_formed = True
        except Exception:
            well_formed = False
        if to_server:
            # Only malformed bytes: a well-formed request would be a real call.
            if well_formed:
                return
            assert core.receive_message(data) is None
        else:
            if well_formed:
                return
            assert self.client.receive_message(data) is None
        assert core.bad_messages == before + 1

    @rule(rid=st.integers(0, 8), to_server=st.booleans())
    def wrong_direction(self, rid, to_server):
        if to_server:
            msg = encode_message(StreamEnd(rid))
            before = self.server.bad_messages
            assert self.server.receive_message(msg) is None
            assert self.server.bad_messages == before + 1
        else:
            msg = encode_message(Request(rid, "x", {}))
            assert self.client.receive_message(msg) is None

    @precondition(lambda self: "stream" in self.live.values())
    @rule(data=st.data())
    def rogue_item(self, data):
        # A server that ignores credit: an item straight onto the wire.
        rid = data.draw(st.sampled_from(sorted(r for r, k in self.live.items() if k == "stream")))
        self.rogue = True
        self.to_client.append(encode_message(StreamItem(rid, {"rogue": True})))

    # -- invariants ---------------------------------------------------------

    @invariant()
    def tables_are_bounded_and_agree(self):
        assert self.client.calls_in_flight == len(self.live) <= CONFIG.max_in_flight_calls
        assert self.server.calls_running == len(self.running) <= CONFIG.max_concurrent_calls
        assert self.client.messages_to_send() == [] and self.server.messages_to_send() == []

    @invariant()
    def unary_calls_get_at_most_one_answer(self):
        assert all(n == 1 for n in self.answers.values())

    @invariant()
    def server_credit_never_exceeds_the_window(self):
        if self.rogue:
            return  # a rogue item took client credit the server never spent
        for rid, kind in self.running.items():
            if kind == "stream":
                assert 0 <= self.server.item_credit(rid) <= WINDOW


TestRpcCores = RpcCores.TestCase
TestRpcCores.settings = settings(
    max_examples=examples(100), stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_the_cores_unchecked_encoder_matches_the_checked_one():
    cases = [
        (Request(3, "m", {"a": 1}), (0, 3, "m", {"a": 1})),
        (Response(3, {"r": b"x"}), (1, 3, {"r": b"x"})),
        (Cancel(9), (3, 9)),
        (StreamItem(4, {"n": 2}), (5, 4, {"n": 2})),
        (StreamCredit(4, 8), (7, 4, 8)),
    ]
    for msg, fields in cases:
        assert encode_fields(fields) == encode_message(msg)
        assert decode_message(encode_fields(fields)) == msg
