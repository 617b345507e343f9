"""Completion's values (cli/_completion.py) against an in-process app-node and wrk-ork:
job ids with their names, container jobs for ``shell``, served names, team names,
model names; the answers kept briefly per server and account (0600); silence when
logged out, expired or unreachable; and a TAB that imports only the command its
words name. The shells themselves run the scripts in test_completion_shells.py."""

from __future__ import annotations

import ast
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from cli import _completion
from cli._completion import (
    CACHE_TTL_S,
    RECHECK_S,
    Account,
    CompletionCache,
    describe,
    job_candidates,
    served_candidates,
    team_candidates,
    words_before_cursor,
)
from cli.main import command_of

from .support import Served, ServedOrk

IMAGE = "docker://registry.local/jobs/app:1"
_NO_PARAMS = SimpleNamespace(params={})


# -- the words a shell passes --------------------------------------------------------


def test_bash_words_before_the_cursor_name_the_command():
    env = {"COMP_WORDS": "cosmicac\njobs\nget\n", "COMP_CWORD": "3"}
    assert words_before_cursor(env) == ["jobs", "get"]
    assert command_of(words_before_cursor(env)) == "jobs"
    assert words_before_cursor({"COMP_WORDS": "cosmicac jo", "COMP_CWORD": "1"}) == []
    assert words_before_cursor({"COMP_WORDS": "cosmicac jo", "COMP_CWORD": "x"}) == []


def test_zsh_and_fish_lines_drop_the_word_being_typed():
    assert words_before_cursor({"_TYPER_COMPLETE_ARGS": "cosmicac jobs get "}) == [
        "jobs", "get"]
    assert words_before_cursor({"_TYPER_COMPLETE_ARGS": "cosmicac jobs ge"}) == ["jobs"]
    assert words_before_cursor({"_TYPER_COMPLETE_ARGS": "cosmicac --log-level debug sh"}) \
        == ["--log-level", "debug"]
    assert command_of(["--log-level", "debug"]) is None  # the index answers


def test_no_shell_asking_gives_none():
    assert words_before_cursor({"PATH": "/bin"}) is None


_IMPORTS_PROBE = """
import os, sys
os.environ.update({env!r})
import cli.main
sys.argv = ["cosmicac"]
try:
    cli.main.main()
except SystemExit:
    pass
print("IMPORTED", sorted(m for m in sys.modules if m.startswith("cli.")
                         and m not in ("cli.main", "cli._completion")))
"""


@pytest.mark.parametrize(("env", "modules"), [
    ({"COMP_WORDS": "cosmicac jo", "COMP_CWORD": "1"}, set()),
    ({"_TYPER_COMPLETE_ARGS": "cosmicac models remove "}, {"cli.models"}),
    ({"COMP_WORDS": "cosmicac teams get ", "COMP_CWORD": "3"}, {"cli.teams"}),
])
def test_a_tab_imports_only_the_command_its_words_name(tmp_path, env, modules):
    shell = "bash" if "COMP_WORDS" in env else "zsh"
    env = {**env, "_COSMICAC_COMPLETE": f"complete_{shell}",
           "COSMICAC_CONFIG_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", _IMPORTS_PROBE.format(env=env)],
                            capture_output=True, text=True, timeout=60, check=True)
    assert not result.stderr
    imported = ast.literal_eval(result.stdout.strip().splitlines()[-1].removeprefix("IMPORTED "))
    commands = {m for m in imported if m.removeprefix("cli.")[:1] != "_"
                and m != "cli.session"}
    assert commands == modules, imported


# -- candidates from the kept items (pure) -------------------------------------------


def test_jobs_are_offered_by_id_with_name_type_and_status():
    jobs = [{"id": "j-1", "name": "llm", "type": "inference", "status": "running",
             "serves": "demo"},
            {"id": "j-2", "name": "box", "type": "container", "status": "queued",
             "serves": ""},
            {"id": "j-3; rm -rf ~", "name": "evil", "type": "container", "status": "x",
             "serves": ""}]
    assert job_candidates(jobs) == [("j-1", "llm (inference, Active)"),
                                    ("j-2", "box (container, Queued)")]
    assert job_candidates(jobs, container_only=True) == [("j-2", "box (container, Queued)")]
    assert served_candidates([*jobs, {**jobs[0], "id": "j-4"}]) == [("demo", "job j-1 llm")]


def test_teams_by_name_unless_the_name_is_unsafe_or_shared():
    teams = [{"id": "t-1", "name": "core", "role": "owner"},
             {"id": "t-2", "name": "two words", "role": "member"},
             {"id": "t-3", "name": "twin", "role": "admin"},
             {"id": "t-4", "name": "twin", "role": "member"}]
    assert team_candidates(teams, "") == [("core", "t-1 owner"), ("t-2", "two words member"),
                                          ("t-3", "twin admin"), ("t-4", "twin member")]
    # An id typed: the ids, each with its name.
    assert [v for v, _ in team_candidates(teams, "t-1")] == ["t-1", "t-2", "t-3", "t-4"]


@given(st.text(max_size=300))
def test_a_description_holds_nothing_a_shell_would_read(text):
    shown = describe(text)
    assert len(shown) <= 60 and shown.isprintable()
    assert not set(shown) & set("\\\"'`$[]\n\r\t")


def test_fixed_choices():
    complete = _completion.choices("vllm", "parakeet", "local")
    assert complete("") == [("vllm", ""), ("parakeet", ""), ("local", "")]
    assert complete("p") == [("parakeet", "")]


def test_output_modes():
    assert [mode for mode, _ in _completion.output_modes("")] == [
        "table", "wide", "json", "yaml", "name"]
    assert [mode for mode, _ in _completion.output_modes("w")] == ["wide"]


# -- the cache ----------------------------------------------------------------------


def _account(server: str = "http://127.0.0.1:1") -> Account:
    return Account(server, "token-1", "ada@example.com")


def test_the_cache_keeps_answers_for_its_ttl_in_a_private_file(tmp_path):
    account = _account()
    path = account.cache_path(tmp_path / "config")
    cache = CompletionCache(path, account.token_digest())
    cache.put("teams", [{"id": "t-1", "name": "core"}], now=1000.0)
    assert path.parent.name == "cache" and path.name.startswith("completion-")
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700
    again = CompletionCache(path, account.token_digest())
    assert again.get("teams", 1000.0 + CACHE_TTL_S - 0.1).items == [{"id": "t-1",
                                                                    "name": "core"}]
    assert again.get("teams", 1000.0 + CACHE_TTL_S) is None
    assert again.get("jobs", 1000.0) is None
    # Another login (token) asks afresh; so does a clock set back.
    assert CompletionCache(path, "other").get("teams", 1000.0) is None
    assert again.get("teams", 999.0) is None


def test_each_server_and_account_has_its_own_cache(tmp_path):
    paths = {_account("http://a:1").cache_path(tmp_path),
             _account("http://b:1").cache_path(tmp_path),
             Account("http://a:1", "token-1", "bob@example.com").cache_path(tmp_path)}
    assert len(paths) == 3


@pytest.mark.parametrize("content", [b"", b"not json", b"[]", b'{"version": 1}',
                                     b'{"version": 1, "token": "T", "entries": {"jobs": '
                                     b'{"at": "x", "items": []}}}',
                                     b'{"version": 1, "token": "T", "entries": {"jobs": '
                                     b'{"at": 1, "items": [1, 2]}}}'])
def test_a_broken_cache_file_reads_as_empty(tmp_path, content):
    path = tmp_path / "cache" / "completion-x.json"
    path.parent.mkdir()
    path.write_bytes(content)
    assert CompletionCache(path, "T").get("jobs", 1.0) is None


# -- against app-node ----------------------------------------------------------------


@pytest.fixture
def config_of(monkeypatch):
    """Point the completers (which read the environment, as in a TAB) at a served
    app-node's CLI configuration."""
    def point(served: Served, server: str | None = None) -> None:
        monkeypatch.setenv("COSMICAC_CONFIG_DIR", str(served.config))
        monkeypatch.setenv("COSMICAC_SERVER", server or served.server)
    return point


async def _tab(completer, incomplete: str = "", ctx=_NO_PARAMS) -> list[tuple[str, str]]:
    return await trio.to_thread.run_sync(completer, ctx, incomplete)


async def _create(served: ServedOrk, *args: str) -> str:
    created = await served.cli("jobs", "create", "--image", IMAGE, *args)
    assert created.returncode == 0, created.stderr
    return created.stdout.decode().strip()


async def test_completers_offer_the_teams_jobs_served_names_teams_and_models(
        served_ork: ServedOrk, config_of, capfd) -> None:
    served = served_ork
    config_of(served)
    with trio.fail_after(120):
        await served.login()
        llm = await _create(served, "--name", "llm", "--type", "inference", "--runtime",
                            "local", "--model", "demo", "--served-name", "chatty")
        box = await _create(served, "--name", "my box", "--type", "container")
        added = await served.cli("models", "add", "meta-llama/Llama-3.1-8B", "--runtime",
                                 "vllm")
        assert added.returncode == 0, added.stderr

        jobs = dict(await _tab(_completion.job_ids))
        assert set(jobs) == {llm, box}
        # Described by name, type and status (Queued, Starting...: wrk-ork places them).
        assert jobs[llm].startswith("llm (inference, ") and jobs[llm].endswith(")")
        assert jobs[box].startswith("my box (container, ")
        assert [v for v, _ in await _tab(_completion.job_ids, box[:-2])] == [box]
        assert [v for v, _ in await _tab(_completion.container_job_ids)] == [box]
        assert await _tab(_completion.served_names) == [("chatty", f"job {llm} llm")]
        assert await _tab(_completion.served_names, "x") == []
        teams = await _tab(_completion.team_names)
        assert [v for v, _ in teams] == ["core"] and "owner" in teams[0][1]
        assert [v for v, _ in await _tab(_completion.model_names, "meta")] == [
            "meta-llama/Llama-3.1-8B"]
        # --server on the command line is the server asked (here: none listening).
        elsewhere = SimpleNamespace(params={"server": f"http://127.0.0.1:{_closed_port()}"})
        assert await _tab(_completion.job_ids, ctx=elsewhere) == []
        capfd.readouterr()
    assert capfd.readouterr() == ("", "")


async def test_answers_are_kept_briefly_and_a_new_value_asks_again(
        served_ork: ServedOrk, config_of, monkeypatch) -> None:
    served = served_ork
    config_of(served)
    now = [time.time()]
    monkeypatch.setattr(_completion, "clock", lambda: now[0])
    with trio.fail_after(120):
        await served.login()
        first = await _create(served, "--name", "a", "--type", "container")
        assert [v for v, _ in await _tab(_completion.job_ids)] == [first]
        [cache] = (served.config / "cache").iterdir()
        assert cache.stat().st_mode & 0o777 == 0o600
        kept = json.loads(cache.read_text())
        assert set(kept["entries"]) == {"jobs"} and served.config.name not in cache.name

        second = await _create(served, "--name", "b", "--type", "container")
        # Within the TTL: the kept answer, without the new job...
        assert [v for v, _ in await _tab(_completion.job_ids)] == [first]
        # ...even when its id is typed, until the answer is RECHECK_S old...
        assert await _tab(_completion.job_ids, second) == []
        now[0] += RECHECK_S
        assert [v for v, _ in await _tab(_completion.job_ids, second)] == [second]
        # ...and after the TTL, everything afresh.
        third = await _create(served, "--name", "c", "--type", "container")
        now[0] += CACHE_TTL_S
        assert sorted(v for v, _ in await _tab(_completion.job_ids)) == sorted(
            [first, second, third])


async def test_silent_and_empty_when_logged_out_expired_or_unreachable(
        served: Served, config_of, monkeypatch, capfd) -> None:
    config_of(served)
    with trio.fail_after(120):
        # Not logged in: nothing asked, nothing kept.
        assert await _tab(_completion.job_ids) == []
        assert not (served.config / "cache").exists()

        await served.login()
        # Unreachable: no candidates, quickly, and the failure is kept, so the next TAB
        # does not wait again.
        _edit_session(served.config, server=f"http://127.0.0.1:{_closed_port()}")
        monkeypatch.delenv("COSMICAC_SERVER")
        assert await _tab(_completion.team_names) == []
        [cache] = (served.config / "cache").iterdir()
        assert json.loads(cache.read_text())["entries"]["teams"]["items"] is None
        asked = []
        monkeypatch.setitem(_completion.FETCHERS, "teams",
                            lambda account: asked.append(account) or [])
        assert await _tab(_completion.team_names) == [] and not asked

        # Expired: nothing asked.
        was = _edit_session(served.config, expires_at=time.time() - 1)
        monkeypatch.setenv("COSMICAC_SERVER", served.server)
        assert await _tab(_completion.job_ids) == []
        # A revoked token (401): no candidates.
        _edit_session(served.config, **was, token="not-a-token")
        assert await _tab(_completion.model_names) == []
        # An unknown --context, and a contexts file that cannot be read: no line, no values.
        monkeypatch.setenv("COSMICAC_CONTEXT", "nowhere")
        assert await _tab(_completion.job_ids) == []
        monkeypatch.delenv("COSMICAC_CONTEXT")
        (served.config / "contexts.json").write_text("{")
        assert await _tab(_completion.job_ids) == []
        capfd.readouterr()
    assert capfd.readouterr() == ("", "")


def test_a_tab_when_logged_out_prints_nothing_and_exits_0(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSMICAC_")}
    env.update({"COSMICAC_CONFIG_DIR": str(tmp_path), "_COSMICAC_COMPLETE": "complete_bash",
                "COMP_WORDS": "cosmicac jobs get ", "COMP_CWORD": "3"})
    result = subprocess.run([sys.executable, "-c",
                             "import sys; sys.argv[0] = 'cosmicac'; "
                             "from cli.main import main; main()"],
                            env=env, capture_output=True, timeout=60, check=False)
    # bash's answer is one candidate a line: none, here.
    assert (result.returncode, result.stdout.strip(), result.stderr) == (0, b"", b"")


def _edit_session(config: Path, **fields) -> dict:
    """Change the current context's session fields; returns what they were."""
    path = config / "contexts.json"
    document = json.loads(path.read_text())
    context = document["contexts"][document["current"]]
    before = {name: context[name] for name in fields}
    context.update(fields)
    path.write_text(json.dumps(document))
    return before


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_account_takes_the_server_option_over_the_session(tmp_path, monkeypatch):
    monkeypatch.setenv("COSMICAC_CONFIG_DIR", str(tmp_path))
    monkeypatch.delenv("COSMICAC_SERVER", raising=False)
    (tmp_path / "session.json").write_text(json.dumps({
        "server": "http://saved:1/", "token": "T", "expires_at": time.time() + 60,
        "email": "ada@example.com"}))
    assert Account.current(None) == Account("http://saved:1", "T", "ada@example.com")
    assert Account.current("http://other:2/api").server == "http://other:2"
    assert Account.current("ftp://nope") is None
    monkeypatch.setenv("COSMICAC_SERVER", "http://env:3")
    assert Account.current(None).server == "http://env:3"


def test_the_session_file_is_read_from_the_config_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("COSMICAC_CONFIG_DIR", str(tmp_path / "none"))
    assert Account.current(None) is None
    assert not Path(tmp_path / "none").exists()


# -- the wiring: every parameter that takes one of these values completes it ----------


def _parameters(command, path=()):
    """(command path, parameter) for every parameter under ``command``."""
    if hasattr(command, "commands"):
        for name, sub in command.commands.items():
            yield from _parameters(sub, (*path, name))
    else:
        for parameter in command.params:
            yield " ".join(path), parameter


def _completer(parameter):
    complete = parameter._custom_shell_complete  # typer's autocompletion, wrapped
    return None if complete is None else complete.__closure__[0].cell_contents


#: What completes a parameter: (names it goes by, the completer), in these groups.
_WIRED = {
    ("job",): "job_ids",
    ("--team", "team"): "team_names",
}


@pytest.mark.parametrize("group", ["jobs", "shell", "inference", "teams", "models", "apikeys",
                                   "nodes"])
def test_each_job_team_model_and_served_name_parameter_completes(group):
    import typer.main

    from cli.main import build_app

    root = typer.main.get_command(build_app(group))
    wired = {}
    for path, parameter in _parameters(root):
        names = {parameter.name, *getattr(parameter, "opts", ())}
        if "job" in names or "--team" in names or (group == "teams" and "team" in names) \
                or (group in ("inference", "models", "apikeys") and
                    names & {"--model", "name"}) \
                or (path == "jobs create" and "--model" in names):
            completer = _completer(parameter)
            wired[(path, parameter.name)] = getattr(completer, "__name__", None)
    if group == "models":  # `models add NAME` names a new model
        wired.pop(("models add", "name"))
    if group == "apikeys":  # `apikeys create --name` names a new key
        wired.pop(("apikeys create", "name"))
    assert wired and all(wired.values()), wired
    expected = {"job_ids", "container_job_ids", "team_names", "model_names", "served_names"}
    assert set(wired.values()) <= expected, wired
    if group == "shell":
        assert wired == {("shell", "job"): "container_job_ids"}
    if group == "inference":
        assert set(wired.values()) == {"served_names"}
    if group == "apikeys":  # usage's --model: what requests named (served names)
        assert wired[("apikeys usage", "model")] == "served_names"
