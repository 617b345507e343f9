"""app-node's auth primitives: scrypt hashes, password policy, bearer tokens."""

from __future__ import annotations

import base64
import time
import unicodedata
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from nodes.app_node.auth import (
    DEFAULT_PARAMS,
    MIN_PASSWORD_CHARS,
    PasswordPolicyError,
    ScryptParams,
    StoredHashError,
    TokenRecord,
    check_password_policy,
    hash_password,
    hash_token,
    issue_token,
    needs_rehash,
    new_token,
    parse_stored_hash,
    verify_password,
)
from tests.examples import examples

CHEAP = ScryptParams(ln=10, r=8, p=1)  # 1 MiB: fast tests, same code path
PASSWORD = "correct horse battery staple"


def test_round_trip_with_default_parameters() -> None:
    started = time.monotonic()
    stored = hash_password(PASSWORD)
    assert time.monotonic() - started < 10
    assert stored.startswith("$scrypt$ln=17,r=8,p=1$")
    assert verify_password(PASSWORD, stored)
    assert not verify_password(PASSWORD + "!", stored)
    assert not needs_rehash(stored)


def test_salt_is_per_password() -> None:
    first, second = hash_password(PASSWORD, params=CHEAP), hash_password(PASSWORD, params=CHEAP)
    assert first != second
    assert parse_stored_hash(first)[1] != parse_stored_hash(second)[1]
    assert verify_password(PASSWORD, first) and verify_password(PASSWORD, second)


@settings(max_examples=examples(25), deadline=None)
@given(password=st.text(min_size=MIN_PASSWORD_CHARS, max_size=60).filter(
    lambda p: p.strip() and len(set(p)) >= 4), other=st.text(max_size=60))
def test_round_trip_and_wrong_password(password: str, other: str) -> None:
    try:
        check_password_policy(password)
    except PasswordPolicyError:
        return  # NFC may shorten it below the minimum
    stored = hash_password(password, params=CHEAP)
    assert verify_password(password, stored)
    if other != password:
        same = unicodedata.normalize("NFC", other) == unicodedata.normalize("NFC", password)
        assert verify_password(other, stored) == same


def test_unicode_is_normalised() -> None:
    composed, decomposed = "caf\u00e9-passphrase", "cafe\u0301-passphrase"
    assert verify_password(decomposed, hash_password(composed, params=CHEAP))


def test_parameters_are_parsed_and_rehash_is_asked_for() -> None:
    stored = hash_password(PASSWORD, params=CHEAP)
    params, salt, digest = parse_stored_hash(stored)
    assert params == CHEAP and params.n == 1024 and len(salt) == 16 and len(digest) == 32
    assert needs_rehash(stored)  # weaker than the default ln=17
    assert not needs_rehash(stored, CHEAP)
    assert needs_rehash(stored, ScryptParams(ln=10, r=8, p=2))


def _tamper(stored: str, field: int, change) -> str:
    parts = stored.split("$")
    parts[field] = change(parts[field])
    return "$".join(parts)


def _flip_first_byte(b64: str) -> str:
    raw = bytearray(base64.b64decode(b64 + "=" * (-len(b64) % 4)))
    raw[0] ^= 1
    return base64.b64encode(bytes(raw)).decode().rstrip("=")


def test_tampered_hash_or_salt_does_not_verify() -> None:
    stored = hash_password(PASSWORD, params=CHEAP)
    assert not verify_password(PASSWORD, _tamper(stored, 4, _flip_first_byte))  # hash
    assert not verify_password(PASSWORD, _tamper(stored, 3, _flip_first_byte))  # salt
    cheaper = _tamper(stored, 2, lambda _: "ln=11,r=8,p=1")
    assert not verify_password(PASSWORD, cheaper)  # parameters are part of the hash


@pytest.mark.parametrize("bad", [
    "",
    "plaintext-password",
    "$argon2id$v=19$m=65536,t=3,p=4$c2FsdA$aGFzaA",
    "$scrypt$ln=10,r=8$c2FsdHNhbHRzYWx0$aGFzaGhhc2hoYXNoaGFzaA",
    "$scrypt$ln=10,r=8,p=1$c2FsdHNhbHRzYWx0$!!!notbase64!!!",
    "$scrypt$ln=10,r=8,p=1$c2Fs$aGFzaGhhc2hoYXNoaGFzaA",  # 3-byte salt
    "$scrypt$ln=10,r=8,p=1$c2FsdHNhbHRzYWx0$aGFzaA",  # 4-byte hash
    "$scrypt$ln=0,r=8,p=1$c2FsdHNhbHRzYWx0$aGFzaGhhc2hoYXNoaGFzaA",
    "$scrypt$ln=30,r=64,p=1$c2FsdHNhbHRzYWx0$aGFzaGhhc2hoYXNoaGFzaA",  # 256 GiB: refused
])
def test_malformed_stored_hash_is_a_typed_error(bad: str) -> None:
    with pytest.raises(StoredHashError):
        verify_password(PASSWORD, bad)


@given(st.text(max_size=120))
def test_parser_only_raises_its_own_error(text: str) -> None:
    try:
        parse_stored_hash(text)
    except StoredHashError:
        pass


@pytest.mark.parametrize(("password", "reason"), [
    ("short", "at least 12 characters, got 5"),
    ("x" * 1025, "at most 1024 characters"),
    (" " * 20, "only whitespace"),
    ("abababababababab", "4 different characters"),
])
def test_password_policy(password: str, reason: str) -> None:
    with pytest.raises(PasswordPolicyError, match=reason) as caught:
        hash_password(password, params=CHEAP)
    assert reason in caught.value.reason


def test_token_is_random_and_only_its_hash_is_kept() -> None:
    token, token_hash = new_token()
    other, _ = new_token()
    assert token != other and token.startswith("cac_") and len(token) >= 40
    assert token_hash == hash_token(token) and token not in token_hash
    assert len(token_hash) == 64


def test_token_record_lifetime_and_revocation() -> None:
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    token, record = issue_token("user-1", now=now, ttl=timedelta(hours=1))
    assert record.matches(token) and not record.matches(token + "x")
    assert token not in record.model_dump_json()
    assert not record.is_valid(now - timedelta(seconds=1))
    assert record.is_valid(now)
    assert record.is_valid(now + timedelta(minutes=59))
    assert not record.is_valid(now + timedelta(hours=1))  # expired
    revoked = record.revoke(now + timedelta(minutes=5))
    assert not revoked.is_valid(now + timedelta(minutes=10))
    assert revoked.revoke(now + timedelta(minutes=30)).revoked_at == revoked.revoked_at
    assert record.is_valid(now)  # records are immutable: revoke returns a new one
    assert TokenRecord.model_validate_json(revoked.model_dump_json()) == revoked


def test_token_record_is_validated() -> None:
    now = datetime(2026, 12, 1, tzinfo=UTC)
    _, token_hash = new_token()
    with pytest.raises(ValidationError, match="expires"):
        TokenRecord(token_hash=token_hash, user_id="u", created_at=now, expires_at=now)
    with pytest.raises(ValidationError):
        TokenRecord(token_hash="not-hex", user_id="u", created_at=now,
                    expires_at=now + timedelta(1))
    with pytest.raises(ValidationError):  # naive datetimes are refused
        TokenRecord(token_hash=token_hash, user_id="u", created_at=datetime(2026, 1, 1),
                    expires_at=datetime(2026, 1, 2))


def test_app_node_reads_the_password_hash_cost_and_refuses_a_bad_one(monkeypatch) -> None:
    from nodes.app_node.settings import AppNodeSettings

    settings = AppNodeSettings(storage="/nonexistent")
    assert settings.password_hash.params() == DEFAULT_PARAMS
    assert not settings.password_hash.below_floor
    monkeypatch.setenv("COSMICAC_APP_NODE__PASSWORD_HASH__LN", "18")
    raised = AppNodeSettings(storage="/nonexistent").password_hash
    assert raised.params() == ScryptParams(ln=18, r=8, p=1) and not raised.below_floor
    monkeypatch.delenv("COSMICAC_APP_NODE__PASSWORD_HASH__LN")
    assert AppNodeSettings(storage="/nonexistent", password_hash={"ln": 10}).password_hash \
        .below_floor
    for bad in ({"ln": 23}, {"r": 0}, {"p": 17}, {"rounds": 3}):
        with pytest.raises(ValidationError, match="password_hash"):
            AppNodeSettings(storage="/nonexistent", password_hash=bad)
