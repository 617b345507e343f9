"""The Parakeet model server: NVIDIA NeMo speech-to-text behind OpenAI's transcription API.

vLLM does not serve Parakeet and NVIDIA ships no plain HTTP server for it
(reference §5), so this is ours. agent-inference starts it as
``python -m agents.inference.runtimes.parakeet_server --model
nvidia/parakeet-tdt-0.6b-v2 --port P --served-name N [--device cuda|cpu]``.
The model loads before the socket opens, so a server that answers
``/health`` is one that can transcribe.

- ``GET /health``: 200, empty body.
- ``GET /v1/models``: the one served name.
- ``POST /v1/audio/transcriptions`` (``multipart/form-data``, OpenAI's fields):
  ``file`` (required), ``model`` (required, the served name), and
  ``response_format`` ``json`` (default) or ``text``. ``language``,
  ``prompt`` and ``temperature`` are accepted and ignored (Parakeet takes
  none of them); ``stream=true`` and the other formats are a 400.

  ``json`` answers ``{"text": "...", "usage": {"type": "duration", "seconds":
  N}}``: speech is metered in audio seconds, measured from the decoded
  waveform on the server (never from what the client claims), rounded up to
  a whole second as vLLM's ``TranscriptionUsageAudio`` does (an int). ``text``
  answers the bare text, as OpenAI does; the proxy asks for ``json`` when it
  needs the usage.

Errors are OpenAI-shaped ``{"error": {"message", "type", "param", "code"}}``:
400 bad form or audio, 404 a model name not served, 413 a file over
``--max-upload-mb`` (25 MB, vLLM's ``VLLM_MAX_AUDIO_CLIP_FILESIZE_MB``
default; refused as soon as the body passes it), 408 and 503 a body too slow
or one too many at once (``.._request_body``), 500 the model failed.

Audio: WAV (PCM 8/16/24/32-bit, any rate, channels averaged to mono) is
decoded with the standard library. Other containers (FLAC, OGG, MP3) need
``soundfile``, which NeMo installs. NeMo runs in a worker thread, one
transcription at a time (one model on one GPU; parallel calls would only
queue inside CUDA while holding more memory).

The transcriber is a plain function ``(Audio) -> str``; :func:`create_app`
takes it as an argument so the HTTP layer is tested with a fake one where
NeMo cannot be installed (no GPU here).
"""

from __future__ import annotations

import argparse
import io
import logging
import math
import sys
import time
import wave
from array import array
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import trio
from starlette.applications import Starlette
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from p2p.http import serve_asgi

from .._openai_errors import OpenAIError, guarded
from .._request_body import install_budget, read_form_bounded
from .._serving import ServerBindError, run_until_signalled

__all__ = [
    "DEFAULT_MAX_UPLOAD_BYTES",
    "Audio",
    "AudioError",
    "Transcriber",
    "TranscriberUnavailable",
    "TranscriptionServerBindError",
    "create_app",
    "decode_audio",
    "load_nemo_transcriber",
    "main",
    "serve_transcriber",
]

log = logging.getLogger(__name__)

#: vLLM's ``VLLM_MAX_AUDIO_CLIP_FILESIZE_MB`` default (reference §5).
DEFAULT_MAX_UPLOAD_BYTES = 25 * 1024 * 1024
#: Room for the form's other fields and multipart boundaries next to the file.
_FORM_OVERHEAD_BYTES = 64 * 1024
#: Parakeet's native rate (model card: 16 kHz mono).
PARAKEET_SAMPLE_RATE = 16_000
#: What to install when NeMo is missing (NeMo's documented ASR extra).
NEMO_PIP = "pip install 'nemo_toolkit[asr]'"


@dataclass(frozen=True, slots=True)
class Audio:
    """A decoded clip: mono float samples in [-1, 1] at ``sample_rate``."""

    samples: array
    sample_rate: int

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.sample_rate


class AudioError(ValueError):
    """The upload is not audio this server can decode (a 400)."""


def _pcm_to_floats(frames: bytes, width: int, channels: int) -> array:
    """Little-endian PCM frames to mono floats (channels averaged)."""
    if width == 1:  # 8-bit WAV is unsigned
        ints = [b - 128 for b in frames]
        scale = 128.0
    elif width in (2, 4):
        typecode = {2: "h", 4: "i"}[width]
        raw = array(typecode)
        raw.frombytes(frames[: len(frames) - len(frames) % width])
        if sys.byteorder == "big":
            raw.byteswap()
        ints = raw.tolist()
        scale = float(1 << (8 * width - 1))
    elif width == 3:
        ints = [int.from_bytes(frames[i:i + 3], "little", signed=True)
                for i in range(0, len(frames) - 2, 3)]
        scale = float(1 << 23)
    else:
        raise AudioError(f"WAV samples of {width} bytes are not supported")
    if channels == 1:
        inverse = 1.0 / scale
        return array("f", [value * inverse for value in ints])
    usable = len(ints) - len(ints) % channels
    mono = array("f")
    for start in range(0, usable, channels):
        mono.append(sum(ints[start:start + channels]) / (channels * scale))
    return mono


def decode_wav(data: bytes) -> Audio:
    """Decode a PCM WAV file.

    Raises:
        AudioError: not a PCM WAV file, or a malformed one.
    """
    try:
        with wave.open(io.BytesIO(data), "rb") as reader:
            channels = reader.getnchannels()
            width = reader.getsampwidth()
            rate = reader.getframerate()
            frames = reader.readframes(reader.getnframes())
    # wave raises a bare RuntimeError for a chunk size past the end of the file.
    except (wave.Error, EOFError, ValueError, OverflowError, RuntimeError) as exc:
        raise AudioError(f"not a readable WAV file: {exc}") from None
    if channels < 1 or rate < 1:
        raise AudioError("WAV header gives no channels or no sample rate")
    return Audio(_pcm_to_floats(frames, width, channels), rate)


def decode_audio(data: bytes) -> Audio:
    """Decode an uploaded file: WAV here, anything else through ``soundfile``.

    Raises:
        AudioError: empty, undecodable, or a non-WAV file without ``soundfile``.
    """
    if not data:
        raise AudioError("the file is empty")
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return decode_wav(data)
    try:
        import soundfile  # NeMo's own dependency; absent where NeMo is
    except ImportError:
        raise AudioError("only WAV files can be decoded here (other formats need the "
                         "'soundfile' package, which NeMo installs)") from None
    try:
        frames, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except Exception as exc:  # soundfile raises its own LibsndfileError and RuntimeError
        raise AudioError(f"cannot decode the audio: {exc}") from None
    mono = array("f", (float(sum(frame)) / len(frame) for frame in frames.tolist()))
    return Audio(mono, int(rate))


#: A blocking function from a decoded clip to its transcript. Called in a
#: worker thread, one call at a time.
Transcriber = Callable[[Audio], str]


class TranscriberUnavailable(Exception):
    """The speech model cannot be loaded here (NeMo missing, or the model failed)."""


def load_nemo_transcriber(model: str, device: str = "cuda") -> Transcriber:
    """Load ``model`` with NeMo and return its transcriber.

    Blocking (seconds to minutes): call before serving. NeMo is imported here
    and nowhere else, so everything else in this module runs without it.

    Raises:
        TranscriberUnavailable: NeMo is not installed (the message says what
            to install), or the model could not be loaded.
    """
    try:
        import numpy
        from nemo.collections.asr.models import ASRModel
    except ImportError as exc:
        raise TranscriberUnavailable(
            f"the parakeet runtime needs NVIDIA NeMo ({exc.name or exc} is missing): {NEMO_PIP}"
        ) from None
    try:
        asr = ASRModel.from_pretrained(model_name=model, map_location=device)
        asr.eval()
    except Exception as exc:  # NeMo raises anything from HF hub, torch, OmegaConf
        raise TranscriberUnavailable(f"cannot load {model!r} on {device}: {exc}") from exc

    def transcribe(audio: Audio) -> str:
        samples = numpy.asarray(audio.samples, dtype=numpy.float32)
        if audio.sample_rate != PARAKEET_SAMPLE_RATE:
            import librosa  # a NeMo dependency

            samples = librosa.resample(samples, orig_sr=audio.sample_rate,
                                       target_sr=PARAKEET_SAMPLE_RATE)
        result: Any = asr.transcribe([samples], batch_size=1)
        if isinstance(result, tuple):  # older NeMo: (best, all) for RNNT/TDT models
            result = result[0]
        first = result[0]
        return str(getattr(first, "text", first))

    return transcribe


# --- HTTP ---


def _field(form: Any, name: str) -> str | None:
    value = form.get(name)
    if value is None or isinstance(value, str):
        return value
    raise OpenAIError(400, f"{name}: must be a form field, not a file", param=name)


@dataclass(frozen=True, slots=True)
class _Form:
    audio: bytes
    response_format: str


class _Api:
    def __init__(self, transcribe: Transcriber, served_name: str, max_upload_bytes: int) -> None:
        self.transcribe = transcribe
        self.served_name = served_name
        self.max_upload_bytes = max_upload_bytes
        self.created = int(time.time())
        self._limiter: trio.CapacityLimiter | None = None

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def models(self, request: Request) -> Response:
        card = {"id": self.served_name, "object": "model", "created": self.created,
                "owned_by": "cosmicac"}
        return JSONResponse({"object": "list", "data": [card]})

    async def transcriptions(self, request: Request) -> Response:
        # An oversize body is refused from its declared length before starlette
        # spools it to disk, and a chunked one as soon as it passes the bound.
        too_large = OpenAIError(413, f"file: larger than {self.max_upload_bytes} bytes",
                                param="file")
        form = await read_form_bounded(request, self.max_upload_bytes + _FORM_OVERHEAD_BYTES,
                                       too_large=too_large)
        try:
            data = await self._read_form(form)
        finally:
            await form.close()  # the spooled upload files
        if len(data.audio) > self.max_upload_bytes:
            raise OpenAIError(413, f"file: larger than {self.max_upload_bytes} bytes", param="file")
        try:
            # Off the event loop: 25 MB of WAV takes a second in pure Python,
            # and /health must keep answering meanwhile.
            audio = await trio.to_thread.run_sync(decode_audio, data.audio)
        except AudioError as exc:
            raise OpenAIError(400, f"file: {exc}", param="file") from None
        if not audio.samples:  # a valid WAV of no frames: nothing to hear, nothing to bill
            text = ""
        else:
            text = await self._transcribe(audio)
        if data.response_format == "text":
            return PlainTextResponse(text)
        seconds = math.ceil(audio.seconds)
        return JSONResponse({"text": text, "usage": {"type": "duration", "seconds": seconds}})

    async def _transcribe(self, audio: Audio) -> str:
        if self._limiter is None:
            self._limiter = trio.CapacityLimiter(1)
        try:
            return await trio.to_thread.run_sync(self.transcribe, audio,
                                                 limiter=self._limiter)
        except Exception as exc:
            log.exception("transcription.failed model=%s seconds=%.1f",
                          self.served_name, audio.seconds)
            raise OpenAIError(500, f"transcription failed: {exc}") from None

    async def _read_form(self, form: Any) -> _Form:
        model = _field(form, "model")
        if not model:
            raise OpenAIError(400, "model: required", param="model")
        if model != self.served_name:
            raise OpenAIError(404, f"The model `{model}` does not exist.", param="model")
        response_format = _field(form, "response_format") or "json"
        if response_format not in ("json", "text"):
            raise OpenAIError(400, f"response_format: {response_format!r} is not supported "
                            "(json or text)", param="response_format")
        if (_field(form, "stream") or "false").lower() in ("true", "1"):
            raise OpenAIError(400, "stream: streaming transcription is not supported",
                            param="stream")
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise OpenAIError(400, "file: required (an audio file)", param="file")
        # One byte over the bound is enough to refuse; never read the rest.
        audio = await upload.read(self.max_upload_bytes + 1)
        return _Form(audio=audio, response_format=response_format)


def create_app(
    transcribe: Transcriber,
    *,
    served_name: str,
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES,
) -> Starlette:
    """The ASGI app serving ``transcribe`` under ``served_name``."""
    api = _Api(transcribe, served_name, max_upload_bytes)

    app = Starlette(routes=[
        Route("/health", guarded(api.health), methods=["GET"]),
        Route("/v1/models", guarded(api.models), methods=["GET"]),
        Route("/v1/audio/transcriptions", guarded(api.transcriptions), methods=["POST"]),
    ])
    install_budget(app)
    return app


class TranscriptionServerBindError(ServerBindError):
    """The server cannot listen on its address."""

    what = "transcriptions"


async def serve_transcriber(
    transcribe: Transcriber,
    *,
    served_name: str,
    host: str = "127.0.0.1",
    port: int = 0,
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve on ``http://host:port`` until cancelled; reports the bound address.

    Raises:
        TranscriptionServerBindError: the address cannot be bound.
    """
    app = create_app(transcribe, served_name=served_name, max_upload_bytes=max_upload_bytes)

    def listening(address: tuple[str, int]) -> None:
        log.info("parakeet_server.listening model=%s url=http://%s:%d", served_name, *address)

    await serve_asgi(app, host=host, port=port, bind_error=TranscriptionServerBindError,
                     on_listening=listening, task_status=task_status)


def main(argv: Sequence[str] | None = None,
         load: Callable[[str, str], Transcriber] = load_nemo_transcriber) -> int:
    """``python -m agents.inference.runtimes.parakeet_server``.

    Prints ``listening http://HOST:PORT`` once the socket is open; exits 0 on
    SIGTERM or SIGINT, 2 when the model cannot be loaded (NeMo missing: the
    message names the pip package) or the address cannot be bound.
    """
    parser = argparse.ArgumentParser(
        prog="python -m agents.inference.runtimes.parakeet_server",
        description="Serve a NeMo speech-to-text model over OpenAI's transcription API.",
    )
    parser.add_argument("--model", default="nvidia/parakeet-tdt-0.6b-v2")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-name", default=None,
                        help="the name clients put in 'model' (default: --model)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--max-upload-mb", type=float,
                        default=DEFAULT_MAX_UPLOAD_BYTES / (1024 * 1024))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
    try:
        transcribe = load(args.model, args.device)
    except TranscriberUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    def serve(task_status: trio.TaskStatus[tuple[str, int]]) -> Awaitable[None]:
        return serve_transcriber(
            transcribe, served_name=args.served_name or args.model, host=args.host,
            port=args.port, max_upload_bytes=int(args.max_upload_mb * 1024 * 1024),
            task_status=task_status)

    return run_until_signalled(serve, log=log, event="parakeet_server.stopping")


if __name__ == "__main__":
    sys.exit(main())
