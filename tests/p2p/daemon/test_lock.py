"""One daemon per storage folder."""

from __future__ import annotations

import functools
import os
import time

import pytest

from p2p.daemon import LOCK_FILE, StorageInUse, StorageUnusable, lock_storage
from tests.forked import forked


def test_a_second_lock_is_refused_naming_the_folder_and_the_holder_until_released(tmp_path):
    folder = tmp_path / "store"
    with lock_storage(folder) as held:
        assert held.held and held.path == folder.resolve()
        assert (folder / LOCK_FILE).read_text() == f"{os.getpid()}\n"
        with pytest.raises(StorageInUse) as info:
            lock_storage(folder)
        assert info.value.path == folder.resolve()
        assert info.value.pid == os.getpid()
        assert str(folder.resolve()) in str(info.value)
        assert f"process {os.getpid()}" in str(info.value)
    assert not held.held
    with lock_storage(folder):  # released: the next daemon gets it
        pass


def hold_the_lock(folder, out) -> None:
    """The forked holder: lock, say so, and wait to be killed."""
    held = lock_storage(folder)  # noqa: F841 - held until the process dies
    print("locked", file=out)
    time.sleep(60)


def test_a_lock_left_by_a_dead_process_does_not_block(tmp_path):
    # The holder is killed without releasing: the kernel drops its flock. A fork,
    # not a fresh interpreter: it is a process of its own all the same.
    with forked(functools.partial(hold_the_lock, tmp_path)) as holder:
        assert holder.lines.readline() == "locked\n"
        with pytest.raises(StorageInUse) as info:
            lock_storage(tmp_path)
        assert info.value.pid == holder.pid
    # (forked() ended it with SIGKILL and reaped it)
    assert (tmp_path / LOCK_FILE).exists()
    with lock_storage(tmp_path):
        pass


def test_a_folder_that_cannot_be_written_is_named(tmp_path):
    if os.geteuid() == 0:
        blocker = tmp_path / "a-file"
        blocker.write_text("not a folder")
        target = blocker / "store"  # root ignores modes; a file in the path stops it too
    else:
        readonly = tmp_path / "ro"
        readonly.mkdir()
        readonly.chmod(0o500)
        target = readonly / "store"
    with pytest.raises(StorageUnusable) as info:
        lock_storage(target)
    assert str(info.value).startswith(f"cannot use storage folder {target.resolve()}: ")
