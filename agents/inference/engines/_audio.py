"""Audio for the speech engines: a WAV decoder (stdlib only) and a 16 kHz mono resampler.

The model server accepts WAV files with 16-bit PCM samples at any rate and
any channel count, and nothing else: no ffmpeg is needed, and a file that is
not such a WAV gets a 400 naming what is wrong with it (:class:`BadAudio`).

:func:`decode_wav` is sans-IO and needs only the standard library, so the
``demo`` engine (which only reports the duration) works without the
``models`` extra. It reads the RIFF chunks itself rather than with
:mod:`wave`, because Python 3.11's :mod:`wave` refuses
``WAVE_FORMAT_EXTENSIBLE`` headers, and streamed WAVs (``espeak-ng
--stdout``, ``ffmpeg -f wav -``) carry placeholder sizes (``0xFFFFFFFF``)
that must be read as "to the end of the file".

:func:`to_mono_16k` needs numpy (part of the ``models`` extra): it averages
the channels and resamples by truncating or zero-padding the spectrum, which
is exact band-limited resampling with no aliasing when the rate goes down.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = ["MAX_AUDIO_BYTES", "TARGET_RATE", "Audio", "BadAudio", "decode_wav", "to_mono_16k"]

TARGET_RATE = 16_000
MAX_AUDIO_BYTES = 25 * 1024 * 1024  # OpenAI's and vLLM's default cap for one upload
_MIN_RATE, _MAX_RATE = 1_000, 384_000
_MAX_CHANNELS = 32
_FORMAT_PCM = 0x0001
_FORMAT_EXTENSIBLE = 0xFFFE
# The GUID tail every WAVE_FORMAT_EXTENSIBLE sub-format shares; PCM's starts with 01 00.
_PCM_SUBFORMAT = b"\x01\x00\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"
_UNKNOWN_SIZE = 0xFFFFFFFF


class BadAudio(ValueError):
    """The upload is not a WAV file this server can decode; the message says why."""


@dataclass(frozen=True, slots=True)
class Audio:
    """Decoded WAV audio: interleaved little-endian 16-bit PCM and its layout."""

    pcm: bytes
    rate: int
    channels: int

    @property
    def frames(self) -> int:
        """Samples per channel."""
        return len(self.pcm) // (2 * self.channels)

    @property
    def duration(self) -> float:
        """Length in seconds."""
        return self.frames / self.rate


def decode_wav(data: bytes) -> Audio:
    """The audio of a RIFF/WAVE file holding 16-bit PCM.

    Raises:
        BadAudio: empty input, not RIFF/WAVE, a compressed or non-16-bit format,
            a missing ``fmt `` or ``data`` chunk, or no samples at all.
    """
    if not data:
        raise BadAudio("the audio file is empty")
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise BadAudio("the audio file is not a WAV file (no RIFF/WAVE header); send PCM16 WAV")
    fmt: tuple[int, int, int] | None = None  # (channels, rate, bits)
    offset = 12
    while offset + 8 <= len(data):
        chunk_id = data[offset : offset + 4]
        (size,) = struct.unpack_from("<I", data, offset + 4)
        body_start = offset + 8
        if chunk_id == b"data":
            if fmt is None:
                raise BadAudio("the WAV file has its data chunk before its fmt chunk")
            channels, rate, _bits = fmt
            end = len(data) if size == _UNKNOWN_SIZE else min(len(data), body_start + size)
            frame_bytes = 2 * channels
            usable = (end - body_start) // frame_bytes * frame_bytes
            if usable <= 0:
                raise BadAudio("the WAV file holds no audio samples")
            return Audio(bytes(data[body_start : body_start + usable]), rate, channels)
        if chunk_id == b"fmt ":
            fmt = _parse_fmt(data[body_start : body_start + size])
        if size == _UNKNOWN_SIZE:
            break
        offset = body_start + size + (size & 1)  # chunks are padded to even lengths
    if fmt is None:
        raise BadAudio("the WAV file has no fmt chunk")
    raise BadAudio("the WAV file has no data chunk")


def _parse_fmt(body: bytes) -> tuple[int, int, int]:
    if len(body) < 16:
        raise BadAudio(f"the WAV fmt chunk is {len(body)} bytes, shorter than 16")
    tag, channels, rate, _byte_rate, _align, bits = struct.unpack_from("<HHIIHH", body)
    if tag == _FORMAT_EXTENSIBLE:
        if len(body) < 40 or body[24:40] != _PCM_SUBFORMAT:
            raise BadAudio("the WAV file is WAVE_FORMAT_EXTENSIBLE but not PCM; send 16-bit PCM")
    elif tag != _FORMAT_PCM:
        raise BadAudio(f"the WAV file is compressed (format tag {tag:#06x}); send 16-bit PCM")
    if bits != 16:
        raise BadAudio(f"the WAV file has {bits}-bit samples; only 16-bit PCM is supported")
    if not 1 <= channels <= _MAX_CHANNELS:
        raise BadAudio(f"the WAV file has {channels} channels (1 to {_MAX_CHANNELS} allowed)")
    if not _MIN_RATE <= rate <= _MAX_RATE:
        raise BadAudio(f"the WAV sample rate {rate} Hz is outside {_MIN_RATE}..{_MAX_RATE}")
    return channels, rate, bits


def to_mono_16k(audio: Audio) -> bytes:
    """``audio`` as 16 kHz mono 16-bit PCM (what pocketsphinx's English model expects).

    Needs numpy. Channels are averaged; the rate changes by band-limited
    (spectral) resampling, so nothing above the new Nyquist frequency folds
    back into speech frequencies.
    """
    import numpy as np

    # float32 throughout: a 25 MB upload stays within a few hundred MB while resampled.
    samples = np.frombuffer(audio.pcm, dtype="<i2").astype(np.float32)
    mono = samples.reshape(-1, audio.channels).mean(axis=1, dtype=np.float32)
    del samples
    if audio.rate != TARGET_RATE:
        n = mono.size
        m = max(1, round(n * TARGET_RATE / audio.rate))
        spectrum = np.fft.rfft(mono)
        del mono
        keep = min(spectrum.size, m // 2 + 1)
        resized = np.zeros(m // 2 + 1, dtype=spectrum.dtype)
        resized[:keep] = spectrum[:keep]
        del spectrum
        mono = np.fft.irfft(resized, m) * np.float32(m / n)
    return np.clip(np.rint(mono), -32768, 32767).astype("<i2").tobytes()
