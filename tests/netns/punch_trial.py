"""One hole-punch trial in the NAT lab: a `cosmicac beam` listener on one host, a
dialer on another, both behind their NATs, meeting through the lab's DHT and relay.

Each side feeds a stream slowly (tests/netns/slow_feed.py), so bytes are in flight
when the session moves from the relay to a punched path; the trial reads each
side's stderr for the path lines `beam` prints and checks both streams arrived
byte for byte. Used by tests/netns/test_punch_lab.py and bench/punch.py.
"""

from __future__ import annotations

import re
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.netns.nat_lab import BOOTSTRAP, RunningLab
from tests.netns.slow_feed import expected_sha256
from tests.netns.topology import console_script

COSMICAC = console_script("cosmicac")
_LISTENING = re.compile(r"listening on \S+ key ([0-9a-f]{64})")
_MOVED = re.compile(r"beam: moved to a direct path(?: to (\S+))? \(([^)]+)\) after ([0-9.]+) s")
_STAYING = re.compile(r"beam: staying on the relay \((\w+)\)")
_RELAYED = re.compile(r"beam: connected through relay")
REPO = Path(__file__).resolve().parents[2]
#: The punch's log lines (punch.*) go to stderr with the path lines, for failures.
_LOG = "--log-level info "


@dataclass(frozen=True)
class Trial:
    """What one trial showed, seen from the dialer."""

    relayed: bool
    """The connection started on the relay (else the dial went direct)."""
    outcome: str
    """``direct`` (moved to a punched path), the reason it stayed relayed, or
    ``unsettled`` when the beam ended before the punch did."""
    seconds_to_direct: float | None
    transport: str | None
    """``TCP`` or ``QUIC over UDP`` once direct."""
    intact: bool
    """Both streams arrived whole, in order."""
    dialer_err: str
    listener_err: str


#: A beam's stderr line once its punch has settled, one way or the other.
_SETTLED = r"beam: (moved to a direct path|staying on the relay)"


def _feed(size: int, seconds: float, seed: str, hold: Path, hold_max: float) -> str:
    return (f"{shlex.quote(sys.executable)} -m tests.netns.slow_feed --size {size} "
            f"--seconds {seconds} --seed {seed} --hold-until {shlex.quote(str(hold))} "
            f"{shlex.quote(_SETTLED)} --hold-max {hold_max}")


def _wait_for(path: Path, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace") if path.exists() else ""
        if found := pattern.search(text):
            return found
        time.sleep(0.05)
    raise TimeoutError(f"no /{pattern.pattern}/ in {path.name} in {timeout} s: "
                       f"{path.read_text(errors='replace')[-2000:] if path.exists() else ''}")


def run_trial(running: RunningLab, listener: str, dialer: str, folder: Path, *,
              size: int = 4 << 20, seconds: float = 3.0, hold_max: float = 25.0,
              timeout: float = 60.0) -> Trial:
    """Beam ``size`` bytes each way between ``listener`` and ``dialer`` (lab hosts),
    over ``seconds``; each side keeps its stdin open until its punch settled (at
    most ``hold_max`` s more)."""
    lab = running.lab
    folder.mkdir(parents=True, exist_ok=True)
    listen_err, listen_out = folder / "listener.err", folder / "listener.out"
    dial_err, dial_out = folder / "dialer.err", folder / "dialer.out"
    listen = (f"{_feed(size, seconds, 'listener', listen_err, hold_max)} | "
              f"{shlex.quote(COSMICAC)} {_LOG}beam --listen "
              f"--bootstrap {BOOTSTRAP} --relay {running.relay_key}")
    process = lab.popen(listener, ["bash", "-c", listen], cwd=REPO,
                        stdout=listen_out.open("wb"), stderr=listen_err.open("wb"))
    try:
        key = _wait_for(listen_err, _LISTENING, 30)[1]
        _wait_for(listen_err, re.compile("reserved on relay"), 30)
        dial = f"{_feed(size, seconds, 'dialer', dial_err, hold_max)} | " \
               f"{shlex.quote(COSMICAC)} {_LOG}beam {key} " \
               f"--bootstrap {BOOTSTRAP}"
        with dial_out.open("wb") as out, dial_err.open("wb") as err:
            result = lab.run(dialer, ["bash", "-c", dial], cwd=REPO, stdout=out, stderr=err,
                             timeout=timeout)
        process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
    dialer_text = dial_err.read_text(errors="replace")
    listener_text = listen_err.read_text(errors="replace")
    want = {"dialer": expected_sha256(size, "dialer"),
            "listener": expected_sha256(size, "listener")}
    intact = (result.returncode == 0 and process.returncode == 0
              and _sha256(listen_out) == want["dialer"] and _sha256(dial_out) == want["listener"])
    moved, staying = _MOVED.search(dialer_text), _STAYING.search(dialer_text)
    outcome = "direct" if moved else (staying[1] if staying else "unsettled")
    return Trial(relayed=bool(_RELAYED.search(dialer_text)), outcome=outcome,
                 seconds_to_direct=float(moved[3]) if moved else None,
                 transport=moved[2] if moved else None, intact=intact,
                 dialer_err=dialer_text, listener_err=listener_text)


def _sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with path.open("rb") as file:
        while block := file.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()
