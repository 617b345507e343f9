"""write_atomically: the whole new file or the old one, at the mode asked, nothing left beside."""

from __future__ import annotations

import os
import stat

import pytest

from p2p.daemon import sync_directory, write_atomically


def test_replaces_the_file_whole_at_the_mode_asked_and_leaves_nothing_beside(tmp_path):
    path = tmp_path / "state.json"
    write_atomically(path, b"first")
    assert path.read_bytes() == b"first"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    write_atomically(path, b"second", mode=0o644, durable=True)
    assert path.read_bytes() == b"second"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]
    sync_directory(tmp_path)


def test_a_failed_replace_keeps_the_old_file_and_removes_the_temporary(tmp_path):
    path = tmp_path / "taken"
    path.mkdir()  # a directory where the file should go: the rename fails
    (path / "inside").write_bytes(b"kept")
    with pytest.raises(OSError):
        write_atomically(path, b"new")
    assert (path / "inside").read_bytes() == b"kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


def test_an_unsynced_replace_is_still_whole_and_private(tmp_path, monkeypatch):
    path = tmp_path / "status.json"
    synced = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd))
    write_atomically(path, b"report", sync=False)
    assert path.read_bytes() == b"report" and synced == []
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    write_atomically(path, b"kept")
    assert path.read_bytes() == b"kept" and len(synced) == 1
