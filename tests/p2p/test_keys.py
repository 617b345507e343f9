import os
import stat

import pytest
from hypothesis import given
from hypothesis import strategies as st

from p2p.errors import IdentityError, KeyFormatError
from p2p.keys import (
    KeyPair,
    derive_topic,
    load_or_create_keypair,
    parse_public_key,
    parse_topic,
    public_key_to_x25519,
    verify_signature,
)


def test_same_storage_folder_always_gives_the_same_key(tmp_path):
    first = load_or_create_keypair(tmp_path / "node")
    second = load_or_create_keypair(tmp_path / "node")
    assert first.public_key == second.public_key
    assert first.seed == second.seed


def test_identity_file_is_private_to_its_owner(tmp_path):
    load_or_create_keypair(tmp_path)
    mode = stat.S_IMODE((tmp_path / "identity").stat().st_mode)
    assert mode == 0o600


def test_different_folders_give_different_keys(tmp_path):
    assert load_or_create_keypair(tmp_path / "a") != load_or_create_keypair(tmp_path / "b")


@pytest.mark.parametrize(
    "content, fragment",
    [
        (b"", "corrupt"),
        (b"\xff\xfe garbage", "not UTF-8"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"version": 7}', "unknown version"),
        (b'{"version": 1, "public_key": "00"}', "missing field 'secret_seed'"),
        (b'{"version": 1, "public_key": "zz", "secret_seed": "00"}', "corrupt"),
    ],
)
def test_corrupt_identity_file_gives_a_clear_error(tmp_path, content, fragment):
    (tmp_path / "identity").write_bytes(content)
    os.chmod(tmp_path / "identity", 0o600)
    with pytest.raises(IdentityError) as info:
        load_or_create_keypair(tmp_path)
    assert fragment in str(info.value)
    assert str(tmp_path / "identity") in str(info.value)


def test_identity_whose_public_key_does_not_match_its_seed_is_refused(tmp_path):
    keypair = load_or_create_keypair(tmp_path)
    path = tmp_path / "identity"
    other = KeyPair.generate()
    path.write_text(path.read_text().replace(keypair.hex, other.hex))
    with pytest.raises(IdentityError, match="does not match its secret seed"):
        load_or_create_keypair(tmp_path)


def test_corrupt_identity_is_never_overwritten(tmp_path):
    path = tmp_path / "identity"
    path.write_bytes(b"not json")
    with pytest.raises(IdentityError):
        load_or_create_keypair(tmp_path)
    assert path.read_bytes() == b"not json"


def test_hex_keys_parse_and_bad_ones_say_what_is_wrong():
    keypair = KeyPair.generate()
    assert parse_public_key(f"  {keypair.hex.upper()}\n") == keypair.public_key
    with pytest.raises(KeyFormatError, match="64 hex characters, got 3"):
        parse_public_key("abc")
    with pytest.raises(KeyFormatError, match="found 'g'"):
        parse_public_key("g" * 64)


def test_signatures_verify_only_for_the_signed_message_and_key():
    keypair, other = KeyPair.generate(), KeyPair.generate()
    signature = keypair.sign(b"message")
    assert verify_signature(keypair.public_key, b"message", signature)
    assert not verify_signature(keypair.public_key, b"massage", signature)
    assert not verify_signature(other.public_key, b"message", signature)
    assert not verify_signature(keypair.public_key, b"message", signature[:10])


def test_x25519_twin_of_the_public_key_matches_the_private_one():
    keypair = KeyPair.generate()
    assert public_key_to_x25519(keypair.public_key) == keypair.x25519_public
    assert len(keypair.x25519_private) == 32


def test_topics_depend_on_the_namespace():
    assert derive_topic("jobs", b"x") != derive_topic("inference", b"x")
    assert derive_topic("jobs", "x") == derive_topic("jobs", b"x")
    assert len(derive_topic("jobs", b"x")) == 32


def test_topic_text_is_hex_or_hashed():
    hex_topic = "ab" * 32
    assert parse_topic(hex_topic) == bytes.fromhex(hex_topic)
    assert parse_topic("my-service") == derive_topic("user", "my-service")
    with pytest.raises(KeyFormatError):
        parse_topic("")


@given(st.text())
def test_key_parser_returns_a_key_or_raises_key_format_error(text):
    try:
        assert len(parse_public_key(text)) == 32
    except KeyFormatError:
        pass
