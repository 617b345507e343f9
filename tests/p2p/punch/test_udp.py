"""The UDP punch primitives on 127.0.0.1 (no NAT: what they exchange, and when)."""

import os

import trio

from p2p.punch._udp import birthday_sockets, spray, udp_socket, udp_token

TOKEN = udp_token(os.urandom(32))


async def test_a_spray_finds_one_of_the_birthday_sockets_and_both_learn_the_5_tuple():
    consistent = udp_socket()
    port = consistent.getsockname()[1]
    found = {}
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            async def random_side() -> None:
                found["birthday"] = await birthday_sockets(
                    ("127.0.0.1", port), token=TOKEN, deadline=trio.current_time() + 20)

            nursery.start_soon(random_side)
            found["spray"] = await spray(consistent, "127.0.0.1", token=TOKEN,
                                         deadline=trio.current_time() + 20, interval_s=0.001)
    sock, prober = found["birthday"]
    assert prober == ("127.0.0.1", port)
    assert found["spray"][1] == sock.getsockname()[1]  # the spray learnt the winning socket
    sock.close()
    consistent.close()


async def test_probes_without_the_sessions_token_start_nothing(autojump_clock):
    consistent = udp_socket()
    port = consistent.getsockname()[1]
    async with trio.open_nursery() as nursery:
        async def random_side() -> None:
            assert await birthday_sockets(("127.0.0.1", port), token=TOKEN, sockets=8,
                                          deadline=trio.current_time() + 3) is None

        nursery.start_soon(random_side)
        assert await spray(consistent, "127.0.0.1", token=udp_token(b"another session"),
                           deadline=trio.current_time() + 3, interval_s=0.05) is None
    consistent.close()
