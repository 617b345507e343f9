"""Large buffers kept on the heap: glibc takes the settings, and no process is
started to find it (ctypes' find_library runs ldconfig: 10 ms of an agent's start)."""

from __future__ import annotations

import platform
import subprocess

import pytest

from agents.instance._malloc import keep_large_buffers


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_glibc_takes_the_settings_without_a_process_started(monkeypatch):
    def no_process(*args, **kwargs):
        raise AssertionError(f"a process was started: {args}")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    assert keep_large_buffers() is True
