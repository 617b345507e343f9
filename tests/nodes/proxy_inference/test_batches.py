"""A streamed answer's frames are handed on in the bursts they arrived in."""

from __future__ import annotations

import pytest
import trio

from contracts.inference import InferFrame
from nodes.proxy_inference.upstream import BATCH_FRAMES, Answer, UpstreamFailed
from p2p.rpc import RpcError


class _Bursts:
    """An item stream whose frames arrive in the given bursts (then ``end``)."""

    def __init__(self, bursts: list[list[InferFrame]], end: BaseException | None = None):
        self._bursts = bursts
        self._here: list[InferFrame] = []
        self._end = end
        self.waits = 0

    async def receive(self) -> InferFrame:
        await trio.lowlevel.checkpoint()
        if not self._here:
            if not self._bursts:
                raise self._end or trio.EndOfChannel()
            self.waits += 1
            self._here = list(self._bursts.pop(0))
        return self._here.pop(0)

    def receive_nowait(self) -> InferFrame:
        if not self._here:
            if not self._bursts and self._end is not None:
                raise self._end
            raise trio.WouldBlock
        return self._here.pop(0)


def _frames(*texts: str, done: bool = False) -> list[InferFrame]:
    frames = [InferFrame(data=text.encode()) for text in texts]
    if done:
        frames[-1] = InferFrame(data=frames[-1].data, done=True)
    return frames


def _answer(items: _Bursts) -> Answer:
    return Answer(InferFrame(status=200, data=b"first"), b"agent", 1, items)  # type: ignore[arg-type]


async def test_frames_that_arrived_together_come_as_one_batch():
    items = _Bursts([_frames("a", "b", "c"), _frames("d"), _frames("e", "f", done=True),
                     _frames("never")])
    batches = [[f.data for f in batch] async for batch in _answer(items).batches()]
    assert batches == [[b"a", b"b", b"c"], [b"d"], [b"e", b"f"]]
    assert [f.data async for f in _answer(_Bursts([_frames("x", "y", done=True)])).frames()] \
        == [b"x", b"y"]


async def test_a_long_burst_is_cut_at_the_bound():
    items = _Bursts([_frames(*(str(i) for i in range(BATCH_FRAMES + 5)), done=True)])
    sizes = [len(batch) async for batch in _answer(items).batches()]
    assert sizes == [BATCH_FRAMES, 5]


@pytest.mark.parametrize("end, code", [(trio.EndOfChannel(), "UPSTREAM"),
                                       (RpcError("INTERNAL", "it broke"), "INTERNAL")])
async def test_frames_before_a_break_are_handed_on_before_the_failure(end, code):
    items = _Bursts([_frames("a"), _frames("b", "c")], end=end)
    got: list[bytes] = []
    with pytest.raises(UpstreamFailed) as failed:
        async for batch in _answer(items).batches():
            got.extend(frame.data for frame in batch)
    assert got == [b"a", b"b", b"c"]
    assert failed.value.code == code
