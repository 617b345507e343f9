"""Validating and dumping pydantic models with fewer calls per message.

``Model.model_validate(obj)`` and ``model.model_dump(mode="python")`` are thin
Python wrappers around the model's pydantic-core ``__pydantic_validator__`` and
``__pydantic_serializer__`` (documented class attributes of ``BaseModel``);
their keyword handling costs about as much as the work itself for small RPC
messages, four times per call. These helpers call the core directly, with the
same (default) options, for models that are fully built and do not override
``model_validate`` / ``model_dump``; any other model goes through its methods.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pydantic

__all__ = ["dump", "validate"]

_BASE_VALIDATE = pydantic.BaseModel.model_validate.__func__  # type: ignore[attr-defined]
_BASE_DUMP = pydantic.BaseModel.model_dump

#: Per model class: its validate(obj) and dump(model) callables.
_validators: dict[type, Callable[[Any], Any]] = {}
_dumpers: dict[type, Callable[[Any], dict[str, Any]]] = {}


def _plain(cls: type[pydantic.BaseModel]) -> bool:
    return (
        cls.__pydantic_complete__
        and cls.model_validate.__func__ is _BASE_VALIDATE  # type: ignore[attr-defined]
        and cls.model_dump is _BASE_DUMP
    )


def validate(cls: type[pydantic.BaseModel], obj: Any) -> Any:
    """``cls.model_validate(obj)`` (raises ``pydantic.ValidationError`` alike)."""
    fn = _validators.get(cls)
    if fn is None:
        if not _plain(cls):
            return cls.model_validate(obj)
        fn = _validators[cls] = cls.__pydantic_validator__.validate_python
    return fn(obj)


def dump(model: pydantic.BaseModel) -> dict[str, Any]:
    """``model.model_dump(mode="python")``."""
    cls = type(model)
    fn = _dumpers.get(cls)
    if fn is None:
        if not _plain(cls):
            return model.model_dump(mode="python")
        to_python = cls.__pydantic_serializer__.to_python

        def fn(value: Any, to_python: Any = to_python) -> dict[str, Any]:
            return to_python(value, mode="python")

        _dumpers[cls] = fn
    return fn(model)
