"""Write tokens: proof that an announcer receives datagrams at its address.

Theory of operation
-------------------
Every reply a node sends carries a token; ANNOUNCE and UNANNOUNCE must bring one
back (DESIGN.md §3.4, holepunch.md §1.4). A token is the keyed BLAKE2b-128 of
the asker's packed address under the node's current secret::

    token (16 bytes) = BLAKE2b(pack_address(host, port), key=secret[n], digest_size=16)
    secret[n] (32)   = BLAKE2b(n as u64 BE, key=secret_seed, person="cosmicac-dht-tok")

The secret rotates every ``rotate_every_s``; a token made under the current
secret or the one before is accepted, so a token lives between one and two
rotation periods. Because only a sender that *receives* replies at an address
can learn a token for it, a spoofed source address cannot store records.

The token is bound to the full address (IP **and** port), as DESIGN.md says
("bound to the asker's address"), while upstream HyperDHT binds the IP only.
Binding the port as well means a token leaked to (or sniffed by) another process
behind the same IP, e.g. another host behind the same NAT, is useless to it; the
cost is that a node whose NAT mapping changes port must query again before it
announces, which the announcer does anyway (query first, then commit).

Secrets are derived from the seed and the rotation counter, never drawn at each
rotation, so tests are reproducible from a seed; :meth:`TokenIssuer.with_random_seed`
is the one place that reads ``os.urandom``. Time is always the caller's ``now``
(any monotonic clock in seconds, e.g. ``trio.current_time()``); if it goes
backwards the issuer stays where it is.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os

from ..errors import KeyFormatError
from ._contact import pack_address
from ._errors import DhtUsageError

__all__ = ["DEFAULT_TOKEN_ROTATE_S", "TOKEN_BYTES", "TokenIssuer"]

#: Length of a write token. 128 bits: unguessable, and small on the wire.
TOKEN_BYTES = 16
#: Default rotation period. Upstream rotates every ~7.5 s; we allow a full
#: query-then-commit round across a slow network (tokens live 60-120 s).
DEFAULT_TOKEN_ROTATE_S = 60.0
_SECRET_BYTES = 32
_MIN_SEED_BYTES = 16
_MAX_SEED_BYTES = 64  # BLAKE2b's longest key
_PERSON = b"cosmicac-dht-tok"


class TokenIssuer:
    """Issues and checks write tokens under a rotating secret.

    Args:
        secret_seed: 16 to 64 secret bytes; every rotation's secret derives from it.
        rotate_every_s: seconds between rotations (> 0).
        now: the current time; the first rotation happens ``rotate_every_s`` later.

    Raises:
        DhtUsageError: a bad seed (``BAD_SECRET``) or period (``BAD_CONFIG``).
    """

    def __init__(
        self,
        secret_seed: bytes,
        *,
        rotate_every_s: float = DEFAULT_TOKEN_ROTATE_S,
        now: float,
    ) -> None:
        if type(secret_seed) is not bytes or not (
            _MIN_SEED_BYTES <= len(secret_seed) <= _MAX_SEED_BYTES
        ):
            raise DhtUsageError(
                f"a token secret seed is {_MIN_SEED_BYTES}-{_MAX_SEED_BYTES} bytes",
                code="BAD_SECRET",
            )
        if not (isinstance(rotate_every_s, int | float) and 0 < rotate_every_s < math.inf):
            raise DhtUsageError("rotate_every_s must be positive and finite", code="BAD_CONFIG")
        if not math.isfinite(now):
            raise DhtUsageError("now must be finite", code="BAD_CONFIG")
        self._seed = secret_seed
        self._period_s = float(rotate_every_s)
        self._counter = 0
        self._next_rotation_at = now + self._period_s
        self._current = self._secret(0)
        self._previous: bytes | None = None

    @classmethod
    def with_random_seed(
        cls, *, rotate_every_s: float = DEFAULT_TOKEN_ROTATE_S, now: float
    ) -> TokenIssuer:
        """Build an issuer with a fresh 32-byte seed from ``os.urandom``.

        Args:
            rotate_every_s: seconds between rotations.
            now: the current time.

        Returns:
            A new issuer; its tokens are unrelated to any other issuer's.
        """
        return cls(os.urandom(_SECRET_BYTES), rotate_every_s=rotate_every_s, now=now)

    @property
    def rotation(self) -> int:
        """How many times the secret has rotated so far."""
        return self._counter

    @property
    def next_rotation_at(self) -> float:
        """When the next rotation is due (the core's next deadline for tokens)."""
        return self._next_rotation_at

    def rotate(self, now: float) -> None:
        """Rotate at once (e.g. after a suspected leak), then every period from ``now``.

        Tokens made under the secret that was current stay valid for one more
        rotation; older ones are invalid from now on.

        Args:
            now: the current time.
        """
        self._advance(now)
        self._set_counter(self._counter + 1)
        self._next_rotation_at = max(self._next_rotation_at, now + self._period_s)

    def issue(self, host: str, port: int, now: float) -> bytes:
        """The token to put in a reply to ``host:port``.

        Args:
            host: the asker's IP as observed (the datagram's source).
            port: the asker's UDP port as observed.
            now: the current time; rotates first if a rotation is due.

        Returns:
            A 16-byte token.

        Raises:
            DhtUsageError: ``host:port`` is not an IP address and port (``BAD_ADDRESS``).
        """
        self._advance(now)
        try:
            packed = pack_address(host, port)
        except KeyFormatError as exc:
            raise DhtUsageError(exc.message, code="BAD_ADDRESS") from None
        return _token(self._current, packed)

    def check(self, token: object, host: str, port: int, now: float) -> bool:
        """Whether ``token`` was issued to ``host:port`` within the last rotation.

        Args:
            token: what the request carried (any type; non-bytes are invalid).
            host: the request's observed source IP.
            port: the request's observed source port.
            now: the current time; rotates first if a rotation is due.

        Returns:
            True if it matches the current or the previous secret. Never raises;
            refuse the request when False (upstream's code is ``INVALID_TOKEN``).
        """
        self._advance(now)
        if type(token) is not bytes or len(token) != TOKEN_BYTES:
            return False
        try:
            packed = pack_address(host, port)
        except (KeyFormatError, TypeError, ValueError, AttributeError):
            return False
        # Compare against both secrets, without short-circuiting, in constant time.
        ok = hmac.compare_digest(token, _token(self._current, packed))
        if self._previous is not None:
            ok |= hmac.compare_digest(token, _token(self._previous, packed))
        return ok

    def _advance(self, now: float) -> None:
        if not now >= self._next_rotation_at:  # also false for NaN: stay put
            return
        if now == math.inf:
            return
        steps = int((now - self._next_rotation_at) // self._period_s) + 1
        self._set_counter(self._counter + steps)
        self._next_rotation_at += steps * self._period_s

    def _set_counter(self, counter: int) -> None:
        if counter == self._counter + 1:
            self._previous = self._current
        else:
            # Skipped several rotations: the previous secret is counter - 1,
            # which never issued a token we still remember, but derive it anyway
            # so the rule "current or previous" holds exactly.
            self._previous = self._secret(counter - 1)
        self._counter = counter
        self._current = self._secret(counter)

    def _secret(self, counter: int) -> bytes:
        return hashlib.blake2b(
            (counter & 0xFFFF_FFFF_FFFF_FFFF).to_bytes(8, "big"),
            key=self._seed,
            digest_size=_SECRET_BYTES,
            person=_PERSON,
        ).digest()


def _token(secret: bytes, packed_address: bytes) -> bytes:
    return hashlib.blake2b(packed_address, key=secret, digest_size=TOKEN_BYTES).digest()
