"""Typed method declarations shared by client and server."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from pydantic import BaseModel

from p2p.rpc._errors import RpcUsageError

__all__ = ["Method", "StreamMethod"]

P = TypeVar("P", bound=BaseModel)
R = TypeVar("R", bound=BaseModel)
I = TypeVar("I", bound=BaseModel)  # noqa: E741


def _check(name: str, **models: type) -> None:
    if not isinstance(name, str) or not name:
        raise RpcUsageError("BAD_METHOD", "method name must be a non-empty str")
    for field, model in models.items():
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise RpcUsageError("BAD_METHOD", f"{field} of {name!r} must be a pydantic model")


@dataclass(frozen=True, slots=True)
class Method(Generic[P, R]):
    """A request/response method: ``ECHO = Method("echo", params=EchoParams, result=EchoResult)``.

    Args:
        name: the wire name.
        params: pydantic model of the parameters.
        result: pydantic model of the result.
    """

    name: str
    params: type[P]
    result: type[R]

    def __post_init__(self) -> None:
        _check(self.name, params=self.params, result=self.result)


@dataclass(frozen=True, slots=True)
class StreamMethod(Generic[P, I]):
    """A server-streamed method: the handler yields ``item`` models.

    Args:
        name: the wire name.
        params: pydantic model of the parameters.
        item: pydantic model of each streamed item.
    """

    name: str
    params: type[P]
    item: type[I]

    def __post_init__(self) -> None:
        _check(self.name, params=self.params, item=self.item)
