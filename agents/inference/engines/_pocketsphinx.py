"""``pocketsphinx-en``: CMU PocketSphinx with the US-English model its wheel bundles.

The CPU stand-in for Parakeet behind ``/v1/audio/transcriptions`` (the
``models`` extra; ../shared/reference §9). It is small (the wheel is about
30 MB, the model loads in under a second), offline and deterministic, and far
less accurate than Parakeet or Whisper: it writes lowercase words without
punctuation, and ``temperature`` means nothing to it.

One decoder serves one utterance at a time, so decoding runs in a worker
thread under a lock: the trio thread keeps serving other requests (and
``/health``) while a file is being decoded. Audio is mixed to mono and
resampled to 16 kHz first, the rate the acoustic model was trained on.
"""

from __future__ import annotations

import trio

from agents.inference.engines import EngineLoadFailed, Transcript, TranscriptWord
from agents.inference.engines._audio import TARGET_RATE, Audio, to_mono_16k

__all__ = ["PocketsphinxEngine"]

# Recogniser fillers in the segmentation, not words: sentence marks, silence, noise.
_FILLERS = frozenset({"<s>", "</s>", "<sil>", "[NOISE]", "[SPEECH]", "++NOISE++"})


class PocketsphinxEngine:
    """US-English speech to text on the bundled PocketSphinx model."""

    name = "pocketsphinx-en"
    languages: frozenset[str] | None = frozenset({"en"})

    def __init__(self) -> None:
        try:
            from pocketsphinx import Decoder

            self._decoder = Decoder(samprate=TARGET_RATE, loglevel="FATAL")
        except Exception as exc:  # the model files are missing or unreadable
            raise EngineLoadFailed(self.name, f"{type(exc).__name__}: {exc}") from exc
        self._frame_rate = int(self._decoder.config["frate"])
        self._lock = trio.Lock()

    async def transcribe(
        self, audio: Audio, *, language: str | None = None, temperature: float = 0.0
    ) -> Transcript:
        """The words heard in ``audio`` (``language``, when given, was checked to be "en")."""
        async with self._lock:
            return await trio.to_thread.run_sync(self._decode, audio)

    def _decode(self, audio: Audio) -> Transcript:
        pcm = to_mono_16k(audio)
        decoder = self._decoder
        decoder.start_utt()
        try:
            decoder.process_raw(pcm, no_search=False, full_utt=True)
        finally:
            decoder.end_utt()
        hypothesis = decoder.hyp()
        words: list[TranscriptWord] = []
        if hypothesis is not None:
            for segment in decoder.seg():
                word = _plain(segment.word)
                if word is None:
                    continue
                words.append(
                    TranscriptWord(
                        word,
                        segment.start_frame / self._frame_rate,
                        (segment.end_frame + 1) / self._frame_rate,
                    )
                )
        text = " ".join(word.word for word in words)
        return Transcript(text=text, language="english", words=tuple(words))


def _plain(word: str) -> str | None:
    """The dictionary word without its pronunciation variant ("read(2)" -> "read")."""
    if word in _FILLERS or word.startswith(("[", "<", "+")):
        return None
    return word.split("(", 1)[0]
