"""WAV files for the tests: tones written by the stdlib, speech spoken by espeak-ng."""

from __future__ import annotations

import io
import math
import shutil
import struct
import subprocess
import wave

import pytest

from tests.agents.inference.extras import models_required


def tone_wav(
    seconds: float = 1.0, *, rate: int = 16_000, channels: int = 1, hz: float = 440.0
) -> bytes:
    """A sine tone as 16-bit PCM WAV, written by :mod:`wave`."""
    frames = round(seconds * rate)
    samples = []
    for i in range(frames):
        value = round(8000 * math.sin(2 * math.pi * hz * i / rate))
        samples.extend([value] * channels)
    out = io.BytesIO()
    with wave.open(out, "wb") as writer:
        writer.setnchannels(channels)
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes(struct.pack(f"<{len(samples)}h", *samples))
    return out.getvalue()


def spoken_wav(text: str) -> bytes:
    """``text`` spoken by espeak-ng (22050 Hz mono PCM16).

    The voice and speed are the ones pocketsphinx hears best: its model was trained on
    human speech, and espeak-ng's default voice reads "hello world" to it as "oh we're ill".

    Skips when espeak-ng is missing, except where the models must be tested (CI).
    """
    tool = shutil.which("espeak-ng")
    if tool is None:
        if models_required():
            pytest.fail("espeak-ng is missing; .ci/run installs it (apt-get install espeak-ng)")
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng)")
    done = subprocess.run(
        [tool, "-v", "en-us+m3", "-s", "150", "--stdout", text],
        capture_output=True,
        timeout=30,
        check=True,
    )
    return done.stdout
