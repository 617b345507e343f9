"""Every command group's listings in every output mode, against an in-process
app-node and wrk-ork: ``-o json`` is the API's document, ``yaml`` the same document,
``name`` one id per row, the table one plain line per row (with the
row's id whole) with a header ``--no-headers`` leaves out, ``--query`` a pick of the JSON."""

from __future__ import annotations

import json
import re

import pytest
import trio
import yaml

from nodes.app_node.ratelimit import Limits, Rate

from .support import ServedOrk, serve_ork

pytestmark = pytest.mark.slow

IMAGE = "docker://registry.local/jobs/app:1"
#: A listing per group, and the field of its JSON rows that `-o name` prints.
LISTINGS = {
    "jobs": (["jobs", "list"], "id"),
    "teams": (["teams", "list"], "id"),
    "team members": (["teams", "members", "core"], None),
    "apikeys": (["apikeys", "list"], "id"),
    "models": (["models", "list"], "name"),
    "racks": (["racks", "list"], "key"),
    "nodes": (["nodes", "list"], "name"),
    "users": (["users", "list"], None),
    "contexts": (["context", "list"], "name"),
}
_BOX = re.compile("[\u2500-\u257f]")


def _rows(document):
    for key in ("jobs", "teams", "members", "keys", "models", "racks", "nodes", "users",
                "contexts"):
        if isinstance(document, dict) and isinstance(document.get(key), list):
            return document[key]
    assert isinstance(document, list), document
    return document


@pytest.fixture
async def served(tmp_path, nursery) -> ServedOrk:
    """app-node and wrk-ork whose rate limit lets this test's ~70 commands through."""
    many = Limits(per_token=Rate(per_second=1000.0, burst=1000))
    return await serve_ork(tmp_path, nursery, monitor=False, limits=many)


async def test_every_group_lists_in_every_mode(served: ServedOrk) -> None:
    with trio.fail_after(240):
        await served.login()
        for name in ("first", "second"):
            created = await served.cli("jobs", "create", "--image", IMAGE, "--type",
                                       "container", "--name", name)
            assert created.returncode == 0, created.stderr
        key = await served.cli("apikeys", "create", "--name", "k")
        assert key.returncode == 0, key.stderr
        model = await served.cli("models", "add", "demo", "--runtime", "local")
        assert model.returncode == 0, model.stderr
        for group, (args, name_field) in LISTINGS.items():
            ran = {mode: await served.cli(*args, "-o", mode)
                   for mode in ("json", "yaml", "name", "table", "wide")}
            for mode, result in ran.items():
                assert result.returncode == 0, (group, mode, result.stderr)
            document = json.loads(ran["json"].stdout)
            assert yaml.safe_load(ran["yaml"].stdout) == document, group
            rows = _rows(document)
            assert rows, f"{group}: nothing listed"
            names = ran["name"].stdout.decode().splitlines()
            assert len(names) == len(rows), group
            if name_field is not None:
                assert names == [str(row[name_field]) for row in rows], group
            for mode in ("table", "wide"):
                text = ran[mode].stdout.decode()
                lines = text.splitlines()
                assert not _BOX.search(text) and "\x1b" not in text, (group, mode)
                assert lines[0] == lines[0].upper(), (group, "a header line first")
                assert len(lines) == len(names) + 1, (group, mode)
                for name, line in zip(names, lines[1:], strict=True):
                    assert name in line.split(), (group, mode, "a row shows its id whole")
            assert len(ran["wide"].stdout.decode().splitlines()[0]) >= len(
                ran["table"].stdout.decode().splitlines()[0])
            bare = await served.cli(*args, "--no-headers")
            # the same rows (aligned on their cells alone: no header to be as wide as)
            assert [line.split() for line in bare.stdout.decode().splitlines()] == \
                [line.split() for line in ran["table"].stdout.decode().splitlines()[1:]]
            counted = await served.cli(*args, "--query", "length(@)")
            assert counted.stdout.decode().strip() == str(len(document)), group
