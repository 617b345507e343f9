"""The database's operations as typed values: what a caller appends, checked when built.

Each class is one operation of :mod:`._ops`, the same rules and the same wire
encoding: :meth:`to_wire` gives the positional array an entry stores, and
:func:`decode_op` turns a stored array back into its class. Nothing about logs,
replication or stored data changes; the classes are a checked way to build
what was always written::

    ============================  ================  ===================================
    class                         wire name         wire arguments
    ============================  ================  ===================================
    :class:`PutApiKey`            ``key_put``       id, team, name, secret_hash, scopes,
                                                    created_ms
    :class:`RevokeApiKey`         ``key_revoke``    id, revoked_ms
    :class:`PutModelMaster`       ``model_put``     name, runtime, defaults
    :class:`DeleteModelMaster`    ``model_delete``  name
    :class:`AddTokenUsage`        ``usage_add``     key_id, model, day, prompt, completion,
    :class:`AddAudioUsage`                          total, audio_ms, requests
    :class:`MarkKeyUsed`          ``key_used``      key_id, at_ms
    :class:`AddWriter`            ``add_writer``    key, admin
    :class:`RemoveWriter`         ``remove_writer`` key, length
    ============================  ================  ===================================

Both usage classes write ``usage_add``: :class:`AddAudioUsage` is one with
audio milliseconds and no tokens, :class:`AddTokenUsage` every other (so
``decode_op(op.to_wire()) == op`` for every valid op, and every stored
``usage_add`` decodes to exactly one of them).

Building an operation validates it (:func:`._ops.validate_op`, the check every
replica applies) and raises :class:`InvalidOp` naming the operation and the
field. Fields are kept as given, except that ``scopes`` becomes a tuple and the
map of :class:`PutModelMaster` is copied (it is the one field a caller could
still change in place, so every op is checked again when appended).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, ClassVar

from ._errors import InvalidOp
from ._ops import hash_secret, validate_op

__all__ = [
    "OP_TYPES",
    "AddAudioUsage",
    "AddTokenUsage",
    "AddWriter",
    "DeleteModelMaster",
    "MarkKeyUsed",
    "Op",
    "PutApiKey",
    "PutModelMaster",
    "RemoveWriter",
    "RevokeApiKey",
    "decode_op",
    "wire_batch",
    "wire_ops",
]


class _Operation:
    """What every operation class shares: its wire name, checking, encoding."""

    __slots__ = ()
    #: The op's name in an entry (``key_put``...).
    WIRE_NAME: ClassVar[str]

    def to_wire(self) -> tuple[Any, ...]:
        """The positional array an entry stores: ``(wire name, *arguments)``."""
        raise NotImplementedError

    def _check(self) -> None:
        validate_op(self.to_wire())  # InvalidOp names the op and the field


@dataclass(frozen=True, slots=True)
class PutApiKey(_Operation):
    """Create or replace an API key (fields last-writer-wins).

    Pass ``hash_secret(secret)`` as ``secret_hash``, never the secret (or use
    :meth:`with_secret`). ``id``, ``team`` up to 256 characters, not empty;
    ``name`` may be empty; at most 64 ``scopes``; ``created_ms`` ≥ 0.
    """

    WIRE_NAME: ClassVar[str] = "key_put"
    id: str
    team: str
    name: str
    secret_hash: bytes
    scopes: tuple[str, ...]
    created_ms: int

    def __post_init__(self) -> None:
        if isinstance(self.scopes, list | tuple):
            object.__setattr__(self, "scopes", tuple(self.scopes))
        self._check()

    @classmethod
    def with_secret(cls, id: str, team: str, name: str, secret: str,
                    scopes: Sequence[str], created_ms: int) -> PutApiKey:
        """The same, given the secret: only its hash is kept."""
        if not isinstance(secret, str) or not secret:
            raise InvalidOp("key_put: secret must be a non-empty string", op=cls.WIRE_NAME,
                            field="secret")
        return cls(id, team, name, hash_secret(secret), tuple(scopes), created_ms)

    def to_wire(self) -> tuple[Any, ...]:
        # scopes as a list, as msgpack decodes it, so a built entry equals its decoded copy
        scopes = list(self.scopes) if isinstance(self.scopes, tuple) else self.scopes
        return ("key_put", self.id, self.team, self.name, self.secret_hash, scopes,
                self.created_ms)


@dataclass(frozen=True, slots=True)
class RevokeApiKey(_Operation):
    """Revoke an API key for good (a tombstone: no later put revives it)."""

    WIRE_NAME: ClassVar[str] = "key_revoke"
    id: str
    revoked_ms: int

    def __post_init__(self) -> None:
        self._check()

    def to_wire(self) -> tuple[Any, ...]:
        return ("key_revoke", self.id, self.revoked_ms)


@dataclass(frozen=True, slots=True)
class PutModelMaster(_Operation):
    """Create or replace a model master (last-writer-wins by stamp).

    ``defaults`` is a JSON-like map with string keys, at most 16 KiB encoded;
    it is copied when built. (Not hashable: a map is not.)
    """

    WIRE_NAME: ClassVar[str] = "model_put"
    name: str
    runtime: str
    defaults: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if isinstance(self.defaults, Mapping):
            object.__setattr__(self, "defaults", copy.deepcopy(dict(self.defaults)))
        self._check()

    def to_wire(self) -> tuple[Any, ...]:
        defaults = self.defaults
        return ("model_put", self.name, self.runtime,
                dict(defaults) if isinstance(defaults, Mapping) else defaults)


@dataclass(frozen=True, slots=True)
class DeleteModelMaster(_Operation):
    """Delete a model master (a stamped tombstone: a later put revives it)."""

    WIRE_NAME: ClassVar[str] = "model_delete"
    name: str

    def __post_init__(self) -> None:
        self._check()

    def to_wire(self) -> tuple[Any, ...]:
        return ("model_delete", self.name)


@dataclass(frozen=True, slots=True)
class AddTokenUsage(_Operation):
    """Add one key's token usage for a model and UTC day (integer sums).

    ``day`` is ``YYYY-MM-DD``; the counts (keyword-only) are integers in
    0..2**53-1. ``audio_ms``
    is for a request that used both; audio alone is :class:`AddAudioUsage`
    (an all-zero token count with audio is refused here, field ``audio_ms``).
    """

    WIRE_NAME: ClassVar[str] = "usage_add"
    key_id: str
    model: str
    day: str
    _: KW_ONLY
    prompt: int = 0
    completion: int = 0
    total: int = 0
    audio_ms: int = 0
    requests: int = 1

    def __post_init__(self) -> None:
        self._check()
        if _is_audio_only(self.prompt, self.completion, self.total, self.audio_ms):
            raise InvalidOp("usage_add: audio without tokens is AddAudioUsage",
                            op=self.WIRE_NAME, field="audio_ms")

    def to_wire(self) -> tuple[Any, ...]:
        return ("usage_add", self.key_id, self.model, self.day, self.prompt, self.completion,
                self.total, self.audio_ms, self.requests)


@dataclass(frozen=True, slots=True)
class AddAudioUsage(_Operation):
    """Add one key's audio usage (milliseconds, > 0) for a model and UTC day."""

    WIRE_NAME: ClassVar[str] = "usage_add"
    key_id: str
    model: str
    day: str
    audio_ms: int
    _: KW_ONLY
    requests: int = 1

    def __post_init__(self) -> None:
        self._check()
        if self.audio_ms == 0:
            raise InvalidOp("usage_add: audio_ms must be > 0 for audio usage",
                            op=self.WIRE_NAME, field="audio_ms")

    def to_wire(self) -> tuple[Any, ...]:
        return ("usage_add", self.key_id, self.model, self.day, 0, 0, 0, self.audio_ms,
                self.requests)


@dataclass(frozen=True, slots=True)
class MarkKeyUsed(_Operation):
    """Record that a key was used at ``at_ms`` (the view keeps the latest)."""

    WIRE_NAME: ClassVar[str] = "key_used"
    key_id: str
    at_ms: int

    def __post_init__(self) -> None:
        self._check()

    def to_wire(self) -> tuple[Any, ...]:
        return ("key_used", self.key_id, self.at_ms)


@dataclass(frozen=True, slots=True)
class AddWriter(_Operation):
    """Admit ``key`` (32 bytes) as a writer; ``admin`` lets it add and remove writers.

    Needs an admin; :meth:`Database.change_writer` plans it for you.
    """

    WIRE_NAME: ClassVar[str] = "add_writer"
    key: bytes
    admin: bool = False

    def __post_init__(self) -> None:
        self._check()

    def to_wire(self) -> tuple[Any, ...]:
        return ("add_writer", self.key, self.admin)


@dataclass(frozen=True, slots=True)
class RemoveWriter(_Operation):
    """Cap writer ``key``: only its first ``length`` entries count, on every replica.

    Needs an admin; :meth:`Database.change_writer` plans it (and refuses to
    remove the last admin, ``LAST_ADMIN``).
    """

    WIRE_NAME: ClassVar[str] = "remove_writer"
    key: bytes
    length: int

    def __post_init__(self) -> None:
        self._check()

    def to_wire(self) -> tuple[Any, ...]:
        return ("remove_writer", self.key, self.length)


#: Any operation an entry can carry.
Op = (PutApiKey | RevokeApiKey | PutModelMaster | DeleteModelMaster | AddTokenUsage
      | AddAudioUsage | MarkKeyUsed | AddWriter | RemoveWriter)
#: Every operation class.
OP_TYPES: tuple[type[_Operation], ...] = (
    PutApiKey, RevokeApiKey, PutModelMaster, DeleteModelMaster, AddTokenUsage, AddAudioUsage,
    MarkKeyUsed, AddWriter, RemoveWriter)


def _is_audio_only(prompt: Any, completion: Any, total: Any, audio_ms: Any) -> bool:
    return prompt == completion == total == 0 and audio_ms != 0


def decode_op(wire: Sequence[Any]) -> Op:
    """The typed operation of one stored op array (an element of :attr:`Entry.ops`).

    Raises:
        InvalidOp: the array is not a valid op (replicas skip such ops).
    """
    validate_op(wire)
    name, *args = wire
    if name == "key_put":
        return PutApiKey(*args)
    if name == "key_revoke":
        return RevokeApiKey(*args)
    if name == "model_put":
        return PutModelMaster(*args)
    if name == "model_delete":
        return DeleteModelMaster(*args)
    if name == "usage_add":
        key_id, model, day, prompt, completion, total, audio_ms, requests = args
        if _is_audio_only(prompt, completion, total, audio_ms):
            return AddAudioUsage(key_id, model, day, audio_ms, requests=requests)
        return AddTokenUsage(key_id, model, day, prompt=prompt, completion=completion,
                             total=total, audio_ms=audio_ms, requests=requests)
    if name == "key_used":
        return MarkKeyUsed(*args)
    if name == "add_writer":
        return AddWriter(*args)
    return RemoveWriter(*args)  # the only name validate_op leaves


def wire_ops(ops: Sequence[Op | Sequence[Any]]) -> list[tuple[Any, ...] | Sequence[Any]]:
    """One entry's ops in their wire form: typed ones encoded, arrays as given.

    Nothing is checked here; :func:`._ops.validate_batch` checks the result.
    """
    return [op.to_wire() if isinstance(op, _Operation) else op for op in ops]


def wire_batch(batch: Sequence[Sequence[Op | Sequence[Any]]]) -> list[list[Any]]:
    """:func:`wire_ops` for every entry of a batch."""
    return [wire_ops(ops) for ops in batch]
