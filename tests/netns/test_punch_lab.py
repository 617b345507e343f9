"""Hole punching through real Linux NATs (tests/netns/nat_lab.py), as a user of
`cosmicac beam` sees it: the dialer reaches the listener through the relay at once,
then the session moves to a direct path where the NATs allow it, or says why it
stays on the relay; either way both streams arrive whole and in order."""

from __future__ import annotations

import pytest

from tests.netns.nat_lab import RunningLab
from tests.netns.punch_trial import run_trial

pytestmark = [pytest.mark.netns, pytest.mark.slow]


@pytest.mark.parametrize(("listener", "dialer", "expected", "transport"), [
    # endpoint-independent NATs, one that drops unsolicited packets and one whose
    # router answers them itself (a RST for an early SYN): TCP simultaneous open
    ("c", "a", "direct", "TCP"),
    # endpoint-dependent ↔ endpoint-independent: TCP cannot aim at a random port;
    # UDP can (the birthday method), with QUIC on the punched 5-tuple
    ("b", "a", "direct", "QUIC over UDP"),
    # endpoint-dependent ↔ no NAT: the NATed side connects to the open one's punch port
    ("b", "open", "direct", "TCP"),
    # both endpoint-dependent: nothing to aim at either way
    ("d", "b", "double_random_nat", None),
])
def test_a_beam_through_the_relay_moves_to_a_direct_path_where_the_nats_allow(
        nat_lab: RunningLab, tmp_path, listener, dialer, expected, transport):
    trial = run_trial(nat_lab, listener, dialer, tmp_path, size=2 << 20, seconds=1.0)
    assert trial.relayed, trial.dialer_err
    assert trial.intact, (trial.dialer_err, trial.listener_err)
    assert trial.outcome == expected, (trial.dialer_err, trial.listener_err)
    assert trial.transport == transport, trial.dialer_err
    if expected == "direct":
        assert "beam: moved to a direct path" in trial.listener_err
    else:
        assert f"staying on the relay ({expected})" in trial.listener_err
