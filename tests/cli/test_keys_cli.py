import errno
import json
import os
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

import p2p.keys
from cli.main import app

from .helpers import COSMICAC

runner = CliRunner()


def test_keys_show_twice_prints_the_same_key(tmp_path):
    first = runner.invoke(app, ["keys", "show", "--storage", str(tmp_path)])
    # The second a real process: the group's smoke test of the console script.
    second = subprocess.run([*COSMICAC, "keys", "show", "--storage", str(tmp_path)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert first.exit_code == 0 and second.returncode == 0, second.stderr
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


# -- Regression: a storage folder the identity cannot be written to --------


def _os_error(errno_: int):
    def fail(*args, **kwargs):
        raise OSError(errno_, os.strerror(errno_))
    return fail


def _readonly(tmp_path, monkeypatch):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    if os.geteuid() == 0:  # root writes anyway: the kernel's answer to anyone else
        monkeypatch.setattr(p2p.keys.os, "open", _os_error(errno.EACCES))
    return folder


def _unsearchable(tmp_path, monkeypatch):
    folder = tmp_path / "closed"
    folder.mkdir()
    folder.chmod(0)
    if os.geteuid() == 0:
        monkeypatch.setattr(p2p.keys.Path, "exists", _os_error(errno.EACCES))
    return folder


def _full_disk(tmp_path, monkeypatch):
    monkeypatch.setattr(p2p.keys.os, "write", _os_error(errno.ENOSPC))
    return tmp_path


def _read_only_filesystem(tmp_path, monkeypatch):
    monkeypatch.setattr(p2p.keys.os, "open", _os_error(errno.EROFS))
    return tmp_path


def _proc(tmp_path, monkeypatch):
    return Path("/proc")  # a real folder where no one creates files


@pytest.mark.parametrize("make_storage", [_readonly, _unsearchable, _full_disk,
                                          _read_only_filesystem, _proc],
                         ids=lambda f: f.__name__.strip("_"))
def test_an_unwritable_storage_is_one_error_line_and_exit_1(tmp_path, monkeypatch,
                                                            make_storage):
    storage = make_storage(tmp_path, monkeypatch)
    if make_storage is _proc and not storage.exists():
        pytest.skip("no /proc here")
    try:
        result = runner.invoke(app, ["keys", "show", "--storage", str(storage)])
    finally:
        monkeypatch.undo()
        storage.chmod(0o755) if storage != Path("/proc") else None
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot"), result.stderr
    assert str(storage) in lines[0]
    if storage != Path("/proc"):
        assert list(storage.iterdir()) == []  # no half-written secret left behind
