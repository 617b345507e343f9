import json

from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()


def test_keys_show_twice_prints_the_same_key(tmp_path):
    first = runner.invoke(app, ["keys", "show", "--storage", str(tmp_path)])
    second = runner.invoke(app, ["keys", "show", "--storage", str(tmp_path)])
    assert first.exit_code == 0 and second.exit_code == 0
    assert len(first.stdout.strip()) == 64
    assert first.stdout == second.stdout


def test_keys_show_offers_json(tmp_path):
    result = runner.invoke(app, ["keys", "show", "--storage", str(tmp_path), "-o", "json"])
    document = json.loads(result.stdout)
    assert len(document["public_key"]) == 64


def test_corrupt_identity_gives_a_clear_error_not_a_traceback(tmp_path):
    (tmp_path / "identity").write_text("{broken")
    result = runner.invoke(app, ["keys", "show", "--storage", str(tmp_path)])
    assert result.exit_code == 1
    assert "is corrupt" in result.stderr
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
