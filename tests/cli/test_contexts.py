"""Contexts without a server: the file (parsing, names, migration from
``session.json``, its mode), ``cosmicac context list|use|rename|delete|current``
in every output mode, which context a command uses (``--context`` over
``$COSMICAC_CONTEXT`` over the current one), and ``main``'s ``--context`` pre-parse.
Against real app-nodes: ``test_contexts_servers.py``."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli import _contexts
from cli._contexts import Context, Contexts, ContextsError, ContextsFileError
from cli.main import take_context
from tests.examples import examples

from .support import invoke, one_error_line

A, B = "http://127.0.0.1:5173", "https://cosmic.example.com"
FUTURE = time.time() + 86400 * 2.5


def _env(config: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSMICAC_")}
    env.update({"COSMICAC_CONFIG_DIR": str(config), "NO_COLOR": "1", "COLUMNS": "200",
                **extra})
    return env


def _write(config: Path, document: object) -> Path:
    config.mkdir(parents=True, exist_ok=True)
    path = config / "contexts.json"
    path.write_text(json.dumps(document))
    return path


def _two(config: Path, current: str | None = "local") -> Path:
    """A file of two contexts: local (logged in) and prod (logged out)."""
    return _write(config, {"version": 1, "current": current, "contexts": {
        "local": {"server": A, "email": "ada@example.com", "token": "tok-local",
                  "expires_at": FUTURE},
        "prod": {"server": B, "email": "bob@example.com", "token": None,
                 "expires_at": None}}})


# -- the file -------------------------------------------------------------------------


@pytest.mark.parametrize(("document", "complaint"), [
    (b"{not json", "not JSON"),
    (b"[]", "not a JSON object"),
    (b'{"version": 9, "contexts": {}}', "newer cosmicac"),
    (b'{"current": 3, "contexts": {}}', "'current' is not a string"),
    (b'{"contexts": []}', "'contexts' is not an object"),
    (b'{"contexts": {"a": "http://x"}}', "context 'a' is not an object"),
    (b'{"contexts": {"a": {}}}', "'server' is not an http"),
    (b'{"contexts": {"a": {"server": "ftp://x"}}}', "'server' is not an http"),
    (b'{"contexts": {"a": {"server": "http://x", "token": 7}}}', "'token' is not a string"),
    (b'{"contexts": {"a": {"server": "http://x", "expires_at": true}}}', "not a number"),
    (b'{"contexts": {"a/b": {"server": "http://x"}}}', "cannot hold '/'"),
    (b'{"contexts": {"a\\u001bb": {"server": "http://x"}}}', "cannot hold '\\x1b'"),
    (b"\xff\xfe", "not JSON"),
])
def test_a_file_that_is_not_a_contexts_file_is_named_with_what_is_wrong(
        document: bytes, complaint: str) -> None:
    with pytest.raises(ContextsFileError) as raised:
        _contexts.parse(document, "/cfg/contexts.json")
    assert "/cfg/contexts.json" in str(raised.value)
    assert complaint in str(raised.value)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["version", "current", "contexts", "server", "email", "token",
                         "expires_at", "a", "a/b", ""]) | st.text(max_size=4), inner,
        max_size=5), max_leaves=20)


_ENTRY = st.fixed_dictionaries({"server": st.sampled_from(["http://h:1", "https://x", "ftp://y",
                                                           3])},
                                optional={"email": st.none() | st.text(max_size=4) | st.integers(),
                                          "token": st.none() | st.text(max_size=4) | st.booleans(),
                                          "expires_at": st.none() | st.floats() | st.integers()
                                          | st.booleans() | st.text(max_size=2),
                                          "more": _JSON})
_DOCUMENT = st.fixed_dictionaries(
    {"contexts": st.dictionaries(st.text(max_size=6), _ENTRY, max_size=3)},
    optional={"current": st.none() | st.text(max_size=3) | st.integers(),
              "version": st.integers(-1, 3) | st.booleans(), "later": _JSON})


@settings(max_examples=examples(300), deadline=None)
@given(st.binary(max_size=200) | (_JSON | _DOCUMENT).map(
    lambda doc: json.dumps(doc).encode()))
def test_any_bytes_parse_to_contexts_or_a_file_error(data: bytes) -> None:
    try:
        parsed = _contexts.parse(data)
    except ContextsFileError:
        return
    assert _contexts.parse(parsed.to_json().encode()) == parsed


def test_a_file_nested_too_deep_is_a_file_error_too() -> None:
    with pytest.raises(ContextsFileError):
        _contexts.parse(b"[" * 100_000)


def test_concurrent_changes_all_land(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two logins at once: each writes the whole file, under the lock, so neither
    change is lost."""
    import threading

    monkeypatch.setenv("COSMICAC_CONFIG_DIR", str(tmp_path / "config"))

    def add(n: int) -> None:
        with _contexts.edit() as contexts:
            contexts.put(Context(f"c{n}", A))

    threads = [threading.Thread(target=add, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert _contexts.read().names() == sorted(f"c{n}" for n in range(16))


def test_the_file_round_trips_and_keeps_keys_it_does_not_know() -> None:
    data = json.dumps({"version": 1, "current": "a", "later": [1], "contexts": {
        "a": {"server": A, "email": "e", "token": "t", "expires_at": 5, "team": "x"}}})
    parsed = _contexts.parse(data.encode())
    assert parsed.current == "a" and parsed.get("a").token == "t"
    again = json.loads(parsed.to_json())
    assert again["later"] == [1] and again["contexts"]["a"]["team"] == "x"
    assert _contexts.parse(parsed.to_json().encode()) == parsed


@pytest.mark.parametrize("name", ["prod", "127.0.0.1:5173", "ada@example.com@h:1", "é"])
def test_names_a_user_can_type_are_taken(name: str) -> None:
    assert _contexts.check_name(name) == name


@pytest.mark.parametrize("name", ["", "a/b", "a\\b", "a b", "a\nb", "a\x1bb", "-x",
                                  "x" * 201])
def test_names_that_would_break_a_path_a_table_or_an_option_are_refused(name: str) -> None:
    with pytest.raises(ContextsError):
        _contexts.check_name(name)


@pytest.mark.parametrize(("server", "name"), [
    ("http://127.0.0.1:5173", "127.0.0.1:5173"),
    ("https://cosmic.example.com", "cosmic.example.com"),
    ("https://user:secret@cosmic.example.com:8443/api", "cosmic.example.com:8443"),
    ("http://[::1]:5173", "[::1]:5173"),
    ("http://", "default"),
    ("http://h:port", "default"),
])
def test_a_context_is_named_after_its_server_never_its_credentials(server: str,
                                                                    name: str) -> None:
    assert _contexts.derive_name(server) == name


def _store(*contexts: Context, current: str | None = None) -> Contexts:
    return Contexts({c.name: c for c in contexts}, current)


NOW = 1000.0
ADA, BOB = "ada@example.com", "bob@example.com"


@pytest.mark.parametrize(("store", "server", "email", "explicit", "name"), [
    # the first login: named after the server
    (_store(), A, ADA, None, "127.0.0.1:5173"),
    # --context wins, even over a context of that server
    (_store(Context("127.0.0.1:5173", A, ADA, "t", 2e3)), A, ADA, "mine", "mine"),
    # logging in again: the same context, though renamed
    (_store(Context("local", A, ADA, "t", 2e3), current="local"), A, ADA, None, "local"),
    (_store(Context("local", A, ADA, "t", 2e3), Context("p", B, ADA, "t", 2e3),
            current="p"), A, ADA, None, "local"),
    # after logout, another account takes the current context of that server
    (_store(Context("local", A, ADA, None, None), current="local"), A, BOB, None, "local"),
    # another account on a server whose context holds a live session: a context of its own
    (_store(Context("127.0.0.1:5173", A, ADA, "t", 2e3), current="127.0.0.1:5173"), A, BOB,
     None, f"{BOB}@127.0.0.1:5173"),
    # ... which an expired session does not hold
    (_store(Context("127.0.0.1:5173", A, ADA, "t", 5.0), current="127.0.0.1:5173"), A, BOB,
     None, "127.0.0.1:5173"),
    # the derived name taken by another server's context: EMAIL@name, then -2
    (_store(Context("127.0.0.1:5173", "https://127.0.0.1:5173", ADA, "t", 2e3)), A, ADA,
     None, f"{ADA}@127.0.0.1:5173"),
    (_store(Context("127.0.0.1:5173", "https://127.0.0.1:5173", ADA, "t", 2e3),
            Context(f"{ADA}@127.0.0.1:5173", "https://127.0.0.1:5173", ADA, "t", 2e3)),
     A, ADA, None, f"{ADA}@127.0.0.1:5173-2"),
])
def test_login_picks_the_context_a_user_would_expect(store: Contexts, server: str,
                                                      email: str, explicit: str | None,
                                                      name: str) -> None:
    assert _contexts.login_name(store, server, email, explicit, NOW) == name


def test_login_refuses_a_context_name_that_cannot_be_one() -> None:
    with pytest.raises(ContextsError):
        _contexts.login_name(_store(), A, ADA, "a/b", NOW)


def test_a_saved_session_becomes_current_on_login_or_when_the_current_one_has_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A renewed token (``users password``, ``up``'s login) keeps the user's current
    context; ``login`` makes its context current; a logged-out current one gives way."""
    from cli.session import SavedSession, save_session

    config = tmp_path / "config"
    path = _two(config)  # local: logged in, current
    monkeypatch.setenv("COSMICAC_CONFIG_DIR", str(config))
    renewed = SavedSession(server=B, token="tok-prod", expires_at=FUTURE, email=BOB)
    assert save_session(renewed) == "prod"
    saved = json.loads(path.read_text())
    assert saved["current"] == "local" and saved["contexts"]["prod"]["token"] == "tok-prod"
    assert save_session(renewed, make_current=True) == "prod"
    assert json.loads(path.read_text())["current"] == "prod"

    _two(config)
    saved = json.loads(path.read_text())
    saved["contexts"]["local"]["token"] = None  # logged out
    path.write_text(json.dumps(saved))
    assert save_session(renewed) == "prod"
    assert json.loads(path.read_text())["current"] == "prod"


# -- migration from session.json ----------------------------------------------------


def test_an_old_session_json_becomes_the_current_context_without_losing_it(
        tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.mkdir()
    session = {"server": A, "token": "tok-old", "expires_at": FUTURE, "email": ADA}
    (config / "session.json").write_text(json.dumps(session))

    listed = invoke(["context", "list", "-o", "json"], env=_env(config))
    assert listed.returncode == 0, listed.stderr
    [context] = json.loads(listed.stdout)
    assert context == {"name": "127.0.0.1:5173", "current": True, "server": A,
                       "email": ADA, "logged_in": True, "expires_at": FUTURE}
    assert b"tok-old" not in listed.stdout  # a listing never shows a token
    path = config / "contexts.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text())["contexts"]["127.0.0.1:5173"]["token"] == "tok-old"
    assert not (config / "session.json").exists()


def test_a_session_json_written_beside_the_contexts_is_taken_in_as_a_login(
        tmp_path: Path) -> None:
    """An older cosmicac (or a script) logging in again: its session is not lost."""
    config = tmp_path / "config"
    path = _two(config, current="prod")
    (config / "session.json").write_text(json.dumps(
        {"server": A, "token": "tok-new", "expires_at": FUTURE, "email": ADA}))
    current = invoke(["context", "current"], env=_env(config))
    assert current.stdout == b"local\n"  # ada's context of that server, made current
    saved = json.loads(path.read_text())
    assert saved["contexts"]["local"]["token"] == "tok-new"
    assert sorted(saved["contexts"]) == ["local", "prod"]
    assert not (config / "session.json").exists()


def test_a_session_json_that_cannot_be_read_is_left_alone(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "session.json").write_text("{half")
    listed = invoke(["context", "list", "-o", "json"], env=_env(config))
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == []
    assert (config / "session.json").read_text() == "{half"


# -- cosmicac context ...  -----------------------------------------------------------


def test_list_prints_plain_columns_when_piped_and_every_document_mode(tmp_path: Path) -> None:
    config = tmp_path / "config"
    _two(config)
    env = _env(config)

    table = invoke(["context", "list"], env=env)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.decode().splitlines()
    assert lines[0].split() == ["CURRENT", "NAME", "SERVER", "USER", "EXPIRES"]
    assert lines[1].split() == ["*", "local", A, ADA, "in", "2d"]
    assert lines[2].split() == ["prod", B, BOB, "logged", "out"]
    assert not any(ch in table.stdout.decode() for ch in "│┃━─╭")

    bare = invoke(["context", "list", "--no-headers"], env=env)
    assert [line.split() for line in bare.stdout.decode().splitlines()] == \
        [line.split() for line in lines[1:]]
    wide = invoke(["context", "list", "-o", "wide"], env=env)
    assert wide.stdout == table.stdout  # no column is kept for wide terminals
    names = invoke(["context", "list", "-o", "name"], env=env)
    assert names.stdout.decode().split() == ["local", "prod"]
    yaml_out = invoke(["context", "list", "-o", "yaml"], env=env)
    assert yaml_out.returncode == 0 and b"name: prod" in yaml_out.stdout
    queried = invoke(["context", "list", "--query", "[?logged_in].name"], env=env)
    assert queried.stdout.decode().split() == ["local"]
    for result in (table, yaml_out, queried):
        assert b"tok-local" not in result.stdout
    bad = invoke(["context", "list", "-o", "xml"], env=env)
    assert bad.returncode == 2


def test_a_context_name_completes_from_the_file(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from cli.context import _complete_names

    config = tmp_path / "config"
    monkeypatch.setenv("COSMICAC_CONFIG_DIR", str(config))
    assert _complete_names("") == []
    path = _two(config)
    assert _complete_names("") == ["local", "prod"]
    assert _complete_names("pr") == ["prod"]
    path.write_text("{")
    assert _complete_names("") == []


def test_use_switches_the_current_context_and_refuses_an_unknown_one(tmp_path: Path) -> None:
    config = tmp_path / "config"
    path = _two(config)
    env = _env(config)
    used = invoke(["context", "use", "prod"], env=env)
    assert used.returncode == 0, used.stderr
    assert "COSMICAC_SERVER" not in used.stderr.decode()
    assert json.loads(path.read_text())["current"] == "prod"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert invoke(["context", "current"], env=env).stdout == b"prod\n"

    overridden = invoke(["context", "use", "local"], env={**env, "COSMICAC_SERVER": B})
    assert f"$COSMICAC_SERVER ({B}) overrides" in overridden.stderr.decode()
    assert invoke(["context", "use", "prod"], env=env).returncode == 0

    unknown = invoke(["context", "use", "staging"], env=env)
    assert unknown.returncode == 2
    line = one_error_line(unknown)
    assert "'staging'" in line and "'local', 'prod'" in line
    assert json.loads(path.read_text())["current"] == "prod"


def test_rename_keeps_the_current_one_current_and_refuses_taken_or_bad_names(
        tmp_path: Path) -> None:
    config = tmp_path / "config"
    path = _two(config)
    env = _env(config)
    renamed = invoke(["context", "rename", "local", "dev"], env=env)
    assert renamed.returncode == 0, renamed.stderr
    saved = json.loads(path.read_text())
    assert saved["current"] == "dev" and sorted(saved["contexts"]) == ["dev", "prod"]
    assert saved["contexts"]["dev"]["token"] == "tok-local"

    for new in ("prod", "a/b", "a\x07b"):
        refused = invoke(["context", "rename", "dev", new], env=env)
        assert refused.returncode == 2, new
        one_error_line(refused)
    missing = invoke(["context", "rename", "nope", "x"], env=env)
    assert missing.returncode == 2 and "known contexts" in one_error_line(missing)
    assert json.loads(path.read_text()) == saved


def test_deleting_the_current_context_leaves_none_current(tmp_path: Path) -> None:
    config = tmp_path / "config"
    path = _two(config)
    env = _env(config)
    deleted = invoke(["context", "delete", "local"], env=env)
    assert deleted.returncode == 0, deleted.stderr
    said = deleted.stderr.decode()
    assert "not revoked" in said and "context use" in said
    saved = json.loads(path.read_text())
    assert saved["current"] is None and list(saved["contexts"]) == ["prod"]
    none = invoke(["context", "current"], env=env)
    assert none.returncode == 1 and "no current context" in one_error_line(none)
    who = invoke(["whoami"], env=env)
    assert who.returncode == 3 and "not logged in" in one_error_line(who)
    again = invoke(["context", "delete", "local"], env=env)
    assert again.returncode == 2 and "'prod'" in one_error_line(again)


def test_the_context_is_the_flag_else_the_environment_else_the_current_one(
        tmp_path: Path) -> None:
    config = tmp_path / "config"
    _two(config)
    plain, with_env = _env(config), _env(config, COSMICAC_CONTEXT="prod")

    def current(*args: str, env: dict[str, str]) -> str:
        result = invoke([*args, "context", "current"], env=env)
        assert result.returncode == 0, result.stderr
        return result.stdout.decode().strip()

    assert current(env=plain) == "local"
    assert current(env=with_env) == "prod"
    assert current("--context", "local", env=with_env) == "local"
    assert current("--context=prod", env=plain) == "prod"
    # the marker follows what commands use
    listed = json.loads(invoke(["context", "list", "-o", "json"], env=with_env).stdout)
    assert [c["name"] for c in listed if c["current"]] == ["prod"]


def test_an_unknown_or_logged_out_context_is_a_clear_error_before_any_request(
        tmp_path: Path) -> None:
    config = tmp_path / "config"
    _two(config)
    unknown = invoke(["--context", "staging", "whoami"], env=_env(config))
    assert unknown.returncode == 2
    line = one_error_line(unknown)
    assert "no context named 'staging'" in line and "'local', 'prod'" in line
    from_env = invoke(["jobs", "list"], env=_env(config, COSMICAC_CONTEXT="staging"))
    assert from_env.returncode == 2 and "'staging'" in one_error_line(from_env)
    logged_out = invoke(["--context", "prod", "whoami"], env=_env(config))
    assert logged_out.returncode == 3
    line = one_error_line(logged_out)
    assert "'prod'" in line and "cosmicac --context prod login" in line


def test_a_corrupt_contexts_file_stops_every_command_and_is_never_rewritten(
        tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.mkdir()
    path = config / "contexts.json"
    garbage = b'{"current": "a", "contexts": {"a": {"server": 5}}}'
    path.write_bytes(garbage)
    env = _env(config)
    for args, stdin in ((["context", "list"], b""), (["context", "use", "a"], b""),
                        (["context", "delete", "a"], b""), (["whoami"], b""),
                        (["logout"], b""),
                        (["login", "--email", ADA, "--password-stdin", "--server", A],
                         b"pw\n")):
        result = invoke(args, env=env, stdin=stdin)
        assert result.returncode == 2, (args, result.stderr)
        line = one_error_line(result)
        assert str(path) in line and "'server'" in line, line
        assert path.read_bytes() == garbage


def test_login_refuses_a_context_name_with_a_slash_before_asking_anything(
        tmp_path: Path) -> None:
    result = invoke(["--context", "a/b", "login", "--email", ADA, "--password-stdin"],
                    env=_env(tmp_path / "config"), stdin=b"pw\n")
    assert result.returncode == 2 and "cannot hold '/'" in one_error_line(result)
    assert not (tmp_path / "config" / "contexts.json").exists()


# -- main's pre-parse ----------------------------------------------------------------


@pytest.mark.parametrize(("argv", "kept", "chosen"), [
    (["--context", "p", "whoami"], ["whoami"], "p"),
    (["whoami", "--context", "p"], ["whoami"], "p"),
    (["jobs", "list", "--context=p", "-o", "json"], ["jobs", "list", "-o", "json"], "p"),
    (["--log-level", "debug", "jobs", "list", "--context", "p"],
     ["--log-level", "debug", "jobs", "list"], "p"),
    (["shell", "j-1", "--", "x", "--context", "p"], ["shell", "j-1", "--", "x", "--context",
                                                    "p"], None),
    (["shell", "j-1", "--context", "p", "--", "ls"], ["shell", "j-1", "--", "ls"], "p"),
    # doctor's --context is the kubeconfig's: the CLI's goes before the command
    (["doctor", "--context", "kind"], ["doctor", "--context", "kind"], None),
    (["--context", "p", "doctor", "--context", "kind"], ["doctor", "--context", "kind"], "p"),
    (["whoami", "--context"], ["whoami", "--context"], None),  # click says what is missing
    (["whoami"], ["whoami"], None),
])
def test_main_takes_the_context_option_out_of_any_command(argv: list[str], kept: list[str],
                                                          chosen: str | None) -> None:
    assert take_context(argv) == (kept, chosen)
