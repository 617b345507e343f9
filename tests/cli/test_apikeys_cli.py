"""``cosmicac apikeys`` (run in this process) against an in-process app-node: the key
created is in the shared database, listed without its secret, its usage is a JSON
array of rows, revoking reaches the shared database; unknown keys exit 1."""

from __future__ import annotations

import json

import pytest
import trio

from crdt import AddTokenUsage

from .support import Served, one_error_line

pytestmark = pytest.mark.slow


async def test_create_list_usage_revoke(served: Served) -> None:
    with trio.fail_after(120):
        await served.login()
        created = await served.cli("apikeys", "create", "--name", "ci", "-o", "json")
        assert created.returncode == 0, created.stderr
        key = json.loads(created.stdout)
        assert {"id", "key"} <= key.keys() and key["key"].startswith(key["prefix"])
        database = served.node.services.database
        stored = await database.api_key_by_secret(key["key"])
        assert stored is not None and stored.id == key["id"] and not stored.revoked
        # the group's smoke test: a real process
        listed = await served.cli("apikeys", "list", "-o", "json", process=True)
        assert [k["id"] for k in json.loads(listed.stdout)] == [key["id"]]
        table = await served.cli("apikeys", "list")
        assert table.returncode == 0 and key["id"] in table.stdout.decode()
        assert key["key"] not in table.stdout.decode()

        await database.append([AddTokenUsage(key["id"], "llama", "2027-01-02", prompt=10,
                                             completion=5, total=15)])
        used = await served.cli("apikeys", "usage", "--key", key["id"], "-o", "json")
        assert used.returncode == 0, used.stderr
        [row] = json.loads(used.stdout)
        assert row["day"] == "2027-01-02" and row["model"] == "llama"
        assert (row["prompt_tokens"], row["completion_tokens"], row["total_tokens"],
                row["requests"]) == (10, 5, 15, 1)
        every = await served.cli("apikeys", "usage", "-o", "json")
        assert json.loads(every.stdout) == [row]

        missing = await served.cli("apikeys", "revoke", "no-such-key")
        assert missing.returncode == 1 and "no-such-key" in one_error_line(missing)
        revoked = await served.cli("apikeys", "revoke", key["id"])
        assert revoked.returncode == 0, revoked.stderr
        assert (await database.api_key(key["id"])).revoked

