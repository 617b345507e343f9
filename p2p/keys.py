"""Identities, key formats and topics (DESIGN.md §3.1).

Every peer is an Ed25519 key pair. The same key pair also gives the peer's
Noise static key: X25519 keys are derived from the Ed25519 ones with the
standard birational map (libsodium's ``crypto_sign_ed25519_*_to_curve25519``),
so a peer has one identity and a remote can check that the Noise static key
it saw belongs to the Ed25519 key it was told about.

Keys are shown and read as 64 lowercase hex characters. A daemon keeps its key
pair in ``<storage>/identity`` (mode 0600), created on first use and reused
after, so the same storage folder always yields the same key.

Topics are 32-byte values made with keyed BLAKE2b: the key is derived from a
namespace string, so two uses that hash the same input under different
namespaces never collide.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import nacl.bindings
import nacl.exceptions
import nacl.signing

from .errors import IdentityError, KeyFormatError
from .files import private_folder

__all__ = [
    "IDENTITY_FILE",
    "KEY_BYTES",
    "SIGNATURE_BYTES",
    "KeyPair",
    "derive_topic",
    "format_key",
    "load_keypair",
    "load_or_create_keypair",
    "parse_public_key",
    "parse_topic",
    "public_key_to_x25519",
    "verify_signature",
]

log = logging.getLogger(__name__)

KEY_BYTES = 32
SIGNATURE_BYTES = 64
IDENTITY_FILE = "identity"
_IDENTITY_VERSION = 1
_TOPIC_NAMESPACE_PREFIX = b"cosmicac/topic/v1/"


@dataclass(frozen=True, eq=False)
class KeyPair:
    """An Ed25519 key pair, with its X25519 twin for Noise.

    Build one with :meth:`generate`, :meth:`from_seed` or
    :func:`load_or_create_keypair`; never by hand.
    """

    seed: bytes = field(repr=False)
    public_key: bytes
    _signing_key: nacl.signing.SigningKey = field(repr=False, compare=False)

    @classmethod
    def generate(cls) -> KeyPair:
        return cls.from_seed(os.urandom(KEY_BYTES))

    @classmethod
    def from_seed(cls, seed: bytes) -> KeyPair:
        """Derive the key pair from its 32-byte secret seed.

        Raises:
            KeyFormatError: the seed is not 32 bytes.
        """
        if not isinstance(seed, bytes | bytearray) or len(seed) != KEY_BYTES:
            raise KeyFormatError(f"a secret seed is {KEY_BYTES} bytes, got {len(seed)}")
        signing_key = nacl.signing.SigningKey(bytes(seed))
        return cls(bytes(seed), bytes(signing_key.verify_key), signing_key)

    def sign(self, message: bytes) -> bytes:
        """Return the 64-byte detached Ed25519 signature of ``message``."""
        return self._signing_key.sign(message).signature

    @functools.cached_property
    def x25519_private(self) -> bytes:
        """The X25519 private key used as this peer's Noise static key."""
        return nacl.bindings.crypto_sign_ed25519_sk_to_curve25519(self.seed + self.public_key)

    @property
    def x25519_public(self) -> bytes:
        return public_key_to_x25519(self.public_key)

    @property
    def hex(self) -> str:
        return format_key(self.public_key)

    def __repr__(self) -> str:
        return f"KeyPair(public_key={self.hex})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KeyPair) and other.public_key == self.public_key

    def __hash__(self) -> int:
        return hash(self.public_key)


def verify_signature(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """Return True if ``signature`` is ``public_key``'s signature of ``message``.

    Never raises for bad input: a malformed key or signature is simply invalid.
    """
    if len(public_key) != KEY_BYTES or len(signature) != SIGNATURE_BYTES:
        return False
    try:
        nacl.signing.VerifyKey(bytes(public_key)).verify(bytes(message), bytes(signature))
    except (nacl.exceptions.BadSignatureError, nacl.exceptions.CryptoError, ValueError):
        return False
    return True


@functools.lru_cache(maxsize=4096)
def public_key_to_x25519(public_key: bytes) -> bytes:
    """Map an Ed25519 public key to the X25519 key of the same identity.

    Cached (bounded): the map costs ~65 µs, a noticeable share of a handshake,
    and a node meets the same peers again and again.

    Raises:
        KeyFormatError: the bytes are not a valid Ed25519 point.
    """
    if len(public_key) != KEY_BYTES:
        raise KeyFormatError(f"a public key is {KEY_BYTES} bytes, got {len(public_key)}")
    try:
        return nacl.bindings.crypto_sign_ed25519_pk_to_curve25519(bytes(public_key))
    except (nacl.exceptions.CryptoError, nacl.exceptions.RuntimeError) as exc:
        raise KeyFormatError(f"{public_key.hex()} is not a valid Ed25519 public key") from exc


def format_key(key: bytes) -> str:
    """Show a 32-byte key (or topic) as 64 lowercase hex characters."""
    return bytes(key).hex()


def parse_public_key(text: str, *, what: str = "public key") -> bytes:
    """Read a key written as 64 hex characters (surrounding blanks are allowed).

    Raises:
        KeyFormatError: with a message that says what is wrong with the text.
    """
    cleaned = text.strip().lower() if isinstance(text, str) else ""
    if len(cleaned) != 2 * KEY_BYTES:
        raise KeyFormatError(
            f"a {what} is {2 * KEY_BYTES} hex characters, got {len(cleaned)}: {text!r}"
        )
    try:
        return bytes.fromhex(cleaned)
    except ValueError:
        bad = next(ch for ch in cleaned if ch not in "0123456789abcdef")
        raise KeyFormatError(
            f"a {what} is written in hex (0-9, a-f); found {bad!r} in {text!r}"
        ) from None


def derive_topic(namespace: str, value: bytes | str) -> bytes:
    """Derive a 32-byte topic from a namespace and an input.

    The namespace selects the BLAKE2b key, so ``derive_topic("jobs", x)`` and
    ``derive_topic("inference", x)`` are unrelated values.
    """
    if not namespace:
        raise KeyFormatError("a topic namespace must not be empty")
    data = value.encode() if isinstance(value, str) else bytes(value)
    hash_key = hashlib.blake2b(
        _TOPIC_NAMESPACE_PREFIX + namespace.encode(), digest_size=32
    ).digest()
    return hashlib.blake2b(data, key=hash_key, digest_size=32).digest()


def parse_topic(text: str, *, namespace: str = "user") -> bytes:
    """Read a topic as people write it: 64 hex characters, or any string.

    Any text that is not exactly 64 hex characters is hashed into a topic under
    ``namespace``, so ``cosmicac dht lookup my-service`` works too.
    """
    try:
        return parse_public_key(text, what="topic")
    except KeyFormatError:
        if not text:
            raise KeyFormatError("a topic must not be empty") from None
        return derive_topic(namespace, text)


def load_or_create_keypair(storage: str | os.PathLike[str]) -> KeyPair:
    """Load ``<storage>/identity``, creating the folder and the file if absent.

    The file is written once, atomically, with mode 0600 and is never rewritten.

    Raises:
        IdentityError: the file exists but is unreadable, malformed, or its
            public key does not match its secret seed; or the folder or the
            file cannot be created (read-only, not ours, full disk).
    """
    folder = Path(storage)
    path = folder / IDENTITY_FILE
    try:
        private_folder(folder)
    except OSError as exc:
        raise IdentityError(f"cannot use storage folder {folder}: {exc.strerror}") from exc
    try:
        exists = path.exists()
    except OSError as exc:  # EACCES on the folder: Path.exists raises it
        raise IdentityError(f"cannot look into storage folder {folder}: {exc.strerror}; "
                            "make it readable by this user, or pick another storage "
                            "folder") from exc
    if exists:
        return _read_identity(path)
    keypair = KeyPair.generate()
    try:
        _write_identity(path, keypair)
    except FileExistsError:
        # Another process created it between our check and our write: use theirs.
        return _read_identity(path)
    except OSError as exc:
        raise IdentityError(f"cannot create identity file {path}: {exc.strerror or exc}; "
                            f"make {folder} writable by this user, or pick another "
                            "storage folder") from exc
    log.info("identity.created path=%s key=%s", path, keypair.hex)
    return keypair


def load_keypair(storage: str | os.PathLike[str]) -> KeyPair:
    """Load ``<storage>/identity``; never create it.

    Raises:
        IdentityError: the file is missing, unreadable or malformed.
    """
    return _read_identity(Path(storage) / IDENTITY_FILE)


def _read_identity(path: Path) -> KeyPair:
    try:
        raw = path.read_bytes()
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError as exc:
        raise IdentityError(f"cannot read identity file {path}: {exc.strerror}") from exc
    if mode & 0o077:
        log.warning(
            "identity.permissions path=%s mode=%o hint='chmod 600 %s'", path, mode, path
        )
    try:
        doc = json.loads(raw.decode("utf-8"))
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        version = doc.get("version")
        if version != _IDENTITY_VERSION:
            raise ValueError(f"unknown version {version!r}")
        seed = bytes.fromhex(doc["secret_seed"])
        public_key = bytes.fromhex(doc["public_key"])
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise IdentityError(
            f"identity file {path} is corrupt ({_describe(exc)}); restore it from a backup, "
            f"or move it away to create a new identity (peers that know the old key "
            f"will no longer recognise this one)"
        ) from exc
    if len(seed) != KEY_BYTES:
        raise IdentityError(f"identity file {path} is corrupt (secret seed has {len(seed)} bytes)")
    keypair = KeyPair.from_seed(seed)
    if keypair.public_key != public_key:
        raise IdentityError(
            f"identity file {path} is corrupt (its public key {public_key.hex()} does not "
            f"match its secret seed, which gives {keypair.hex})"
        )
    return keypair


def _describe(exc: BaseException) -> str:
    if isinstance(exc, KeyError):
        return f"missing field {exc.args[0]!r}"
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8 text"
    return str(exc) or type(exc).__name__


def _write_identity(path: Path, keypair: KeyPair) -> None:
    doc = {
        "version": _IDENTITY_VERSION,
        "public_key": keypair.hex,
        "secret_seed": keypair.seed.hex(),
    }
    data = (json.dumps(doc, indent=2) + "\n").encode()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        os.unlink(tmp)  # a full disk leaves no half-written secret behind
        raise
    try:
        # link() fails if the target exists, unlike rename(): first writer wins.
        os.link(tmp, path)
    finally:
        os.unlink(tmp)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
