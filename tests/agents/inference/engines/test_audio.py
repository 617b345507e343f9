"""The WAV decoder (any header, clear errors) and the 16 kHz mono resampler."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.inference.engines._audio import TARGET_RATE, Audio, BadAudio, decode_wav, to_mono_16k
from tests.agents.inference.extras import need
from tests.agents.inference.wavs import tone_wav
from tests.examples import examples


def riff(*chunks: tuple[bytes, bytes], riff_size: int | None = None) -> bytes:
    body = b"WAVE" + b"".join(
        cid + struct.pack("<I", len(data)) + data + (b"\0" if len(data) % 2 else b"")
        for cid, data in chunks
    )
    return b"RIFF" + struct.pack("<I", riff_size if riff_size is not None else len(body)) + body


def fmt(tag: int = 1, channels: int = 1, rate: int = 8000, bits: int = 16) -> bytes:
    align = channels * bits // 8
    return struct.pack("<HHIIHH", tag, channels, rate, rate * align, align, bits)


@pytest.mark.parametrize(("rate", "channels"), [(16_000, 1), (22_050, 1), (44_100, 2), (8_000, 3)])
def test_decodes_what_the_stdlib_writes(rate: int, channels: int) -> None:
    audio = decode_wav(tone_wav(0.5, rate=rate, channels=channels))
    assert (audio.rate, audio.channels, audio.frames) == (rate, channels, round(0.5 * rate))
    assert audio.duration == pytest.approx(0.5, abs=1 / rate)


def test_skips_other_chunks_and_reads_extensible_pcm() -> None:
    samples = struct.pack("<4h", 1, -1, 300, -300)
    extensible = (
        fmt(tag=0xFFFE, rate=16_000)
        + struct.pack("<HHI", 22, 16, 0)
        + b"\x01\x00\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"
    )
    data = riff((b"LIST", b"odd"), (b"fmt ", extensible), (b"data", samples))
    assert decode_wav(data) == Audio(samples, 16_000, 1)


def test_streamed_sizes_mean_to_the_end() -> None:
    samples = struct.pack("<3h", 5, 6, 7)
    data = riff((b"fmt ", fmt()), (b"data", b""), riff_size=0xFFFFFFFF)
    data = data[:-4] + struct.pack("<I", 0xFFFFFFFF) + samples + b"\x01"  # a dangling byte
    assert decode_wav(data).pcm == samples


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty"),
        (b"ID3\x04" + bytes(100), "not a WAV"),
        (riff((b"fmt ", fmt(tag=0x55)), (b"data", b"\0\0")), "compressed"),
        (riff((b"fmt ", fmt(bits=8)), (b"data", b"\0\0")), "8-bit"),
        (riff((b"fmt ", fmt(rate=100)), (b"data", b"\0\0")), "sample rate 100"),
        (riff((b"fmt ", fmt(channels=0)), (b"data", b"\0\0")), "0 channels"),
        (riff((b"fmt ", fmt())), "no data chunk"),
        (riff((b"data", b"\0\0")), "before its fmt"),
        (riff((b"LIST", b"x")), "no fmt chunk"),
        (riff((b"fmt ", fmt()), (b"data", b"")), "no audio samples"),
        (riff((b"fmt ", fmt(channels=2)), (b"data", b"\0\0")), "no audio samples"),
        (riff((b"fmt ", b"short")), "shorter than 16"),
    ],
)
def test_bad_files_say_what_is_wrong(data: bytes, message: str) -> None:
    with pytest.raises(BadAudio, match=message):
        decode_wav(data)


@settings(max_examples=examples(300), deadline=None)
@given(st.binary(max_size=200) | st.builds(lambda tail: riff((b"fmt ", fmt())) + tail, st.binary()))
def test_any_bytes_decode_or_raise_bad_audio(data: bytes) -> None:
    try:
        audio = decode_wav(data)
    except BadAudio:
        return
    assert audio.frames > 0 and len(audio.pcm) % (2 * audio.channels) == 0


@pytest.mark.parametrize(("rate", "channels"), [(16_000, 1), (22_050, 1), (44_100, 2), (8_000, 1)])
def test_resampling_keeps_pitch_and_loudness(rate: int, channels: int) -> None:
    np = need("numpy")
    audio = decode_wav(tone_wav(1.0, rate=rate, channels=channels, hz=440.0))
    out = np.frombuffer(to_mono_16k(audio), dtype="<i2").astype(float)
    assert out.size == TARGET_RATE
    spectrum = np.abs(np.fft.rfft(out))
    assert np.argmax(spectrum) == 440  # 1 s of audio: bin k is k Hz
    rms = np.sqrt(np.mean(out**2))
    assert rms == pytest.approx(8000 / np.sqrt(2), rel=0.02)
