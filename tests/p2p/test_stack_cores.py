"""Noise, mux and RPC cores of two peers stacked and driven by piping bytes.

No sockets, no trio: each peer is a Noise transport under a mux core under RPC
cores, as wsproto stacks on h11. Bytes leave one peer's Noise transport and are
fed to the other's; what a layer yields is handed to the layer above by hand.
"""

from __future__ import annotations

import pytest

from p2p.keys import KeyPair
from p2p.mux import MuxConfig, MuxCore
from p2p.mux._core import MessageReceived
from p2p.noise import NEED_DATA, Data, Handshake
from p2p.rpc import (
    ProtocolViolation,
    RpcClientCore,
    RpcConfig,
    RpcServerCore,
    RpcUsageError,
)
from p2p.rpc._messages import (
    Cancel,
    Request,
    Response,
    StreamCredit,
    StreamEnd,
    StreamItem,
    StreamRequest,
    encode_message,
)

ALICE = KeyPair.from_seed(bytes(range(32)))
BOB = KeyPair.from_seed(bytes(range(1, 33)))
PROTOCOL = "test/rpc"


class Peer:
    """One side of the stack: Noise transport -> mux core -> one RPC channel."""

    def __init__(self, transport, mux_config: MuxConfig) -> None:
        self.noise = transport
        self.mux = MuxCore(mux_config)
        self.channel = None  # the RPC channel's ChannelState, once paired
        self.messages: list[bytes] = []  # channel messages for the RPC layer

    def wire_out(self) -> bytes:
        """Encrypt what the mux queued; the bytes to put on the wire."""
        frames = self.mux.data_to_send()
        return bytes(self.noise.send_data(frames)) if frames else b""

    def wire_in(self, data: bytes) -> None:
        """Decrypt bytes from the wire and feed the plaintext to the mux."""
        self.noise.receive_data(data)
        while (event := self.noise.next_event()) is not NEED_DATA:
            assert isinstance(event, Data)
            for ev in self.mux.receive_data(event.data):
                if isinstance(ev, MessageReceived) and ev.channel is self.channel:
                    self.drain()

    def drain(self) -> None:
        while (msg := self.mux.receive_message(self.channel)) is not None:
            self.messages.append(msg)

    def take_messages(self) -> list[bytes]:
        self.drain()
        out, self.messages = self.messages, []
        return out

    def send(self, messages: list[bytes]) -> None:
        for msg in messages:
            assert self.mux.can_send(self.channel, len(msg))
            self.mux.send_message(self.channel, msg)


def pump(a: Peer, b: Peer) -> None:
    """Move bytes both ways until neither side has anything to send."""
    for _ in range(100):
        ab, ba = a.wire_out(), b.wire_out()
        if not ab and not ba:
            return
        if ab:
            b.wire_in(ab)
        if ba:
            a.wire_in(ba)
    raise AssertionError("the peers never went quiet")


def connected_peers(mux_config: MuxConfig | None = None) -> tuple[Peer, Peer]:
    """Handshake (Noise XX), then pair one mux channel; Alice dials, Bob listens."""
    mux_config = mux_config or MuxConfig()
    initiator = Handshake(ALICE, initiator=True, expected_remote_key=BOB.public_key)
    responder = Handshake(BOB, initiator=False)
    m2 = responder.receive_data(initiator.initiate())
    m3 = initiator.receive_data(m2)
    assert responder.receive_data(m3) == b""
    assert responder.remote_public_key == ALICE.public_key  # what CallContext carries
    alice = Peer(initiator.transport(), mux_config)
    bob = Peer(responder.transport(), mux_config)
    bob.mux.listen(PROTOCOL)
    alice.channel = alice.mux.open(PROTOCOL)
    pump(alice, bob)
    bob.channel = bob.mux.accept_nowait(PROTOCOL)
    assert bob.channel is not None
    return alice, bob


def rpc_round(alice: Peer, client: RpcClientCore, bob: Peer, server: RpcServerCore):
    """Client output -> wire -> server events; server output -> wire -> client events."""
    alice.send(client.messages_to_send())
    pump(alice, bob)
    server_events = [ev for msg in bob.take_messages() if (ev := server.receive_message(msg))]
    return server_events


def deliver_replies(alice: Peer, client: RpcClientCore, bob: Peer, server: RpcServerCore):
    bob.send(server.messages_to_send())
    pump(alice, bob)
    return [ev for msg in alice.take_messages() if (ev := client.receive_message(msg))]


def test_a_call_through_noise_mux_and_rpc_cores_without_sockets_or_trio():
    alice, bob = connected_peers()
    client, server = RpcClientCore(), RpcServerCore()

    rid = client.send_request("add", {"a": 2, "b": 3})
    (request,) = rpc_round(alice, client, bob, server)
    assert request == Request(rid, "add", {"a": 2, "b": 3})
    assert server.calls_running == 1

    server.send_response(rid, {"sum": request.params["a"] + request.params["b"]})
    assert deliver_replies(alice, client, bob, server) == [Response(rid, {"sum": 5})]
    assert client.calls_in_flight == 0 and server.calls_running == 0


def test_a_streamed_call_with_credit_through_the_stacked_cores():
    alice, bob = connected_peers()
    config = RpcConfig(stream_window_items=4)
    client, server = RpcClientCore(config), RpcServerCore()

    rid = client.send_stream_request("count", {"to": 10})
    (request,) = rpc_round(alice, client, bob, server)
    assert request == StreamRequest(rid, "count", {"to": 10}, 4)

    received: list[int] = []
    n = 0
    for _ in range(50):  # bounded: the stream is 10 items
        while n < 10 and server.item_credit(rid) > 0:
            server.send_item(rid, {"n": n})
            n += 1
        if n == 10 and server.calls_running:
            server.send_end(rid)
        events = deliver_replies(alice, client, bob, server)
        for ev in events:
            if isinstance(ev, StreamItem):
                received.append(ev.item["n"])
                client.item_taken(rid)  # the consumer took it: credit goes back
        if any(isinstance(ev, StreamEnd) for ev in events):
            break
        credits = rpc_round(alice, client, bob, server)
        assert all(isinstance(ev, StreamCredit) for ev in credits)
        assert server.item_credit(rid) <= 4
    assert received == list(range(10))
    assert client.calls_in_flight == 0 and server.calls_running == 0


def test_a_cancelled_call_gets_no_answer_through_the_stacked_cores():
    alice, bob = connected_peers()
    client, server = RpcClientCore(), RpcServerCore()
    rid = client.send_request("slow", {})
    rpc_round(alice, client, bob, server)
    client.cancel(rid)
    assert rpc_round(alice, client, bob, server) == [Cancel(rid)]
    assert server.is_cancelled(rid)
    server.send_response(rid, {"late": True})  # the handler finished anyway
    assert deliver_replies(alice, client, bob, server) == []
    assert server.calls_running == 0


def test_a_server_beyond_its_credit_fails_the_stream_and_is_cancelled():
    alice, bob = connected_peers()
    client = RpcClientCore(RpcConfig(stream_window_items=1))
    server = RpcServerCore()
    rid = client.send_stream_request("flood", {})
    rpc_round(alice, client, bob, server)
    server.send_item(rid, {"n": 0})
    with pytest.raises(RpcUsageError) as info:
        server.send_item(rid, {"n": 1})  # the server core refuses; a rogue peer would not
    assert info.value.code == "NO_CREDIT"
    # A rogue server: bypass its core and put a second item on the wire.
    bob.send([*server.messages_to_send(), encode_message(StreamItem(rid, {"n": 1}))])
    events = deliver_replies(alice, client, bob, server)
    assert events[0] == StreamItem(rid, {"n": 0})
    assert isinstance(events[1], ProtocolViolation)
    assert events[1].code == "STREAM_CREDIT_EXCEEDED"
    assert rpc_round(alice, client, bob, server) == [Cancel(rid)]
