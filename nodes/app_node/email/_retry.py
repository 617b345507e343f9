"""Retrying a send: transient failures again with backoff, permanent ones never.

:class:`RetryPolicy` is the sans-IO part: given the attempt number, the error
and the time spent so far, it answers how long to wait, or ``None`` to give up.
:func:`send_with_retry` is the trio driver. Both bounds hold: at most
``max_attempts`` sends, and no wait that would end past ``deadline_s`` after the
first attempt began.

The delay is exponential (``base_delay_s * 2**(attempt-1)``, capped at
``max_delay_s``) with "full jitter" (a uniform draw below it), as AWS's
architecture blog recommends so that many senders do not retry in step. A
provider's ``Retry-After`` wins over the backoff: waiting less only earns
another 429. A ``Retry-After`` that does not fit the deadline ends the retries
at once instead of sleeping for nothing.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import trio
from pydantic import BaseModel, ConfigDict, Field

from ._errors import EmailUnavailable
from ._message import EmailMessage, EmailSender, SendResult

__all__ = ["RetryPolicy", "send_with_retry"]


class RetryPolicy(BaseModel):
    """How often and how long to retry a transient failure.

    The defaults (5 attempts within 2 minutes) suit a user waiting for an
    invitation; a background queue can pass a longer deadline.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_attempts: int = Field(default=5, ge=1, le=20)
    base_delay_s: float = Field(default=1.0, gt=0)
    max_delay_s: float = Field(default=30.0, gt=0)
    deadline_s: float = Field(default=120.0, gt=0)

    def next_delay_s(
        self,
        attempt: int,
        error: EmailUnavailable,
        elapsed_s: float,
        *,
        uniform: Callable[[float, float], float] = random.uniform,
    ) -> float | None:
        """Seconds to wait before attempt ``attempt + 1``, or ``None`` to give up.

        Args:
            attempt: how many attempts have been made (1 after the first).
            error: the transient failure of the last attempt.
            elapsed_s: seconds since the first attempt began.
            uniform: the jitter source (tests pass a fixed one).
        """
        if attempt >= self.max_attempts:
            return None
        if error.retry_after_s is not None:
            delay = error.retry_after_s
        else:
            ceiling = min(self.max_delay_s, self.base_delay_s * 2 ** (attempt - 1))
            delay = uniform(0.0, ceiling)
        if elapsed_s + delay > self.deadline_s:
            return None
        return delay


async def send_with_retry(
    sender: EmailSender,
    message: EmailMessage,
    policy: RetryPolicy | None = None,
) -> SendResult:
    """Send ``message``, retrying transient failures as ``policy`` allows.

    The same ``message`` (and so the same idempotency key and ``Message-ID``)
    goes out on every attempt.

    Raises:
        EmailRejected: at once, never retried.
        EmailUnavailable: the last transient failure, once the policy gives up;
            its message says how many attempts were made.
    """
    policy = policy or RetryPolicy()
    started = trio.current_time()
    attempt = 0
    while True:
        attempt += 1
        try:
            return await sender.send(message)
        except EmailUnavailable as exc:
            delay = policy.next_delay_s(attempt, exc, trio.current_time() - started)
            if delay is None:
                raise EmailUnavailable(
                    f"gave up after {attempt} attempt(s): {exc.message}",
                    backend=exc.backend,
                    status=exc.status,
                    retry_after_s=exc.retry_after_s,
                ) from exc
        await trio.sleep(delay)
