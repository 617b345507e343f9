"""``cosmicac models``, ``users`` and ``teams invitations`` (run in this process) against
an in-process app-node: model masters reach the shared database; the operator lists users; a
password change keeps the CLI logged in (the new session is saved) and ends the
old one; a reset link from the outbox sets a new password.

Real scrypt (about a second a hash): one login, one change, one reset.
"""

from __future__ import annotations

import email
import json
import re
from email import policy
from pathlib import Path

import httpx
import pytest
import trio

from .support import EMAIL, PASSWORD, Served, one_error_line, shared_tls

pytestmark = pytest.mark.slow

NEW = "a brand new passphrase"
NEWER = "and yet another passphrase"


async def test_models_add_list_remove_and_users_list(served: Served) -> None:
    with trio.fail_after(180):
        await served.login()
        added = await served.cli("models", "add", "meta-llama/Llama-3.1-8B", "--runtime",
                                 "vllm", "--gpus", "2", "--image",
                                 "docker://registry.example/vllm:0.6", "-o", "json")
        assert added.returncode == 0, added.stderr
        assert json.loads(added.stdout) == {
            "name": "meta-llama/Llama-3.1-8B", "runtime": "vllm",
            "defaults": {"gpus": 2, "image": "docker://registry.example/vllm:0.6"}}
        database = served.node.services.database
        assert (await database.model_master("meta-llama/Llama-3.1-8B")).runtime == "vllm"
        demo = await served.cli("models", "add", "demo", "--runtime", "local")
        assert demo.returncode == 0 and "demo" in demo.stdout.decode()

        # the group's smoke test: a real process
        listed = await served.cli("models", "list", "-o", "json", process=True)
        assert [m["name"] for m in json.loads(listed.stdout)] == [
            "demo", "meta-llama/Llama-3.1-8B"]

        bad = await served.cli("models", "add", "x", "--runtime", "tensorrt")
        assert bad.returncode == 2
        one_error_line(bad)
        bad = await served.cli("models", "add", "x", "--runtime", "vllm", "--image", "ubuntu")
        assert bad.returncode == 2 and "defaults.image" in one_error_line(bad)

        # The model server's settings: a command line, NAME=value pairs, a Secret's name.
        gated = await served.cli("models", "add", "meta-llama/Llama-3.1-70B", "--runtime",
                                 "vllm", "--server-args", "--max-model-len 8192 --dtype bfloat16",
                                 "--server-env", "HF_HUB_OFFLINE=1", "--server-env",
                                 "NOTE=two words", "--hub-token-secret", "hf-token", "-o", "json")
        assert gated.returncode == 0, gated.stderr
        assert json.loads(gated.stdout)["defaults"]["model_settings"] == {
            "args": ["--max-model-len", "8192", "--dtype", "bfloat16"],
            "env": {"HF_HUB_OFFLINE": "1", "NOTE": "two words"},
            "hub_token_secret": "hf-token"}
        for argv, words in ((["--server-args", "--x 'open"], "--server-args"),
                            (["--server-env", "NOEQUALS"], "NAME=value"),
                            (["--server-args", "--tensor-parallel-size 2"],
                             "defaults.model_settings.args")):
            bad = await served.cli("models", "add", "y", "--runtime", "vllm", *argv)
            assert bad.returncode == 2, bad.stderr
            assert words in one_error_line(bad)
        await served.cli("models", "remove", "meta-llama/Llama-3.1-70B")

        removed = await served.cli("models", "remove", "meta-llama/Llama-3.1-8B")
        assert removed.returncode == 0, removed.stderr
        assert await database.model_master("meta-llama/Llama-3.1-8B") is None
        missing = await served.cli("models", "remove", "meta-llama/Llama-3.1-8B")
        assert missing.returncode == 1
        one_error_line(missing)

        # the group's smoke test: a real process
        users = await served.cli("users", "list", "-o", "json", process=True)
        assert users.returncode == 0, users.stderr
        [ada] = json.loads(users.stdout)
        assert ada["user"]["email"] == EMAIL
        assert [(t["name"], t["role"]) for t in ada["teams"]] == [("core", "owner")]
        renamed = await served.cli("users", "set-name", "Ada L.")
        assert renamed.returncode == 0, renamed.stderr
        assert served.node.services.store.users.by_email(EMAIL).name == "Ada L."

        invited = await served.cli("teams", "invite", "core", "bob@example.com", "-o", "json")
        assert invited.returncode == 0, invited.stderr
        pending = await served.cli("teams", "invitations", "core", "-o", "json")
        [invitation] = json.loads(pending.stdout)
        assert invitation["id"] == json.loads(invited.stdout)["id"]
        assert invitation["email"] == "bob@example.com"
        revoked = await served.cli("teams", "revoke-invite", "core", invitation["id"])
        assert revoked.returncode == 0, revoked.stderr
        assert served.node.services.store.invitations.of_team(invitation["team"]) == []


def _saved_token(served: Served) -> str:
    """The token of the CLI's current context."""
    contexts = json.loads((served.config / "contexts.json").read_text())
    return contexts["contexts"][contexts["current"]]["token"]


async def test_password_change_and_reset(served: Served, tmp_path: Path) -> None:
    with trio.fail_after(180):
        await served.login()
        old_token = _saved_token(served)
        wrong = await served.cli("users", "password", "--password-stdin",
                                 stdin=f"not it\n{NEW}\n".encode())
        assert wrong.returncode == 1 and "current_password" in one_error_line(wrong)

        changed = await served.cli("users", "password", "--password-stdin",
                                   stdin=f"{PASSWORD}\n{NEW}\n".encode())
        assert changed.returncode == 0, changed.stderr
        # the CLI saved the new session: still logged in; the old token is dead
        who = await served.cli("whoami", "-o", "json")
        assert who.returncode == 0, who.stderr
        async with httpx.AsyncClient(base_url=f"{served.server}/api", verify=shared_tls()) as api:
            r = await api.get("/me", headers={"authorization": f"Bearer {old_token}"})
        assert r.status_code == 401

        asked = await served.cli("users", "reset-password", EMAIL)
        assert asked.returncode == 0, asked.stderr
        # the email leaves after the answer (a background task): wait for it, bounded
        outbox = tmp_path / "app-node" / "outbox"
        for _ in range(200):
            # (a hidden .tmp- file is one still being written)
            if mails := [m for m in outbox.glob("*.eml") if not m.name.startswith(".")]:
                break
            await trio.sleep(0.05)
        [mail] = mails
        message = email.message_from_bytes(mail.read_bytes(), policy=policy.default)
        token = re.search(r"reset\?token=([A-Za-z0-9_\-]+)",
                          message.get_body(("plain",)).get_content()).group(1)
        reset = await served.cli("users", "reset-password", "--token", token,
                                 "--password-stdin", stdin=f"{NEWER}\n".encode())
        assert reset.returncode == 0, reset.stderr
        again = await served.cli("users", "reset-password", "--token", token,
                                 "--password-stdin", stdin=f"{NEWER}\n".encode())
        assert again.returncode == 1 and "request a new one" in one_error_line(again)
        # the reset logged every session out, the one the CLI saved included
        saved = _saved_token(served)
        async with httpx.AsyncClient(base_url=f"{served.server}/api", verify=shared_tls()) as api:
            r = await api.get("/me", headers={"authorization": f"Bearer {saved}"})
        assert r.status_code == 401
