"""The fields that make an OpenAI request a stream, as the model servers read them.

One pydantic model, :class:`StreamFields`, read in pydantic's lax mode as
vLLM reads its ``ChatCompletionRequest`` and ``CompletionRequest`` (``stream:
Optional[bool] = False``): ``true``, ``1``, ``1.0``, ``"true"``, ``"1"``,
``"yes"``, ``"on"``, ``"t"``, ``"y"`` (any case) are a stream; ``false``,
``0``, ``"false"``, ``"no"``, ``"off"`` … and ``null`` are not; anything else
is a 400. The local model server's request models (``server.py``) inherit it,
and the agent (``_forward.prepare``) decides with it before it forwards, so
the two cannot read a body differently.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["StreamFields", "StreamOptions"]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool | None = False


class StreamFields(BaseModel):
    """``stream`` and ``stream_options`` of a chat or completion request."""

    model_config = ConfigDict(extra="ignore")

    stream: bool | None = False
    stream_options: StreamOptions | None = None

    @property
    def usage_asked(self) -> bool:
        """The client asked for the usage chunk itself."""
        return bool(self.stream_options is not None and self.stream_options.include_usage)
