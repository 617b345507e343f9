"""send_with_retry and RetryPolicy on trio's virtual clock."""

from __future__ import annotations

import pytest
import trio

from nodes.app_node.email import (
    EmailMessage,
    EmailRejected,
    EmailUnavailable,
    RetryPolicy,
    SendResult,
    send_with_retry,
)

MESSAGE = EmailMessage(to="a@example.com", subject="s", text="t", idempotency_key="k")


class _Scripted:
    """Raises the scripted errors in turn, then succeeds; records when it was called."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls: list[float] = []

    async def send(self, message: EmailMessage) -> SendResult:
        self.calls.append(trio.current_time())
        if self.errors:
            raise self.errors.pop(0)
        return SendResult(message_id="ok", backend="fake")


async def test_transient_failures_are_retried(autojump_clock):
    sender = _Scripted(EmailUnavailable("down"), EmailUnavailable("down"))
    result = await send_with_retry(sender, MESSAGE, RetryPolicy(max_attempts=3))
    assert result.message_id == "ok" and len(sender.calls) == 3


async def test_permanent_failures_are_not(autojump_clock):
    sender = _Scripted(EmailRejected("bad address"))
    with pytest.raises(EmailRejected):
        await send_with_retry(sender, MESSAGE)
    assert len(sender.calls) == 1


async def test_attempts_are_bounded(autojump_clock):
    sender = _Scripted(*[EmailUnavailable("down", status=503) for _ in range(10)])
    with pytest.raises(EmailUnavailable) as info:
        await send_with_retry(sender, MESSAGE, RetryPolicy(max_attempts=4))
    assert len(sender.calls) == 4
    assert info.value.status == 503 and "gave up after 4" in info.value.message


async def test_retry_after_is_honoured_and_the_deadline_bounds_time(autojump_clock):
    sender = _Scripted(*[EmailUnavailable("slow down", retry_after_s=40) for _ in range(10)])
    policy = RetryPolicy(max_attempts=10, deadline_s=100)
    with pytest.raises(EmailUnavailable):
        await send_with_retry(sender, MESSAGE, policy)
    # 0, 40, 80; a wait to 120 would pass the deadline, so it stops at once.
    assert [round(t - sender.calls[0]) for t in sender.calls] == [0, 40, 80]


def test_backoff_grows_and_is_capped():
    policy = RetryPolicy(max_attempts=20, base_delay_s=1, max_delay_s=10, deadline_s=1e6)
    top = [
        policy.next_delay_s(n, EmailUnavailable("x"), 0, uniform=lambda a, b: b)
        for n in range(1, 8)
    ]
    assert top == [1, 2, 4, 8, 10, 10, 10]
