"""Typed operations and rows: the public face of the database, and its unchanged wire form."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import crdt
from crdt import (
    AddAudioUsage,
    AddTokenUsage,
    AddWriter,
    ApiKey,
    Database,
    DeleteModelMaster,
    Entry,
    FsyncPolicy,
    InvalidOp,
    MarkKeyUsed,
    ModelMaster,
    PutApiKey,
    PutModelMaster,
    RemoveWriter,
    RevokeApiKey,
    Usage,
    WriteRefused,
    decode_op,
    hash_secret,
)
from crdt._entries import decode_entry
from crdt._ops import validate_op
from p2p.keys import KeyPair
from tests.examples import examples

H = hash_secret("s3cret")
K = b"k" * 32
DB = b"d" * 32


def test_typed_ops_encode_to_the_wire_arrays_entries_always_held():
    """The wire form is unchanged: logs written before the typed ops still mean the same."""
    expected = [
        (PutApiKey("k1", "team", "laptop", H, ("chat",), 1_700_000_000_000),
         ("key_put", "k1", "team", "laptop", H, ["chat"], 1_700_000_000_000)),
        (RevokeApiKey("k1", 5), ("key_revoke", "k1", 5)),
        (PutModelMaster("llama", "vllm", {"stop": ["</s>"]}),
         ("model_put", "llama", "vllm", {"stop": ["</s>"]})),
        (DeleteModelMaster("llama"), ("model_delete", "llama")),
        (AddTokenUsage("k1", "llama", "2024-05-01", prompt=10, completion=5, total=15),
         ("usage_add", "k1", "llama", "2024-05-01", 10, 5, 15, 0, 1)),
        (AddAudioUsage("k1", "whisper", "2024-05-01", 1500, requests=2),
         ("usage_add", "k1", "whisper", "2024-05-01", 0, 0, 0, 1500, 2)),
        (MarkKeyUsed("k1", 7), ("key_used", "k1", 7)),
        (AddWriter(K), ("add_writer", K, False)),
        (AddWriter(K, admin=True), ("add_writer", K, True)),
        (RemoveWriter(K, 3), ("remove_writer", K, 3)),
    ]
    for op, wire in expected:
        assert op.to_wire() == wire
        assert decode_op(wire) == op
    # An entry built from typed ops is byte for byte the one built from the arrays.
    typed = Entry.create(DB, 1, {}, [op for op, _ in expected])
    wired = Entry.create(DB, 1, {}, [wire for _, wire in expected])
    assert typed.encode() == wired.encode()
    decoded = decode_entry(typed.encode())
    assert decoded == typed and decoded.typed_ops() == [op for op, _ in expected]


@pytest.mark.parametrize(("build", "op", "field"), [
    (lambda: PutApiKey("", "t", "n", H, [], 1), "key_put", "id"),
    (lambda: PutApiKey("k", "t", "n", b"short", [], 1), "key_put", "secret_hash"),
    (lambda: PutApiKey("k", "t", "n", H, "chat", 1), "key_put", "scopes"),
    (lambda: PutApiKey("k", "t", "n", H, [""], 1), "key_put", "scopes"),
    (lambda: PutApiKey("k", "t", "n", H, [], True), "key_put", "created_ms"),
    (lambda: PutApiKey.with_secret("k", "t", "n", "", [], 1), "key_put", "secret"),
    (lambda: RevokeApiKey("k", -1), "key_revoke", "revoked_ms"),
    (lambda: PutModelMaster("m", "", {}), "model_put", "runtime"),
    (lambda: PutModelMaster("m", "r", {"x": object()}), "model_put", "defaults"),
    (lambda: PutModelMaster("m", "r", {1: "x"}), "model_put", "defaults"),
    (lambda: DeleteModelMaster(""), "model_delete", "name"),
    (lambda: AddTokenUsage("k", "m", "2024-13-01"), "usage_add", "day"),
    (lambda: AddTokenUsage("k", "m", "2024-01-01", prompt=-1), "usage_add", "prompt"),
    (lambda: AddTokenUsage("k", "m", "2024-01-01", total=1.0), "usage_add", "total"),
    (lambda: AddTokenUsage("k", "m", "2024-01-01", audio_ms=5), "usage_add", "audio_ms"),
    (lambda: AddAudioUsage("k", "m", "2024-01-01", 0), "usage_add", "audio_ms"),
    (lambda: AddAudioUsage("k", "m", "2024-01-01", 5, requests=2**53), "usage_add",
     "requests"),
    (lambda: MarkKeyUsed("k", 1.5), "key_used", "at_ms"),
    (lambda: MarkKeyUsed(7, 1), "key_used", "key_id"),
    (lambda: AddWriter(b"short"), "add_writer", "key"),
    (lambda: AddWriter(K, admin=1), "add_writer", "admin"),
    (lambda: RemoveWriter(K, True), "remove_writer", "length"),
])
def test_a_bad_field_is_refused_when_the_op_is_built_naming_the_field(build, op, field):
    with pytest.raises(InvalidOp) as info:
        build()
    assert (info.value.op, info.value.field, info.value.code) == (op, field, "BAD_OP")
    assert isinstance(info.value, ValueError)
    assert info.value.message.startswith(f"{op}:")


def test_ops_are_frozen_and_keep_no_reference_to_the_callers_map():
    defaults = {"stop": ["x"]}
    op = PutModelMaster("m", "vllm", defaults)
    defaults["stop"].append("y")
    assert op.defaults == {"stop": ["x"]}
    with pytest.raises(AttributeError):
        op.name = "other"  # type: ignore[misc]
    key = PutApiKey.with_secret("k", "t", "n", "s3cret", ["chat"], 1)
    assert key.secret_hash == H and key.scopes == ("chat",)
    assert hash(key) == hash(PutApiKey("k", "t", "n", H, ["chat"], 1))


names = st.text(min_size=1, max_size=8)
counts = st.integers(0, 2**53 - 1)
typed_ops = st.one_of(
    st.builds(PutApiKey, names, names, st.text(max_size=8), st.binary(min_size=32, max_size=32),
              st.lists(names, max_size=3).map(tuple), st.integers(0, 2**63 - 1)),
    st.builds(RevokeApiKey, names, st.integers(0, 2**63 - 1)),
    st.builds(PutModelMaster, names, names,
              st.dictionaries(st.text(max_size=4), st.integers(-2**53, 2**53) | st.text(max_size=4),
                              max_size=3)),
    st.builds(DeleteModelMaster, names),
    st.builds(MarkKeyUsed, names, st.integers(0, 2**63 - 1)),
    st.builds(AddWriter, st.binary(min_size=32, max_size=32), st.booleans()),
    st.builds(RemoveWriter, st.binary(min_size=32, max_size=32), st.integers(0, 2**63 - 1)),
)
wire_usage = st.tuples(st.just("usage_add"), names, names, st.just("2026-11-29"),
                       counts, counts, counts, counts, counts)


@settings(max_examples=examples(300))
@given(typed_ops)
def test_every_typed_op_round_trips_through_its_wire_form(op):
    validate_op(op.to_wire())
    assert decode_op(op.to_wire()) == op
    entry = Entry.create(DB, 1, {}, [op])
    assert decode_entry(entry.encode()).typed_ops() == [op]


@settings(max_examples=examples(300))
@given(wire_usage)
def test_every_stored_usage_add_decodes_to_exactly_one_usage_op_and_back(wire):
    op = decode_op(wire)
    audio_only = wire[4:7] == (0, 0, 0) and wire[7] > 0
    assert isinstance(op, AddAudioUsage if audio_only else AddTokenUsage)
    assert op.to_wire() == wire


@given(st.lists(st.integers(0, 5) | st.text(max_size=3) | st.binary(max_size=3), max_size=9))
def test_decoding_any_array_gives_an_op_or_invalid_op(array):
    for wire in (array, ["usage_add", *array], ["key_put", *array]):
        try:
            op = decode_op(wire)
        except InvalidOp:
            continue
        assert op.to_wire() == tuple(wire)


async def test_the_database_takes_typed_ops_and_answers_with_typed_rows(tmp_path):
    async with await Database.open(tmp_path, KeyPair.generate(),
                                   fsync=FsyncPolicy.NEVER) as db:
        await db.append_many([
            [PutApiKey.with_secret("key-1", "team-a", "ci", "s3cret", ["chat"], 1),
             PutApiKey.with_secret("key-2", "team-a", "old", "other", [], 2)],
            [PutModelMaster("llama", "vllm", {"max_tokens": 512}),
             PutModelMaster("gone", "vllm", {})],
        ])
        await db.append([DeleteModelMaster("gone"), RevokeApiKey("key-2", 9),
                         AddTokenUsage("key-1", "llama", "2026-11-29", prompt=3, total=5),
                         AddAudioUsage("key-1", "whisper", "2026-11-30", 1500),
                         MarkKeyUsed("key-1", 40), MarkKeyUsed("key-1", 30)])
        key = await db.api_key_by_secret("s3cret")
        assert key == ApiKey("key-1", "team-a", "ci", H, ("chat",), 1, False, None)
        assert await db.api_key("key-1") == key
        assert [k.id for k in await db.api_keys_of_team("team-a")] == ["key-1", "key-2"]
        assert (await db.api_key("key-2")).revoked_ms == 9
        assert await db.api_key_by_secret("wrong") is None
        assert await db.model_master("llama") == ModelMaster("llama", "vllm", {"max_tokens": 512})
        assert await db.model_master("gone") is None
        assert await db.model_masters() == [ModelMaster("llama", "vllm", {"max_tokens": 512})]
        assert await db.usage("key-1") == [
            Usage("key-1", "llama", "2026-11-29", 3, 0, 5, 0, 1),
            Usage("key-1", "whisper", "2026-11-30", 0, 0, 0, 1500, 1)]
        assert await db.usage("key-1", model="whisper", day_from="2026-11-30") == [
            Usage("key-1", "whisper", "2026-11-30", 0, 0, 0, 1500, 1)]
        assert await db.usage("key-1", day_to="2026-11-28") == []
        assert await db.last_used("key-1") == 40
        assert await db.last_used("nobody") is None
        # Writer ops need an admin: the creator is one, so it may append them typed too.
        await db.append([AddWriter(K)])
        assert any(w.key == K and w.admitted for w in db.writers())


async def test_a_typed_op_changed_after_it_was_built_is_still_checked_on_append(tmp_path):
    async with await Database.open(tmp_path, KeyPair.generate(),
                                   fsync=FsyncPolicy.NEVER) as db:
        op = PutModelMaster("m", "vllm", {})
        op.defaults["bad"] = float("nan")  # a map inside a frozen op can still be changed
        with pytest.raises(WriteRefused) as refused:
            await db.append([op])
        assert refused.value.code == "BAD_OP"
        assert await db.model_masters() == []


INTERNALS = {"chain_hash", "head_message", "GENESIS_HASH", "WriterLog", "Base", "order_key",
             "compute_admission", "decode_entry", "Head", "verify_file", "Admission",
             "WriterGrant", "MAX_BODY", "ENTRY_VERSION", "View"}


def test_the_package_exports_its_public_face_and_no_internals():
    public = set(crdt.__all__)
    assert not public & INTERNALS
    for name in crdt.__all__:
        assert getattr(crdt, name) is not None
    for name in ("Database", "PutApiKey", "RevokeApiKey", "PutModelMaster", "DeleteModelMaster",
                 "AddTokenUsage", "AddAudioUsage", "MarkKeyUsed", "AddWriter", "RemoveWriter",
                 "ApiKey", "ModelMaster", "Usage", "Entry", "FsyncPolicy", "ReplicationConfig",
                 "Replicator", "run_database_service", "verify_storage", "inspect_storage",
                 "InvalidOp", "LogCorrupted", "WriteRefused", "hash_secret", "decode_op"):
        assert name in public
    # The internals stay where they are, for tests and tools that mean them.
    from p2p.log import WriterLog, chain_hash  # noqa: F401
    from p2p.log._records import GENESIS_HASH, head_message  # noqa: F401


def test_star_import_gives_exactly_the_public_names():
    # In this process: crdt binds every name at import (no lazy __getattr__), so a star
    # import here is what it is in a fresh interpreter, without one's ~0.5 s of imports.
    # (A name of __all__ that crdt does not have makes it raise AttributeError.)
    namespace: dict = {}
    exec("from crdt import *", namespace)
    assert sorted(set(crdt.__all__) - set(namespace)) == []
    assert sorted(set(namespace) - {"__builtins__"}) == sorted(crdt.__all__)
