"""`cosmicac up` as a real process: the whole deployment starts, answers, and stops clean."""

import json
import os
import random
import re
import signal
import socket
import subprocess
from pathlib import Path

import httpx
import pytest
import trio

from cli.up import MARKER, Ports

from .helpers import COSMICAC, read_until

UP = re.compile(r"cosmicac is up at (\S+)")


def _free_base() -> int:
    """A base port whose 21 ports are free (TCP and UDP), off the real defaults."""
    for _ in range(50):
        base = random.randrange(20000, 40000)
        try:
            for port in range(base, base + 21):
                for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
                    with socket.socket(socket.AF_INET, kind) as sock:
                        sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free port range")


def _pids_using(path: Path) -> list[int]:
    """Processes whose command line names ``path`` (the storage): up's children."""
    found = []
    needle = str(path).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline:
            found.append(int(entry.name))
    return found


def test_ports_shift_together_and_keep_5173_at_the_default():
    default = Ports.from_base(49737)
    assert (default.relay, default.dht, default.app_http, default.proxy_http,
            default.entry) == (49737, 49738, 49751, 49750, 5173)
    assert Ports.from_base(30000).entry == 30020


def test_reset_refuses_a_folder_up_did_not_make(tmp_path):
    from typer.testing import CliRunner

    from cli.main import app

    (tmp_path / "precious").write_text("keep me")
    result = CliRunner().invoke(app, ["up", "--storage", str(tmp_path), "--reset"])
    assert result.exit_code == 2
    assert MARKER in result.output
    assert (tmp_path / "precious").exists()


@pytest.mark.slow
async def test_up_runs_everything_serves_the_api_and_inference_and_stops_clean(tmp_path):
    storage = tmp_path / "up"
    base = _free_base()
    process = await trio.lowlevel.open_process(
        [*COSMICAC, "up", "--storage", str(storage), "--no-table", "--base-port", str(base)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        with trio.fail_after(120):
            match = await read_until(process.stdout, UP)
        url = match[1]
        assert url == f"http://127.0.0.1:{base + 20}"
        credentials = storage / "credentials.json"
        assert credentials.stat().st_mode & 0o777 == 0o600
        creds = json.loads(credentials.read_text())
        assert creds["url"] == url and creds["email"] == "admin@cosmicac.local"

        def get(path: str, **headers: str) -> httpx.Response:
            return httpx.get(url + path, headers=headers, timeout=30)

        spec = await trio.to_thread.run_sync(get, "/api/openapi.json")
        assert spec.status_code == 200, spec.text
        models = await trio.to_thread.run_sync(
            lambda: get("/inference/v1/models", authorization=f"Bearer {creds['api_key']}"))
        assert models.status_code == 200, models.text
        assert _pids_using(storage)  # the children name their configs under storage

        process.send_signal(signal.SIGINT)
        with trio.fail_after(15):
            assert await process.wait() == 0
        assert _pids_using(storage) == []
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        for pid in _pids_using(storage):  # never leave a failed run's children behind
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
