import pytest
import trio

from tests.p2p.queue.helpers import drain, mock_clock, two_ends
from tests.p2p.swarm.helpers import memory_swarm_net


@pytest.fixture
def clock():
    return mock_clock()


async def test_smoke(tmp_path):
    with trio.fail_after(30):
        async with memory_swarm_net() as net, two_ends(net, tmp_path) as (a, b):
            for i in range(5):
                assert await a.queue.publish("job-1", b"op%d" % i) == i + 1
            got = await drain(b.queue, 5)
            assert [d.payload for d in got] == [b"op%d" % i for i in range(5)]
            await a.queue.wait_peer_acked(5)
            print(a.queue.statistics(), b.queue.statistics())
