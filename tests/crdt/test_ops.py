"""Op schemas (the wire form): every malformed op is refused with BAD_OP, naming the field.

The typed operations that build these arrays are tested in test_operations.py.
"""

import hashlib

import msgpack
import pytest

from crdt import BadEntry, InvalidOp, hash_secret
from crdt._ops import ADMIN_OPS, OP_NAMES, validate_op

H = b"h" * 32
K = b"k" * 32
LONG = "x" * 257

GOOD = [
    ("key_put", "k1", "team", "name", H, ["chat", "audio"], 1),
    ("key_put", "k1", "team", "", H, [], 0),
    ("key_revoke", "k1", 5),
    ("model_put", "llama", "vllm", {"temperature": 0.7, "stop": ["x"], "n": {"a": None}}),
    ("model_put", "llama", "vllm", {}),
    ("model_delete", "llama"),
    ("usage_add", "k1", "llama", "2024-02-29", 1, 2, 3, 0, 1),
    ("usage_add", "k1", "llama", "2024-01-01", 2**53 - 1, 0, 0, 2**53 - 1, 0),
    ("key_used", "k1", 2**63 - 1),
    ("add_writer", K, True),
    ("remove_writer", K, 0),
    ["key_revoke", "k1", 5],  # decoded ops are lists
]


@pytest.mark.parametrize("op", GOOD)
def test_valid_ops_pass(op):
    validate_op(op)


BAD = [
    # (op, a word the message must contain)
    ((), "non-empty"),
    ("key_put", "non-empty"),
    ((1, "x"), "unknown op"),
    (("nope", 1), "unknown op"),
    (("key_revoke", "k1"), "2 arguments"),
    (("key_revoke", "k1", 5, 6), "2 arguments"),
    # key_put
    (("key_put", "", "t", "n", H, [], 1), "id"),
    (("key_put", LONG, "t", "n", H, [], 1), "id"),
    (("key_put", b"k1", "t", "n", H, [], 1), "id"),
    (("key_put", "k", "", "n", H, [], 1), "team"),
    (("key_put", "k", "t", LONG, H, [], 1), "name"),
    (("key_put", "k", "t", "n", b"short", [], 1), "secret_hash"),
    (("key_put", "k", "t", "n", "h" * 32, [], 1), "secret_hash"),
    (("key_put", "k", "t", "n", H, "chat", 1), "scopes"),
    (("key_put", "k", "t", "n", H, ["s"] * 65, 1), "scopes"),
    (("key_put", "k", "t", "n", H, [1], 1), "scopes item"),
    (("key_put", "k", "t", "n", H, [""], 1), "scopes item"),
    (("key_put", "k", "t", "n", H, [], -1), "created_ms"),
    (("key_put", "k", "t", "n", H, [], True), "created_ms"),
    (("key_put", "k", "t", "n", H, [], 1.0), "created_ms"),
    (("key_put", "k", "t", "n", H, [], 2**63), "created_ms"),
    # key_revoke
    (("key_revoke", "", 1), "id"),
    (("key_revoke", "k", None), "revoked_ms"),
    (("key_revoke", "k", False), "revoked_ms"),
    # model_put
    (("model_put", "", "vllm", {}), "name"),
    (("model_put", "m", 3, {}), "runtime"),
    (("model_put", "m", "vllm", []), "defaults"),
    (("model_put", "m", "vllm", {1: "x"}), "defaults"),
    (("model_put", "m", "vllm", {"a": b"bytes"}), "defaults"),
    (("model_put", "m", "vllm", {"a": float("nan")}), "defaults"),
    (("model_put", "m", "vllm", {"a": {"b": {2: 1}}}), "defaults"),
    (("model_put", "m", "vllm", {"a": "x" * 17000}), "defaults"),
    (("model_put", "m", "vllm", {"a": 2**70}), "defaults"),
    # model_delete
    (("model_delete", None), "name"),
    # usage_add
    (("usage_add", "", "m", "2024-01-01", 0, 0, 0, 0, 0), "key_id"),
    (("usage_add", "k", "", "2024-01-01", 0, 0, 0, 0, 0), "model"),
    (("usage_add", "k", "m", "2024-1-01", 0, 0, 0, 0, 0), "day"),
    (("usage_add", "k", "m", "20240101", 0, 0, 0, 0, 0), "day"),
    (("usage_add", "k", "m", "2023-02-29", 0, 0, 0, 0, 0), "day"),
    (("usage_add", "k", "m", "2024-01-01T00", 0, 0, 0, 0, 0), "day"),
    (("usage_add", "k", "m", "\uff12\uff10\uff12\uff14-01-01", 0, 0, 0, 0, 0), "day"),
    (("usage_add", "k", "m", "2024-01-01", -1, 0, 0, 0, 0), "prompt"),
    (("usage_add", "k", "m", "2024-01-01", 0, 2**53, 0, 0, 0), "completion"),
    (("usage_add", "k", "m", "2024-01-01", 0, 0, 1.0, 0, 0), "total"),
    (("usage_add", "k", "m", "2024-01-01", 0, 0, 0, 0.5, 0), "audio_ms"),
    (("usage_add", "k", "m", "2024-01-01", 0, 0, 0, 0, True), "requests"),
    # key_used
    (("key_used", "k", -5), "at_ms"),
    (("key_used", 7, 5), "key_id"),
    # admin
    (("add_writer", b"k" * 31, True), "key"),
    (("add_writer", K, 1), "admin"),
    (("remove_writer", K, -1), "length"),
    (("remove_writer", "k" * 32, 0), "key"),
]


@pytest.mark.parametrize(("op", "word"), BAD)
def test_invalid_ops_are_refused_with_bad_op(op, word):
    with pytest.raises(BadEntry) as info:
        validate_op(op)
    assert info.value.code == "BAD_OP"
    assert word in info.value.message
    if isinstance(op, tuple) and op and op[0] in OP_NAMES:
        assert info.value.message.startswith(f"{op[0]}:")
        assert isinstance(info.value, InvalidOp) and info.value.op == op[0]
        if word.endswith("arguments"):
            assert info.value.field is None  # the op as a whole
        else:
            assert info.value.field == word.removesuffix(" item")


def test_hash_secret_is_personalised_blake2b_256():
    digest = hash_secret("sk-abc")
    assert len(digest) == 32
    assert digest == hashlib.blake2b(b"sk-abc", digest_size=32,
                                     person=b"cosmicac/apikey").digest()
    assert digest != hashlib.blake2b(b"sk-abc", digest_size=32).digest()
    assert hash_secret("sk-abd") != digest


def test_admin_ops_are_the_writer_ops():
    assert frozenset({"add_writer", "remove_writer"}) == ADMIN_OPS
    assert ADMIN_OPS <= OP_NAMES


def test_defaults_limit_is_on_the_msgpack_size():
    small = {"a": "x" * (16 * 1024 - 16)}
    assert len(msgpack.packb(small)) <= 16 * 1024
    validate_op(("model_put", "m", "r", small))
