"""Request bodies bounded in size, in how many are held at once, and in JSON depth
(for the servers that use p2p.bodies)."""

from __future__ import annotations

import json

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from p2p.bodies import (
    MAX_JSON_DEPTH,
    BodyBudget,
    BodyRefused,
    JsonBodyError,
    json_depth,
    loads_bounded,
    read_body,
)
from tests.examples import examples

# --- depth ---

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                    st.text(alphabet=st.sampled_from('ab[]{}"\\\n\u00e9\U0001f600'),
                            max_size=8))
DOCUMENTS = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(alphabet='k[{"\\', max_size=3),
                                                 inner, max_size=4)), max_leaves=40)


def depth_of(value) -> int:
    if isinstance(value, list):
        return 1 + max(map(depth_of, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth_of, value.values()), default=0)
    return 0


@given(DOCUMENTS, st.booleans(), st.sampled_from(["utf-8", "utf-16", "utf-32"]))
def test_the_depth_of_any_json_is_counted_exactly_and_it_loads_as_json_loads(
        value, ascii_only, encoding):
    text = json.dumps(value, ensure_ascii=ascii_only, indent=None)
    assert json_depth(text) == depth_of(value)
    data = text.encode(encoding)
    if depth_of(value) <= MAX_JSON_DEPTH:
        assert loads_bounded(data) == json.loads(data)
    assert loads_bounded(data, max_depth=depth_of(value)) == json.loads(data)
    if depth_of(value):
        with pytest.raises(JsonBodyError) as info:
            loads_bounded(data, max_depth=depth_of(value) - 1)
        assert info.value.code == "json_too_deep"


@pytest.mark.parametrize("data", [b"[" * 100_000 + b"]" * 100_000, b"[" * 100_000,
                                  b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
                                  ("[" * 65 + "]" * 65).encode("utf-16")])
def test_a_deep_body_is_refused_with_a_code_not_a_recursion_error(data):
    with pytest.raises(JsonBodyError) as info:
        loads_bounded(data)
    assert info.value.code == "json_too_deep"


def test_brackets_inside_strings_do_not_count():
    text = json.dumps({"a": "[" * 1000 + '\\"{' * 100, "b": [["]]]]"]]})
    assert json_depth(text) == 3 and loads_bounded(text)["b"] == [["]]]]"]]


@given(st.binary(max_size=300))
def test_any_bytes_load_or_give_a_coded_error(data):
    try:
        expected = json.loads(data)
    except (ValueError, RecursionError):
        with pytest.raises(JsonBodyError) as info:
            loads_bounded(data)
        assert info.value.code in {"invalid_json", "json_too_deep"}
    else:
        try:
            assert loads_bounded(data) == expected or expected != expected  # NaN
        except JsonBodyError as exc:
            assert exc.code == "json_too_deep"


# --- how many at once ---


def test_the_budget_refuses_past_its_total_and_past_an_owners_share():
    budget = BodyBudget(max_bytes=100, max_reads=3, owner_bytes=60, owner_reads=2)
    with pytest.raises(BodyRefused) as info:
        budget.open("a", limit=50, declared=51)
    assert (info.value.status, info.value.code) == (413, "request_too_large")
    first = budget.open("a", limit=50, declared=50)
    with pytest.raises(BodyRefused) as info:  # a's 60 bytes: 50 + 20 > 60
        budget.open("a", limit=50, declared=20)
    assert (info.value.status, info.value.code) == (429, "too_many_bodies")
    assert budget.reading == 1 and budget.held == 50  # the refused one took nothing
    second = budget.open("b", limit=50, declared=40)
    with pytest.raises(BodyRefused) as info:  # 90 held: 20 more pass the total
        budget.open("c", limit=50, declared=20)
    assert (info.value.status, info.value.code) == (503, "server_busy")
    third = budget.open("a", limit=50)
    with pytest.raises(BodyRefused) as info:  # a is reading two already
        budget.open("a", limit=50)
    assert info.value.code == "too_many_bodies"
    with pytest.raises(BodyRefused) as info:  # three are being read
        budget.open("c", limit=50)
    assert info.value.code == "server_busy"
    third.received_bytes(5)
    with pytest.raises(BodyRefused) as info:  # a's bytes: 50 + 5 + 6 > 60
        third.received_bytes(6)
    assert info.value.status == 429
    third.finished_reading()
    budget.open("c", limit=50).close()  # a read slot is free again
    for ticket in (first, second, third, third):
        ticket.close()
    assert (budget.held, budget.reading, budget._owners) == (0, 0, {})
    assert budget.refused == {"request_too_large": 1, "too_many_bodies": 3, "server_busy": 2}


class BudgetMachine(RuleBasedStateMachine):
    """Any opens, chunks, ends and closes: the totals never pass the bounds, and
    everything comes back."""

    def __init__(self) -> None:
        super().__init__()
        self.budget = BodyBudget(max_bytes=1000, max_reads=4, owner_bytes=600, owner_reads=3)
        self.tickets = []

    @rule(owner=st.sampled_from("abc"), declared=st.none() | st.integers(0, 700))
    def open(self, owner, declared):
        try:
            self.tickets.append(self.budget.open(owner, limit=500, declared=declared))
        except BodyRefused as exc:
            assert exc.status in {413, 429, 503}

    @precondition(lambda self: self.tickets)
    @rule(index=st.integers(0, 100), size=st.integers(0, 300))
    def chunk(self, index, size):
        ticket = self.tickets[index % len(self.tickets)]
        if ticket.reading and not ticket.closed:
            try:
                ticket.received_bytes(size)
            except BodyRefused as exc:
                assert exc.status in {413, 429, 503}
                ticket.close()

    @precondition(lambda self: self.tickets)
    @rule(index=st.integers(0, 100))
    def finish(self, index):
        self.tickets[index % len(self.tickets)].finished_reading()

    @precondition(lambda self: self.tickets)
    @rule(index=st.integers(0, 100))
    def close(self, index):
        self.tickets.pop(index % len(self.tickets)).close()

    @invariant()
    def bounded(self):
        budget = self.budget
        assert 0 <= budget.held <= budget.max_bytes and 0 <= budget.reading <= budget.max_reads
        for held, reading in budget._owners.values():
            assert 0 <= held <= 600 and 0 <= reading <= 3
        assert budget.held == sum(t.reserved for t in self.tickets if not t.closed)

    def teardown(self):
        for ticket in self.tickets:
            ticket.close()
        assert (self.budget.held, self.budget.reading, self.budget._owners) == (0, 0, {})


TestBudgetMachine = BudgetMachine.TestCase
TestBudgetMachine.settings = settings(max_examples=examples(200), deadline=None)


async def test_a_body_trickled_too_slowly_is_a_408_and_gives_its_room_back(autojump_clock):
    budget = BodyBudget(max_bytes=100, max_reads=2)

    async def trickle():
        while True:
            yield b"x"
            await trio.sleep(1)

    ticket = budget.open(None, limit=100)
    with pytest.raises(BodyRefused) as info:
        await read_body(trickle(), ticket, timeout_s=30)
    assert (info.value.status, info.value.code) == (408, "body_timeout")
    ticket.close()
    assert (budget.held, budget.reading) == (0, 0)


async def test_read_body_joins_the_chunks_and_frees_the_read_slot():
    budget = BodyBudget(max_bytes=100, max_reads=1)

    async def chunks():
        for part in (b"ab", b"", b"cd"):
            yield part

    ticket = budget.open(None, limit=10)
    assert await read_body(chunks(), ticket, timeout_s=5) == b"abcd"
    assert (budget.reading, budget.held) == (0, 4)
    ticket.close()
    assert budget.held == 0


@pytest.mark.parametrize(("text", "depth"), [
    (b"", 0), (b"1", 0), (b"[]", 1), (b"[[]]", 2), (b'{"a": [1, {"b": []}]}', 4),
    (b'["[[[[", "]]]]"]', 1), (b'{"a\\"[[": [[]]}', 3), (b'"\\\\"', 0),
    (b"[" * 65 + b"]" * 65, 65),
    # escaped backslashes end before a quote; an escaped quote does not end a string
    (b'["\\\\"]', 1), (b'["\\\\\\"]]"]', 1), (b'[{"\\\\": ["]"]}]', 3),
    # an unterminated string of escaped quotes (once a quadratic rescan)
    (b"[" * 70 + b'"' + b'\\"' * 1000, 70),
])
def test_json_depth_table_of_strings_escapes_and_unclosed_text(text: bytes, depth: int) -> None:
    assert json_depth(text) == depth
