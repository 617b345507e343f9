"""Every numeric option is range-checked, and no user input ends in a traceback.

Regression tests for command-line defects, then a property test:
whatever value a port, count or duration option gets, the command ends with
exit 0, 1 or 2 and no traceback.
"""

from __future__ import annotations

import logging
import socket
import tempfile

import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cli._console import fail
from cli.main import app
from tests.examples import examples

KEY = "ab" * 32
#: TEST-NET-1 (RFC 5737): binding there fails at once, and nothing is sent anywhere.
UNBINDABLE = "192.0.2.1"


@pytest.fixture(autouse=True)
def _keep_logging():
    # Daemons point the root logger at CliRunner's streams; put it back after.
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def invoke(*args: str, env: dict[str, str] | None = None):
    result = CliRunner().invoke(app, list(args), env=env)
    return result, result.output


H = ["--host", UNBINDABLE]  # if a check ever let a value through, the command still ends


@pytest.mark.parametrize("args", [
    ["dht", "bootstrap", *H, "--port", "-1"],
    ["dht", "bootstrap", *H, "--port", "70000"],
    ["dht", "node", *H, "-b", "127.0.0.1:9", "--port", "65536"],
    ["dht", "bootstrap", *H, "--metrics-port", "-5"],
    ["beam", "--listen", *H, "--port", "70000"],
    ["beam", "--listen", *H, "--port", "-1"],
    ["up", *H, "--port", "70000"],
    ["up", *H, "--port", "-1"],
    ["up", *H, "--metrics-port", "99999"],
    ["db", "serve", *H, "-b", "127.0.0.1:9", "--port", "-1"],
    ["relay", *H, "--port", "70000"],
    ["relay", *H, "--max-reservations", "0"],
    ["relay", *H, "--pair-timeout", "-1"],
    ["relay", *H, "--idle-timeout", "inf"],
    ["ping", KEY, "-a", "127.0.0.1:1", "--count", "0"],
    ["ping", KEY, "-a", "127.0.0.1:1", "--interval", "nan"],
    ["ping", KEY, "-a", "127.0.0.1:1", "--timeout", "0"],
    ["ping", KEY, "-a", "127.0.0.1:70000"],
])
def test_an_out_of_range_option_is_a_usage_error_not_a_traceback_or_a_wrapped_port(
        args, tmp_path):
    if args[0] in ("up", "relay", "db"):
        args = [*args, "--storage", str(tmp_path)]
    result, output = invoke(*args)
    assert result.exit_code == 2, output
    assert "Traceback" not in output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_a_rich_error_line_shows_user_text_as_typed(capsys):
    with pytest.raises(typer.Exit) as info:
        fail("cannot listen on 127.0.0.1:-1: [bold]not markup[/] :smile:", code=2)
    assert info.value.exit_code == 2
    printed = capsys.readouterr().err
    assert printed == "error: cannot listen on 127.0.0.1:-1: [bold]not markup[/] :smile:\n"


def test_up_on_a_busy_metrics_port_is_one_line_and_exit_1(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result, output = invoke("up", "--storage", str(tmp_path), "--port", "0",
                                "--metrics-port", str(port), "--log-level", "warning")
    assert result.exit_code == 1, output
    assert output.strip().splitlines()[-1] == (
        f"error: cannot serve metrics on 127.0.0.1:{port}: Address already in use")


def test_up_refuses_a_storage_folder_in_use(tmp_path):
    from p2p.daemon import lock_storage

    with lock_storage(tmp_path):
        result, output = invoke("up", "--storage", str(tmp_path), "--port", "0")
    assert result.exit_code == 1
    assert f"storage folder {tmp_path.resolve()} is in use" in output


# -- the property: any value, exit 0/1/2, never a traceback ------------------------

VALUES = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.sampled_from(["0", "1", "65535", "65536", "-1", "nan", "inf", "-inf", "1e9", "0x10",
                     "", " ", "\uff18\uff10", "1_000", "4464"]),
    st.text(max_size=12),
)
FLOATS = st.one_of(VALUES, st.floats(allow_nan=True).map(repr))


def commands(storage: str):
    """Commands that end quickly whatever the value: they cannot bind UNBINDABLE."""
    return {
        "dht bootstrap --port": ["dht", "bootstrap", "--host", UNBINDABLE, "--port"],
        "dht bootstrap --metrics-port": ["dht", "bootstrap", "--host", UNBINDABLE,
                                         "--metrics-port"],
        "dht node --port": ["dht", "node", "-b", "127.0.0.1:9", "--host", UNBINDABLE,
                            "--port"],
        "beam --listen --port": ["beam", "--listen", "--host", UNBINDABLE, "--port"],
        "up --port": ["up", "--storage", storage, "--host", UNBINDABLE, "--port"],
        "relay --port": ["relay", "--storage", storage, "--host", UNBINDABLE, "--port"],
        "relay --max-pairs": ["relay", "--storage", storage, "--host", UNBINDABLE,
                              "--max-pairs"],
        "db serve --port": ["db", "serve", "--storage", storage, "-b", "127.0.0.1:9",
                            "--host", UNBINDABLE, "--port"],
        "ping --count": ["ping", KEY, "-a", "127.0.0.1:1", "--count"],
    }


FLOAT_COMMANDS = {
    "relay --pair-timeout": lambda storage: ["relay", "--storage", storage, "--host",
                                             UNBINDABLE, "--pair-timeout"],
    "ping --interval": lambda storage: ["ping", KEY, "-a", "127.0.0.1:1", "-c", "1",
                                        "--interval"],
    "ping --timeout": lambda storage: ["ping", KEY, "-a", "127.0.0.1:1", "--timeout"],
}


def _check(args: list[str]) -> None:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        result = CliRunner().invoke(app, args)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    assert result.exit_code in (0, 1, 2), (args, result.exit_code, result.output)
    assert "Traceback" not in result.output, (args, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        args, repr(result.exception))


@settings(max_examples=examples(25), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(sorted(commands("x"))), value=VALUES)
def test_no_port_or_count_value_ends_in_a_traceback(name, value):
    with tempfile.TemporaryDirectory() as storage:
        _check([*commands(storage)[name], value])


@settings(max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(FLOAT_COMMANDS)), value=FLOATS)
def test_no_duration_value_ends_in_a_traceback(name, value):
    with tempfile.TemporaryDirectory() as storage:
        _check([*FLOAT_COMMANDS[name](storage), value])


@settings(max_examples=examples(200), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=st.characters(blacklist_categories=["Cs", "Cc", "Zl", "Zp"]),
               max_size=40))
def test_any_error_text_is_printed_as_given(capsys, text):
    capsys.readouterr()
    with pytest.raises(typer.Exit):
        fail(f"bad value {text}", code=2)
    assert capsys.readouterr().err == f"error: {' '.join(f'bad value {text}'.split())}\n"
