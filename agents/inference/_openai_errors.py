"""OpenAI-shaped errors for the model servers this package runs itself.

The local model server (:mod:`agents.inference.server`) and the Parakeet
transcription server (:mod:`agents.inference.runtimes.parakeet_server`) both
answer failures the way the ``openai`` package parses them:
``{"error": {"message", "type", "param", "code"}}``, with the HTTP status.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

__all__ = ["OpenAIError", "guarded"]

Handler = Callable[[Request], Awaitable[Response]]


class OpenAIError(Exception):
    """A request the server refuses: the status and the message its client sees."""

    _KINDS = {400: "BadRequestError", 404: "NotFoundError", 408: "RequestTimeoutError",
              413: "RequestTooLargeError", 503: "ServiceUnavailableError"}

    def __init__(self, status: int, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def response(self) -> JSONResponse:
        kind = self._KINDS.get(self.status, "InternalServerError")
        body = {"error": {"message": self.message, "type": kind, "param": self.param,
                          "code": self.status}}
        return JSONResponse(body, status_code=self.status)


def guarded(handler: Handler) -> Handler:
    """``handler`` with every :class:`OpenAIError` it raises turned into its response."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except OpenAIError as exc:
            return exc.response()

    return endpoint
