"""app-node's auth primitives: scrypt password hashes and revocable bearer tokens.

No HTTP, no storage and no clock here: the API layer reads the user's stored
hash or the token's record, passes ``now`` and acts on the answer.

Passwords are hashed with scrypt (``hashlib.scrypt``, memory-hard, in the
standard library) under a random 16-byte salt per password. The stored
string carries its own parameters, as passlib's and PHC's formats do::

    $scrypt$ln=17,r=8,p=1$<salt, base64>$<hash, base64>

so the cost can be raised later (app-node's ``password_hash`` settings):
:func:`needs_rehash` tells the login path to store a fresh hash once the
password has been verified. Hashing at the default (OWASP's scrypt floor,
N=2^17, r=8, p=1) costs 0.1 to 0.5 s of CPU and 128 MiB: callers on a trio
loop run it with ``trio.to_thread.run_sync``.

Bearer tokens are 256 random bits (``secrets.token_urlsafe``); only their
SHA-256 is stored, so a leaked table yields no usable token. SHA-256 without
a salt suffices here, unlike for passwords: the input is random, not guessable.
A :class:`TokenRecord` holds the owner, the expiry and the revocation.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
import unicodedata
from dataclasses import dataclass
from datetime import datetime, timedelta

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "MAX_PASSWORD_CHARS",
    "MIN_PASSWORD_CHARS",
    "PasswordPolicyError",
    "ScryptParams",
    "StoredHashError",
    "TokenRecord",
    "check_password_policy",
    "hash_password",
    "hash_token",
    "issue_token",
    "needs_rehash",
    "new_token",
    "parse_stored_hash",
    "verify_password",
]

#: NIST SP 800-63B asks for at least 8; a platform handing out GPUs asks for more.
MIN_PASSWORD_CHARS = 12
#: Bounded so a huge password cannot be used to burn CPU.
MAX_PASSWORD_CHARS = 1024
_SALT_BYTES = 16
_HASH_BYTES = 32
#: The most memory a stored string may make a verification use (128·r·N bytes).
#: A tampered row asking for more is refused instead of exhausting the node.
_MAX_SCRYPT_BYTES = 512 * 1024 * 1024
_TOKEN_PREFIX = "cac_"


class PasswordPolicyError(ValueError):
    """A new password is refused; ``reason`` says why, fit to show the user."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"password refused: {reason}")
        self.reason = reason


class StoredHashError(ValueError):
    """A stored password hash is malformed (corrupt or tampered row), not a wrong password."""


@dataclass(frozen=True)
class ScryptParams:
    """scrypt's cost parameters: N = 2**ln (CPU/memory), r (block size), p (parallelism)."""

    ln: int = 17
    r: int = 8
    p: int = 1

    def __post_init__(self) -> None:
        if not (1 <= self.ln <= 30 and 1 <= self.r <= 64 and 1 <= self.p <= 16):
            raise ValueError(f"scrypt parameters out of range: {self}")
        if self.memory_bytes > _MAX_SCRYPT_BYTES:
            raise ValueError(f"scrypt parameters need {self.memory_bytes} bytes, "
                                  f"more than the {_MAX_SCRYPT_BYTES} allowed: {self}")

    @property
    def n(self) -> int:
        return 1 << self.ln

    @property
    def memory_bytes(self) -> int:
        return 128 * self.r * self.n

    def encode(self) -> str:
        return f"ln={self.ln},r={self.r},p={self.p}"


DEFAULT_PARAMS = ScryptParams()

_STORED = re.compile(r"\$scrypt\$ln=(\d{1,2}),r=(\d{1,2}),p=(\d{1,2})"
                     r"\$([A-Za-z0-9+/]+={0,2})\$([A-Za-z0-9+/]+={0,2})")


def _normalise(password: str) -> bytes:
    # NFC, as RFC 8265's OpaqueString: the same password typed on two keyboards
    # (composed or decomposed accents) must hash alike.
    return unicodedata.normalize("NFC", password).encode("utf-8")


def check_password_policy(password: str) -> None:
    """Raise :class:`PasswordPolicyError` unless ``password`` may be set."""
    length = len(unicodedata.normalize("NFC", password))
    if length < MIN_PASSWORD_CHARS:
        raise PasswordPolicyError(f"at least {MIN_PASSWORD_CHARS} characters, got {length}")
    if length > MAX_PASSWORD_CHARS:
        raise PasswordPolicyError(f"at most {MAX_PASSWORD_CHARS} characters, got {length}")
    if not password.strip():
        raise PasswordPolicyError("must not be only whitespace")
    if len(set(password)) < 4:
        raise PasswordPolicyError("needs at least 4 different characters")


def _scrypt(password: str, salt: bytes, params: ScryptParams, length: int) -> bytes:
    return hashlib.scrypt(_normalise(password), salt=salt, n=params.n, r=params.r,
                          p=params.p, maxmem=params.memory_bytes + 16 * 1024 * 1024,
                          dklen=length)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    text = text.rstrip("=")
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


def hash_password(password: str, *, params: ScryptParams = DEFAULT_PARAMS) -> str:
    """The string to store for a new ``password`` (policy checked first)."""
    check_password_policy(password)
    salt = secrets.token_bytes(_SALT_BYTES)
    digest = _scrypt(password, salt, params, _HASH_BYTES)
    return f"$scrypt${params.encode()}${_b64(salt)}${_b64(digest)}"


def parse_stored_hash(stored: str) -> tuple[ScryptParams, bytes, bytes]:
    """``(params, salt, hash)`` of a stored string, or :class:`StoredHashError`."""
    match = _STORED.fullmatch(stored)
    if match is None:
        raise StoredHashError(f"not a $scrypt$ hash: {stored[:24]!r}…")
    ln, r, p = (int(group) for group in match.group(1, 2, 3))
    try:
        params = ScryptParams(ln=ln, r=r, p=p)
    except ValueError as error:
        raise StoredHashError(f"stored hash: {error}") from error
    try:
        salt, digest = _unb64(match.group(4)), _unb64(match.group(5))
    except (binascii.Error, ValueError) as error:
        raise StoredHashError(f"bad base64 in stored hash: {error}") from error
    if len(salt) < 8 or not 16 <= len(digest) <= 64:
        raise StoredHashError(f"stored hash has a {len(salt)}-byte salt and a "
                              f"{len(digest)}-byte hash (want at least 8, and 16 to 64)")
    return params, salt, digest


def verify_password(password: str, stored: str) -> bool:
    """Whether ``password`` matches ``stored`` (compared in constant time).

    A wrong password is ``False``; a malformed ``stored`` raises
    :class:`StoredHashError`, since that is a corrupt record, not a bad login.
    The policy is not applied: it governs new passwords, not old ones.
    """
    params, salt, expected = parse_stored_hash(stored)
    if len(password) > MAX_PASSWORD_CHARS:
        return False
    return hmac.compare_digest(_scrypt(password, salt, params, len(expected)), expected)


def needs_rehash(stored: str, params: ScryptParams = DEFAULT_PARAMS) -> bool:
    """Whether ``stored`` is weaker than ``params`` in any parameter (rehash at login)."""
    old, _, _ = parse_stored_hash(stored)
    return old.ln < params.ln or old.r < params.r or old.p < params.p


def hash_token(token: str) -> str:
    """The stored form of a bearer token: SHA-256, hex (also its lookup key)."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> tuple[str, str]:
    """``(token, token_hash)``: give the token to the client once, store only the hash.

    The ``cac_`` prefix lets secret scanners recognise a leaked token.
    """
    token = _TOKEN_PREFIX + secrets.token_urlsafe(32)
    return token, hash_token(token)


class TokenRecord(BaseModel):
    """What is stored of a bearer token: its hash, owner, lifetime and revocation."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    token_hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    user_id: str = Field(min_length=1)
    created_at: AwareDatetime
    expires_at: AwareDatetime
    #: When it was revoked (logout, password change, admin); ``None`` while live.
    revoked_at: AwareDatetime | None = None

    @model_validator(mode="after")
    def _expires_after_creation(self) -> TokenRecord:
        if self.expires_at <= self.created_at:
            raise ValueError(f"token expires ({self.expires_at}) before it is created "
                             f"({self.created_at})")
        return self

    def is_valid(self, now: datetime) -> bool:
        """Live at ``now``: created, not yet expired, never revoked."""
        return self.revoked_at is None and self.created_at <= now < self.expires_at

    def matches(self, token: str) -> bool:
        """Whether ``token`` is the one this record was made for (constant time)."""
        return hmac.compare_digest(hash_token(token), self.token_hash)

    def revoke(self, now: datetime) -> TokenRecord:
        """This record revoked at ``now`` (an earlier revocation is kept)."""
        if self.revoked_at is not None:
            return self
        return self.model_copy(update={"revoked_at": now})


def issue_token(user_id: str, *, now: datetime, ttl: timedelta) -> tuple[str, TokenRecord]:
    """A new token for ``user_id`` living ``ttl`` from ``now``, and the record to store."""
    token, token_hash = new_token()
    record = TokenRecord(token_hash=token_hash, user_id=user_id, created_at=now,
                         expires_at=now + ttl)
    return token, record
