"""The agent's shell keys only move forward: in any order of arrival, with repeats,
the set held is the newest one sent, and each update names exactly the keys that
lost access; the saved copy reads back, and a damaged one is ignored."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.instance import ShellAccess, load_saved
from agents.instance._access import SAVED_NAME

KEYS = [f"{i:02x}" * 32 for i in range(1, 6)]

updates = st.lists(st.tuples(st.integers(0, 30), st.frozensets(st.sampled_from(KEYS))),
                   max_size=20)


@given(st.frozensets(st.sampled_from(KEYS)), updates)
def test_the_newest_version_wins_and_removals_are_named(start, sequence):
    access = ShellAccess(start, version=0)
    held_version, held = 0, {bytes.fromhex(k) for k in start}
    for version, keys in sequence:
        removed = access.update(keys, version)
        if version <= held_version:
            assert removed is None  # stale or a repeat: nothing changes
        else:
            new = {bytes.fromhex(k) for k in keys}
            assert removed == held - new
            held_version, held = version, new
        assert access.version == held_version and set(access.keys) == held
        assert all((key in access) == (key in held) for key in map(bytes.fromhex, KEYS))


def test_a_bad_key_changes_nothing():
    access = ShellAccess([KEYS[0]], version=1)
    with pytest.raises(ValueError):
        access.update([KEYS[1], "not-a-key"], 2)
    assert access.version == 1 and set(access.keys) == {bytes.fromhex(KEYS[0])}


def test_the_saved_set_reads_back_private(tmp_path):
    access = ShellAccess(KEYS[:2], version=7)
    access.save(tmp_path)
    assert load_saved(tmp_path) == (tuple(sorted(KEYS[:2])), 7)
    assert os.stat(tmp_path / SAVED_NAME).st_mode & 0o777 == 0o600


@pytest.mark.parametrize("text", [b"", b"{", b"[]", b'{"version": 1}', b'{"keys": []}',
                                  b'{"version": -1, "keys": []}',
                                  b'{"version": 1, "keys": ["zz"]}',
                                  b'{"version": "x", "keys": []}', b"\xff\xfe"])
def test_a_damaged_saved_set_is_ignored(tmp_path, text):
    (tmp_path / SAVED_NAME).write_bytes(text)
    assert load_saved(tmp_path) is None
    assert load_saved(tmp_path / "missing") is None
