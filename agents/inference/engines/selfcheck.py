"""``python -m agents.inference.engines.selfcheck [MODEL ...]``: can this machine run them?

A model's native library can be built for CPU features the machine only
claims to have. llama.cpp compiled with ``-march=native`` on a virtual
machine whose CPUID lists AMX dies with SIGSEGV on its first matrix product
(``ldtilecfg``), and takes the model server, or a test process, with it.
The check therefore loads each model in a child process and makes it do real
work (two generated tokens, or a transcription of half a second of
silence), so such a crash becomes one line naming the model and the signal.

``make install-models`` runs it once after installing the extra ``models``;
an operator may run it on a new host before the first job. Exit status 0 when
every model worked, 1 otherwise. With no argument it checks every model the
extra provides.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time

import trio

from agents.inference.engines import (
    KNOWN_MODELS,
    Audio,
    EngineError,
    SpeechEngine,
    TextEngine,
    load_engine,
)

__all__ = ["check_model", "main"]

_MODULE = "agents.inference.engines.selfcheck"  # __name__ is "__main__" when run

#: How long one model may take to load and answer (the first load of
#: gemma-3-270m assembles its GGUF file: seconds; a busy machine: longer).
CHECK_TIMEOUT_S = 300.0
_SILENCE = Audio(pcm=bytes(2 * 8000), rate=16000, channels=1)  # half a second

_CRASH_HINT = {
    "gemma-3-270m": (
        "llama-cpp-python was likely compiled for CPU features this machine cannot run "
        "(GGML_NATIVE on a VM that lists AMX or AVX-512): reinstall it with "
        "CMAKE_ARGS=-DGGML_NATIVE=OFF pip install --no-cache-dir --force-reinstall "
        "llama-cpp-python (make install-models does)"
    ),
}


async def _exercise(model: str) -> str:
    """Load ``model`` here and make it work; what it did, in a few words."""
    engine = load_engine(model)
    if isinstance(engine, TextEngine):
        prompt = engine.tokenize("The capital of France is")
        steps = [step async for step in engine.generate(prompt, max_tokens=2, temperature=0)]
        return f"{len(steps)} tokens generated"
    assert isinstance(engine, SpeechEngine)
    transcript = await engine.transcribe(_SILENCE, language=None, temperature=0.0)
    return f"half a second of silence transcribed ({len(transcript.text)} characters)"


def check_model(model: str, *, timeout_s: float = CHECK_TIMEOUT_S) -> tuple[bool, str]:
    """Run ``model`` in a child process: (it worked, a one-line verdict)."""
    started = time.monotonic()
    try:
        child = subprocess.run(
            [sys.executable, "-m", _MODULE, "--in-process", model],
            capture_output=True, text=True, timeout=timeout_s, check=False,
        )
    except subprocess.TimeoutExpired:
        return False, f"{model}: no answer within {timeout_s:.0f} s"
    took = time.monotonic() - started
    if child.returncode == 0:
        return True, f"{model}: ok, {child.stdout.strip()} in {took:.1f} s"
    if child.returncode < 0:
        name = signal.Signals(-child.returncode).name
        hint = _CRASH_HINT.get(model, "its native library crashed")
        return False, f"{model}: the process died of {name}; {hint}"
    last = (child.stderr.strip().splitlines() or ["(no output)"])[-1]
    return False, f"{model}: {last}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=f"python -m {_MODULE}",
        description="Load each model in a child process and make it work.",
    )
    parser.add_argument("models", nargs="*", metavar="MODEL",
                        help=f"models to check (default: every optional one; known: "
                             f"{', '.join(sorted(KNOWN_MODELS))})")
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    models = args.models or sorted(KNOWN_MODELS - {"demo"})
    unknown = sorted(set(models) - KNOWN_MODELS)
    if unknown:
        parser.error(f"unknown model {unknown[0]!r}; known: {', '.join(sorted(KNOWN_MODELS))}")
    if args.in_process:
        try:
            print(trio.run(_exercise, models[0]))
        except EngineError as exc:
            print(exc, file=sys.stderr)
            return 1
        return 0
    verdicts = [check_model(model) for model in models]
    for _, line in verdicts:
        print(line)
    return 0 if all(ok for ok, _ in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
