"""The models' self-check: a model that crashes its process is a verdict, not a crash."""

from __future__ import annotations

import subprocess

import pytest

from agents.inference.engines import selfcheck


def test_a_working_model_is_checked_in_a_child_process() -> None:
    works, verdict = selfcheck.check_model("demo")
    assert works, verdict
    assert verdict.startswith("demo: ok, 2 tokens generated in ")


def test_a_model_that_kills_its_process_is_named_with_the_signal_and_the_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def died(args, **_):
        assert args[-1] == "gemma-3-270m"
        return subprocess.CompletedProcess(args, -11, "", "")

    monkeypatch.setattr(selfcheck.subprocess, "run", died)
    works, verdict = selfcheck.check_model("gemma-3-270m")
    assert not works
    assert "died of SIGSEGV" in verdict and "GGML_NATIVE=OFF" in verdict


def test_a_model_that_fails_to_load_reports_its_last_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def failed(args, **_):
        return subprocess.CompletedProcess(args, 1, "", "warming up\nmodel 'x' could not load\n")

    monkeypatch.setattr(selfcheck.subprocess, "run", failed)
    assert selfcheck.check_model("pocketsphinx-en") == (
        False, "pocketsphinx-en: model 'x' could not load")


def test_a_hung_check_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    def hung(args, *, timeout, **_):
        raise subprocess.TimeoutExpired(args, timeout)

    monkeypatch.setattr(selfcheck.subprocess, "run", hung)
    assert selfcheck.check_model("demo", timeout_s=7) == (False, "demo: no answer within 7 s")


def test_unknown_models_are_refused_with_the_known_ones(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        selfcheck.main(["nope"])
    assert exited.value.code == 2
    assert "known: demo, gemma-3-270m, pocketsphinx-en" in capsys.readouterr().err
