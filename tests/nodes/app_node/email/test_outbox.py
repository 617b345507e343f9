"""OutboxSender: parseable .eml files, written atomically, named in time order."""

from __future__ import annotations

import os
from email import message_from_bytes
from email.policy import default

import pytest

from nodes.app_node.email import EmailKind, EmailMessage, EmailRejected, OutboxSender


def _message(key: str, **kw) -> EmailMessage:
    return EmailMessage(
        to=["alice@example.com"],
        subject="Welcome",
        text="Join: https://app.example/invite/1",
        html="<p>Join</p>",
        kind=EmailKind.INVITATION,
        idempotency_key=key,
        **kw,
    )


class _Clock:
    def __init__(self) -> None:
        self.now_ns = 1_700_000_000_000_000_000

    def __call__(self) -> int:
        self.now_ns += 1_000
        return self.now_ns


async def test_writes_a_parseable_eml(tmp_path):
    sender = OutboxSender(tmp_path / "outbox", from_address="noreply@cosmicac.test")
    result = await sender.send(_message("invite:1"))
    path = tmp_path / "outbox" / result.message_id
    assert result.backend == "outbox" and not result.duplicate
    assert path.suffix == ".eml" and "-invitation-" in path.name
    parsed = message_from_bytes(path.read_bytes(), policy=default)
    assert parsed["From"] == "noreply@cosmicac.test"
    assert parsed["To"] == "alice@example.com"
    assert parsed["Subject"] == "Welcome"
    assert "invite/1" in parsed.get_body(("plain",)).get_content()
    assert parsed.get_body(("html",)).get_content().strip() == "<p>Join</p>"
    assert os.listdir(tmp_path / "outbox") == [result.message_id]  # no temp file left


async def test_names_sort_by_time(tmp_path):
    sender = OutboxSender(tmp_path, clock_ns=_Clock())
    ids = [(await sender.send(_message(f"k{i}"))).message_id for i in range(12)]
    assert sorted(os.listdir(tmp_path)) == ids


async def test_the_same_idempotency_key_is_written_once(tmp_path):
    sender = OutboxSender(tmp_path, clock_ns=_Clock())
    first = await sender.send(_message("reset:9"))
    second = await sender.send(_message("reset:9"))
    assert second.duplicate and second.message_id == first.message_id
    assert os.listdir(tmp_path) == [first.message_id]


async def test_a_failed_write_leaves_nothing_behind(tmp_path, monkeypatch):
    sender = OutboxSender(tmp_path)

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    from nodes.app_node.email import EmailUnavailable

    with pytest.raises(EmailUnavailable) as info:
        await sender.send(_message("k"))
    assert "No space left" in info.value.message
    assert os.listdir(tmp_path) == []  # neither the message nor its temp file


async def test_an_unwritable_folder_is_rejected(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(EmailRejected) as info:
        await OutboxSender(blocker / "outbox").send(_message("k"))
    assert "writable directory" in info.value.message
