"""`cosmicac up`'s ports and its guard on ``--reset``. Up as a real process (the
whole deployment starts, the local CLI is logged in to it, it stops clean and
stops the agents it left running) is the README's quick start,
``tests/e2e/test_quickstart.py``: one ``up`` for all of it."""

from cli.up import DEFAULT_BASE_PORT, MARKER, Ports


def test_ports_shift_together_and_keep_5173_at_the_default():
    default = Ports.from_base(49737)
    assert (default.relay, default.dht, default.app_http, default.proxy_http,
            default.entry) == (49737, 49738, 49751, 49750, 5173)
    assert Ports.from_base(30000).entry == 30020


def test_the_default_ports_are_the_daemons_own_settings():
    from nodes.app_node.settings import AppNodeSettings
    from nodes.monitor.settings import MonitorSettings
    from relay import DEFAULT_PORT

    default = Ports.from_base(DEFAULT_BASE_PORT)
    assert DEFAULT_BASE_PORT == DEFAULT_PORT == default.relay
    assert (default.worker, default.ork, default.proxy, default.app, default.monitor,
            default.monitor_http) == (49739, 49740, 49741, 49742, 49743, 49752)
    assert default.app == AppNodeSettings.model_fields["port"].default
    assert default.monitor_http == MonitorSettings.model_fields["http"].default.port
    shifted = Ports.from_base(30000)
    assert (shifted.dht, shifted.app, shifted.app_http) == (30001, 30005, 30014)


def test_reset_refuses_a_folder_up_did_not_make(tmp_path):
    from typer.testing import CliRunner

    from cli.main import app

    (tmp_path / "precious").write_text("keep me")
    result = CliRunner().invoke(app, ["up", "--storage", str(tmp_path), "--reset"])
    assert result.exit_code == 2
    assert MARKER in result.output
    assert (tmp_path / "precious").exists()
