"""The Parakeet server's HTTP layer and audio decoding, with an injected transcriber.

NeMo cannot be installed here (no GPU), so the transcriber is a function the
test passes in: the seam :func:`create_app` offers. Everything between the
socket and that function is the real server.
"""

from __future__ import annotations

import io
import math
import struct
import wave

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.inference.runtimes.parakeet_server import (
    Audio,
    AudioError,
    TranscriberUnavailable,
    create_app,
    decode_audio,
    decode_wav,
    load_nemo_transcriber,
    main,
)


def wav_bytes(samples: list[int], *, rate: int = 16_000, channels: int = 1,
              width: int = 2) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as writer:
        writer.setnchannels(channels)
        writer.setsampwidth(width)
        writer.setframerate(rate)
        if width == 1:
            writer.writeframes(bytes(s + 128 for s in samples))
        elif width == 3:
            writer.writeframes(b"".join(s.to_bytes(3, "little", signed=True) for s in samples))
        else:
            fmt = {2: "h", 4: "i"}[width]
            writer.writeframes(struct.pack(f"<{len(samples)}{fmt}", *samples))
    return out.getvalue()


class Recorder:
    """A transcriber that says what it was given, so the test sees the decoded clip."""

    def __init__(self) -> None:
        self.clips: list[Audio] = []

    def __call__(self, audio: Audio) -> str:
        self.clips.append(audio)
        return f"{len(audio.samples)} samples at {audio.sample_rate} Hz"


def client_for(transcribe, **options) -> httpx.AsyncClient:
    app = create_app(transcribe, served_name="parakeet", **options)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://parakeet")


async def test_health_and_models_answer() -> None:
    async with client_for(Recorder()) as client:
        health = await client.get("/health")
        assert health.status_code == 200 and health.content == b""
        models = (await client.get("/v1/models")).json()
        assert [card["id"] for card in models["data"]] == ["parakeet"]


async def test_a_wav_is_transcribed_and_metered_in_whole_audio_seconds() -> None:
    recorder = Recorder()
    clip = wav_bytes([1000, -1000] * 20_000, rate=16_000)  # 40 000 samples = 2.5 s
    async with client_for(recorder) as client:
        response = await client.post(
            "/v1/audio/transcriptions",
            data={"model": "parakeet", "language": "en", "temperature": "0"},
            files={"file": ("clip.wav", clip, "audio/wav")},
        )
    assert response.status_code == 200, response.text
    assert response.json() == {"text": "40000 samples at 16000 Hz",
                               "usage": {"type": "duration", "seconds": 3}}
    (audio,) = recorder.clips
    assert audio.seconds == 2.5
    assert audio.samples[0] == pytest.approx(1000 / 32768) and audio.samples[1] < 0


async def test_text_format_answers_the_bare_transcript() -> None:
    async with client_for(lambda audio: "hello world") as client:
        response = await client.post(
            "/v1/audio/transcriptions",
            data={"model": "parakeet", "response_format": "text"},
            files={"file": ("a.wav", wav_bytes([0] * 160), "audio/wav")},
        )
    assert response.status_code == 200 and response.text == "hello world"


async def test_a_wav_without_frames_is_empty_text_and_zero_seconds() -> None:
    recorder = Recorder()
    async with client_for(recorder) as client:
        response = await client.post("/v1/audio/transcriptions", data={"model": "parakeet"},
                                     files={"file": ("a.wav", wav_bytes([]), "audio/wav")})
    assert response.json() == {"text": "", "usage": {"type": "duration", "seconds": 0}}
    assert recorder.clips == []


@pytest.mark.parametrize(
    ("data", "files", "status", "param"),
    [({"model": "whisper"}, True, 404, "model"),
     ({}, True, 400, "model"),
     ({"model": "parakeet"}, False, 400, "file"),
     ({"model": "parakeet", "response_format": "srt"}, True, 400, "response_format"),
     ({"model": "parakeet", "stream": "true"}, True, 400, "stream")],
)
async def test_bad_requests_get_openai_errors(data, files, status, param) -> None:
    upload = {"file": ("a.wav", wav_bytes([0] * 160), "audio/wav")} if files else None
    async with client_for(Recorder()) as client:
        response = await client.post("/v1/audio/transcriptions", data=data, files=upload)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["param"] == param and error["code"] == status and error["message"]


async def test_undecodable_audio_is_a_400_naming_the_file() -> None:
    async with client_for(Recorder()) as client:
        for payload in (b"", b"RIFF\x00\x00\x00\x00WAVEjunk", b"ID3\x03 an mp3, maybe"):
            response = await client.post("/v1/audio/transcriptions", data={"model": "parakeet"},
                                         files={"file": ("x", payload, "audio/mpeg")})
            assert response.status_code == 400, payload
            assert response.json()["error"]["param"] == "file"


async def test_a_file_over_the_limit_is_a_413() -> None:
    async with client_for(Recorder(), max_upload_bytes=1000) as client:
        response = await client.post("/v1/audio/transcriptions", data={"model": "parakeet"},
                                     files={"file": ("a.wav", wav_bytes([0] * 1000), "audio/wav")})
        assert response.status_code == 413
        # Declared far over the bound: refused from the Content-Length alone.
        big = wav_bytes([0] * 50_000)
        response = await client.post("/v1/audio/transcriptions", data={"model": "parakeet"},
                                     files={"file": ("a.wav", big, "audio/wav")})
        assert response.status_code == 413 and response.json()["error"]["param"] == "file"


async def test_a_chunked_body_over_the_limit_is_a_413_before_it_is_read_whole() -> None:
    """No length declared: it used to be spooled whole before the file was measured."""
    sent = 0

    async def endless():
        nonlocal sent
        yield (b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n"
               b"Content-Type: audio/wav\r\n\r\n")
        while True:
            sent += 1
            yield b"\0" * 65536

    async with client_for(Recorder(), max_upload_bytes=100_000) as client:
        response = await client.post("/v1/audio/transcriptions", content=endless(),
                                     headers={"content-type": "multipart/form-data; boundary=b"})
    assert response.status_code == 413 and response.json()["error"]["param"] == "file"
    assert sent <= 4  # 100 kB plus the form's 64 KiB of slack, not the stream's end


async def test_a_failing_model_is_a_500_and_the_server_stays_up() -> None:
    def broken(audio: Audio) -> str:
        raise ValueError("CUDA out of memory")

    async with client_for(broken) as client:
        response = await client.post("/v1/audio/transcriptions", data={"model": "parakeet"},
                                     files={"file": ("a.wav", wav_bytes([0] * 16), "audio/wav")})
        assert response.status_code == 500
        assert "CUDA out of memory" in response.json()["error"]["message"]
        assert (await client.get("/health")).status_code == 200


@pytest.mark.parametrize("width", [1, 2, 3, 4])
def test_wav_widths_decode_to_the_same_mono_floats(width: int) -> None:
    full = (1 << (8 * width - 1)) // 2  # half scale
    audio = decode_wav(wav_bytes([full, -full, 0, full], rate=8000, channels=2, width=width))
    assert audio.sample_rate == 8000 and len(audio.samples) == 2
    assert list(audio.samples) == pytest.approx([0.0, 0.25], abs=1e-2)
    assert math.isclose(audio.seconds, 2 / 8000)


@given(st.binary(max_size=2000))
def test_decoding_arbitrary_bytes_gives_audio_or_an_audio_error(data: bytes) -> None:
    for blob in (data, b"RIFF" + data[:4] + b"WAVE" + data[4:]):
        try:
            audio = decode_audio(blob)
        except AudioError:
            continue
        assert audio.sample_rate > 0
        assert all(-1.0 <= sample <= 1.0 for sample in audio.samples)


def test_without_nemo_the_loader_names_the_pip_package() -> None:
    with pytest.raises(TranscriberUnavailable, match=r"nemo_toolkit\[asr\]"):
        load_nemo_transcriber("nvidia/parakeet-tdt-0.6b-v2", "cpu")


def test_main_exits_2_when_the_model_cannot_load(capsys) -> None:
    def unavailable(model: str, device: str):
        raise TranscriberUnavailable(f"{model} on {device}: no")

    assert main(["--model", "m", "--device", "cpu", "--port", "0"], load=unavailable) == 2
    assert "error: m on cpu: no" in capsys.readouterr().err


def test_main_with_its_own_loader_says_what_to_install(capsys) -> None:
    # In this process: the module runs as a process, with the plan's own argv, in
    # runtimes/test_plan_processes.py (test_parakeet_plan_without_nemo_exits_2...).
    assert main(["--port", "0", "--device", "cpu"]) == 2
    assert "pip install 'nemo_toolkit[asr]'" in capsys.readouterr().err
