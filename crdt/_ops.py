"""The operations an entry may carry, and the one place that checks them.

This is the wire form; callers build operations with the typed classes of
:mod:`._operations` (``PutApiKey``...), which encode to exactly these arrays.

An op is an array ``[name, *args]`` (positional, so entries stay small):

=================  ==========================================================
op                 arguments
=================  ==========================================================
``key_put``        ``id, team, name, secret_hash (32 bytes), scopes, created_ms``
``key_revoke``     ``id, revoked_ms``
``model_put``      ``name, runtime, defaults`` (a map with str keys)
``model_delete``   ``name``
``usage_add``      ``key_id, model, day ("YYYY-MM-DD"), prompt, completion,
                   total, audio_ms, requests`` (integers >= 0 and < 2**53)
``key_used``       ``key_id, at_ms``
``add_writer``     ``key (32 bytes), admin (bool)``
``remove_writer``  ``key (32 bytes), length (>= 0)``
=================  ==========================================================

:func:`validate_op` is a pure function of the op, so every replica accepts or
skips exactly the same ops: the view skips an invalid op instead of failing
the entry, and convergence only needs the verdict to be the same everywhere.
The checks are strict on types (``True`` is not an integer, a float is never a
count) because the view's rules are exact integer arithmetic.
"""

from __future__ import annotations

import datetime
import hashlib
import math
import re
from collections.abc import Sequence
from typing import Any

import msgpack

from ._errors import BadEntry, InvalidOp, WriteRefused

__all__ = [
    "ADMIN_OPS",
    "MAX_DEFAULTS_BYTES",
    "MAX_SCOPES",
    "MAX_STR",
    "MAX_USAGE",
    "OP_NAMES",
    "hash_secret",
    "validate_batch",
    "validate_op",
]

#: Ops about who may write; the view ignores them (the base handles admission).
ADMIN_OPS = frozenset({"add_writer", "remove_writer"})
#: Longest string field, in characters.
MAX_STR = 256
#: Scopes one key may carry.
MAX_SCOPES = 64
#: A model's defaults, msgpack-encoded.
MAX_DEFAULTS_BYTES = 16 * 1024
#: Usage counts stay below 2**53 so that any consumer (JSON, JavaScript) reads them exactly.
MAX_USAGE = 2**53
_MAX_INT = 2**63 - 1  # what an SQLite INTEGER holds
_KEY_BYTES = 32
_MAX_DEPTH = 32
_DAY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", re.ASCII)
_PERSON = b"cosmicac/apikey"


def hash_secret(secret: str) -> bytes:
    """The 32-byte digest stored for an API secret (BLAKE2b-256, personalised).

    API secrets are long random strings, not passwords a person chose: nobody
    can guess one, so a slow password hash (argon2, scrypt) would add latency to
    every request and no security. The personalisation keeps these digests
    apart from any other BLAKE2b use of the same bytes.
    """
    return hashlib.blake2b(secret.encode("utf-8"), digest_size=32, person=_PERSON).digest()


def _bad(op: str, field: str | None, message: str) -> InvalidOp:
    return InvalidOp(f"{op}: {message}", op=op, field=field)


def _str(op: str, field: str, value: Any, *, empty: bool = False,
         label: str | None = None) -> None:
    label = label or field
    if not isinstance(value, str):
        raise _bad(op, field, f"{label} must be a string, got {type(value).__name__}")
    if not empty and not value:
        raise _bad(op, field, f"{label} must not be empty")
    if len(value) > MAX_STR:
        raise _bad(op, field, f"{label} is longer than {MAX_STR} characters")


def _int(op: str, field: str, value: Any, limit: int = _MAX_INT) -> None:
    # bool is a subclass of int; a flag sent where a count belongs is a bug
    if type(value) is not int:
        raise _bad(op, field, f"{field} must be an integer, got {type(value).__name__}")
    if not 0 <= value <= limit:
        raise _bad(op, field, f"{field} must be in 0..{limit}, got {value}")


def _key(op: str, field: str, value: Any) -> None:
    if not (isinstance(value, bytes) and len(value) == _KEY_BYTES):
        raise _bad(op, field, f"{field} must be {_KEY_BYTES} bytes")


def _json_value(op: str, value: Any, depth: int = 0) -> None:
    # The view stores defaults as JSON text, so they must survive JSON exactly:
    # no bytes, no non-string map keys, no NaN/inf (JSON has none).
    if depth > _MAX_DEPTH:
        raise _bad(op, "defaults", f"defaults nest deeper than {_MAX_DEPTH}")
    if value is None or isinstance(value, bool | int | str):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _bad(op, "defaults", "defaults hold a non-finite float")
        return
    if isinstance(value, list | tuple):
        for item in value:
            _json_value(op, item, depth + 1)
        return
    if isinstance(value, dict):
        for k, item in value.items():
            if not isinstance(k, str):
                raise _bad(op, "defaults", "defaults map keys must be strings")
            _json_value(op, item, depth + 1)
        return
    raise _bad(op, "defaults",
               f"defaults hold a {type(value).__name__}, which JSON cannot store")


def _check_key_put(args: Sequence[Any]) -> None:
    op = "key_put"
    id_, team, name, secret_hash, scopes, created_ms = args
    _str(op, "id", id_)
    _str(op, "team", team)
    _str(op, "name", name, empty=True)
    if not (isinstance(secret_hash, bytes) and len(secret_hash) == 32):
        raise _bad(op, "secret_hash", "secret_hash must be 32 bytes")
    if not isinstance(scopes, list | tuple):
        raise _bad(op, "scopes", "scopes must be a list of strings")
    if len(scopes) > MAX_SCOPES:
        raise _bad(op, "scopes", f"scopes has more than {MAX_SCOPES} items")
    for scope in scopes:
        _str(op, "scopes", scope, label="scopes item")
    _int(op, "created_ms", created_ms)


def _check_key_revoke(args: Sequence[Any]) -> None:
    _str("key_revoke", "id", args[0])
    _int("key_revoke", "revoked_ms", args[1])


def _check_model_put(args: Sequence[Any]) -> None:
    op = "model_put"
    name, runtime, defaults = args
    _str(op, "name", name)
    _str(op, "runtime", runtime)
    if not isinstance(defaults, dict):
        raise _bad(op, "defaults", "defaults must be a map")
    _json_value(op, defaults)
    try:
        size = len(msgpack.packb(defaults, use_bin_type=True))
    except (ValueError, OverflowError, TypeError) as exc:
        raise _bad(op, "defaults", f"defaults do not encode: {exc}") from None
    if size > MAX_DEFAULTS_BYTES:
        raise _bad(op, "defaults",
                   f"defaults encode to {size} bytes, more than {MAX_DEFAULTS_BYTES}")


def _check_model_delete(args: Sequence[Any]) -> None:
    _str("model_delete", "name", args[0])


_USAGE_COUNTS = ("prompt", "completion", "total", "audio_ms", "requests")


def _check_usage_add(args: Sequence[Any]) -> None:
    op = "usage_add"
    _str(op, "key_id", args[0])
    _str(op, "model", args[1])
    day = args[2]
    if not (isinstance(day, str) and _DAY.fullmatch(day)):
        raise _bad(op, "day", f"day must be YYYY-MM-DD, got {day!r}")
    try:
        datetime.date.fromisoformat(day)
    except ValueError:
        raise _bad(op, "day", f"day {day!r} is not a calendar date") from None
    for field, value in zip(_USAGE_COUNTS, args[3:], strict=True):
        _int(op, field, value, MAX_USAGE - 1)


def _check_key_used(args: Sequence[Any]) -> None:
    _str("key_used", "key_id", args[0])
    _int("key_used", "at_ms", args[1])


def _check_add_writer(args: Sequence[Any]) -> None:
    _key("add_writer", "key", args[0])
    if type(args[1]) is not bool:
        raise _bad("add_writer", "admin", "admin must be a bool")


def _check_remove_writer(args: Sequence[Any]) -> None:
    _key("remove_writer", "key", args[0])
    _int("remove_writer", "length", args[1])


# name -> (number of arguments, checker)
_CHECKS = {
    "key_put": (6, _check_key_put),
    "key_revoke": (2, _check_key_revoke),
    "model_put": (3, _check_model_put),
    "model_delete": (1, _check_model_delete),
    "usage_add": (8, _check_usage_add),
    "key_used": (2, _check_key_used),
    "add_writer": (2, _check_add_writer),
    "remove_writer": (2, _check_remove_writer),
}
#: Every op name a replica understands.
OP_NAMES = frozenset(_CHECKS)


def validate_op(op: Any) -> None:
    """Check one op against its schema.

    Raises:
        BadEntry: ``BAD_OP``, naming the op and the field that is wrong. An
            unknown name or a wrong number of arguments is refused too: an op
            a replica does not understand cannot be applied the same way
            everywhere.
    """
    if not isinstance(op, list | tuple) or not op:
        raise InvalidOp("an op is a non-empty array")
    name = op[0]
    check = _CHECKS.get(name) if isinstance(name, str) else None
    if check is None:
        shown = name[:MAX_STR] if isinstance(name, str) else name
        raise InvalidOp(f"unknown op {shown!r}")
    arity, checker = check
    if len(op) != arity + 1:
        raise _bad(name, None, f"takes {arity} arguments, got {len(op) - 1}")
    checker(op[1:])


def validate_batch(batch: Sequence[Sequence[Sequence[Any]]]) -> None:
    """What a writer checks before appending: :class:`WriteRefused` (``BAD_OP``) for an
    empty entry or an invalid op, so nothing of the batch is written."""
    for ops in batch:
        if not ops:
            raise WriteRefused("an entry needs at least one op", code="BAD_OP")
        for op in ops:
            try:
                validate_op(op)
            except BadEntry as exc:
                raise WriteRefused(str(exc), code="BAD_OP") from None
