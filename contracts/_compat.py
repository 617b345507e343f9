"""Messages that gained fields after their version shipped, readable by older peers.

Every contract model forbids unknown fields, so a newer peer that sends a field
an older one does not know is refused outright (seen: a new wrk-ork's answer
refused by an older app-node, ``extra_forbidden``). A model that gains a field
names it in ``_added_later``; while the field is empty (None, False, 0, an empty
tuple or dict) its dump leaves it out, so the message reads as the older
version wrote it. An older peer is only refused what it could not act on.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, SerializerFunctionWrapHandler, model_serializer

__all__ = ["AddedLater"]


class AddedLater(BaseModel):
    """Base of a model whose ``_added_later`` fields are left out of dumps while empty."""

    _added_later: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _without_empty_added_later(self, handler: SerializerFunctionWrapHandler
                                   ) -> dict[str, Any]:
        data = handler(self)
        for name in self._added_later:
            if name in data and not data[name]:
                del data[name]
        return data
