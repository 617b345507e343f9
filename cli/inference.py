"""``cosmicac inference chat|complete|embed|transcribe``: the OpenAI-compatible API.

proxy-inference serves it behind the entry point at ``<server>/inference/v1``
(the server as for every command: ``--server``, ``$COSMICAC_SERVER``, the
session's). Requests carry an inference **API key** as their bearer, never the
session token:

1. ``--api-key`` or ``$COSMICAC_API_KEY``, as given;
2. else the CLI's own key for this server, kept in
   ``<config dir>/inference-key.json`` (mode 0600, written atomically, one
   entry per server and user);
3. else, when logged in, the CLI creates that key through app-node
   (``POST /api/apikeys {"name": "cosmicac-cli <hostname>"}``; it bills to the
   team active at that moment) and keeps it.

A key just created may be refused (401) for a moment, until the shared
database brings it to proxy-inference: the request is retried for up to
:data:`FRESH_KEY_WAIT_S`. When the *kept* key is refused (someone revoked
it), the CLI says so, forgets it and creates one new key, once: the session
is the real credential (whoever holds it may create keys anyway), and a
script should not stop because a key it never saw was revoked. To stop this
machine from using the API, log out (which also stops it creating keys).

Streaming (the default of ``chat`` and ``complete``): the request asks for
Server-Sent Events and each token is written to stdout as its event arrives;
a newline ends the answer. ``--no-stream`` asks for the whole answer.
``-o json`` prints the proxy's whole (non-streamed) response, the OpenAI
object with its ``usage``, as one JSON document: a script gets one thing to
parse. Ctrl-C stops a stream cleanly (the connection is closed, so the model
stops generating) and exits 130.

Errors come in OpenAI's shape, ``{"error": {"message", "type", "code"}}``
(the entry point's add ``service``), and print as one line. Exit codes:

- 0 done;
- 1 refused: the API key (401; a key given with --api-key is never
  replaced), the model not served (404 ``model_not_found``: see ``cosmicac
  jobs list``), no healthy replica (503), rate limited, the model server
  failed (also midway through a stream);
- 2 usage, or a request the server found invalid (400, 413, 422);
- 3 no API key and not logged in (or the session expired), so none can be made;
- 4 the server unreachable, or proxy-inference behind the entry point
  (502 ``UPSTREAM_UNREACHABLE``, 504);
- 130 interrupted (Ctrl-C); 141 stdout closed early (``| head``).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import httpx
import typer
from pydantic import BaseModel, ValidationError

from ._completion import served_names
from ._config import config_dir, write_private
from ._console import err, fail, print_json
from .session import (
    NOT_LOGGED_IN,
    REFUSED,
    UNREACHABLE,
    USAGE,
    Api,
    check_output,
    emit,
    load_session,
    output_option,
    server_option,
    server_url,
)

__all__ = ["FRESH_KEY_WAIT_S", "KEY_FILE", "ProxyError", "app", "cli_key_id", "forget_cli_key",
           "sse_data"]

KEY_FILE = "inference-key.json"
#: How long a key the CLI just created may be refused before it is believed:
#: the time the shared database takes to bring it to proxy-inference
#: (milliseconds on one machine; seconds across a busy deployment).
FRESH_KEY_WAIT_S = 15.0
INTERRUPTED = 130
#: No read timeout: a big model may think for minutes before its first token.
_TIMEOUT = httpx.Timeout(None, connect=10.0)
_EXIT_HELP = ("Exit codes: 0 done, 1 refused (API key, model not served, no healthy "
              "replica), 2 usage or invalid request, 3 no API key and not logged in, "
              "4 server unreachable, 130 interrupted.")

app = typer.Typer(help=f"Chat, completions, embeddings and transcriptions through the "
                       f"OpenAI-compatible API (<server>/inference/v1). {_EXIT_HELP}",
                  no_args_is_help=True)


class ProxyError(Exception):
    """An OpenAI-shaped error answer: status, stable ``code``, ``message`` to show."""

    def __init__(self, status: int, code: str, message: str, type_: str = "") -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.type = status, code, message, type_

    @classmethod
    def of(cls, status: int, body: bytes, reason: str = "") -> ProxyError:
        try:
            error = json.loads(body)["error"]
            return cls(status, str(error.get("code") or error.get("type") or status),
                       str(error.get("message") or reason), str(error.get("type") or ""))
        except (ValueError, KeyError, TypeError, AttributeError):
            return cls(status, str(status), reason or "error")


# -- the CLI's own key ------------------------------------------------------------


class _SavedKey(BaseModel):
    id: str
    key: str
    name: str
    #: Who created it (a key bills to its creator's team): another user's
    #: session on the same server gets a key of its own.
    email: str


class _KeyFile(BaseModel):
    keys: dict[str, _SavedKey] = {}


def _key_path() -> Path:
    return config_dir(None) / KEY_FILE


def _read_keys() -> _KeyFile:
    try:
        return _KeyFile.model_validate_json(_key_path().read_bytes())
    except (OSError, ValidationError, ValueError):
        return _KeyFile()


def _write_keys(keys: _KeyFile) -> None:
    write_private(_key_path(), keys.model_dump_json())


def cli_key_id(server: str) -> str | None:
    """The id of the key the CLI made for itself on ``server``, if it keeps one."""
    saved = _read_keys().keys.get(server)
    return None if saved is None else saved.id


def forget_cli_key(server: str) -> None:
    """Drop the CLI's own key for ``server`` from the key file (logout)."""
    keys = _read_keys()
    if keys.keys.pop(server, None) is not None:
        _write_keys(keys)


@dataclass
class _Key:
    secret: str
    #: "given" (--api-key / env), "saved" (kept from an earlier run), "created" (now).
    source: str
    created_at: float = 0.0


class _Keys:
    """Which key a request carries, and what to do when it is refused."""

    def __init__(self, server: str, given: str | None) -> None:
        self.server, self.given = server, given
        self.renewed = False

    def current(self) -> _Key:
        if self.given:
            return _Key(self.given, "given")
        session = load_session()
        saved = _read_keys().keys.get(self.server)
        if saved is not None and (session is None or session.email == saved.email):
            return _Key(saved.key, "saved")
        return self._create()

    def _session_api(self, why: str) -> tuple[Api, str]:
        session = load_session()
        if session is None or session.expires_at <= time.time():
            state = "not logged in" if session is None else "the session expired"
            fail(f"{why}, and {state}: pass --api-key KEY (or set COSMICAC_API_KEY; "
                 f"`cosmicac apikeys create` makes one), or run `cosmicac login` so the CLI "
                 f"creates its own", code=NOT_LOGGED_IN)
        return Api(self.server, session.token), session.email

    def _create(self, why: str = "no API key given") -> _Key:
        api, email = self._session_api(why)
        name = f"cosmicac-cli {socket.gethostname()}"[:100]
        created = api.post("/apikeys", {"name": name})
        keys = _read_keys()
        keys.keys[self.server] = _SavedKey(id=created["id"], key=created["key"], name=name,
                                           email=email)
        _write_keys(keys)
        err.print(f"created API key {created['id']} ({name}) for the CLI; kept in "
                  f"{_key_path()}")
        return _Key(created["key"], "created", time.monotonic())

    def refused(self, key: _Key, error: ProxyError) -> _Key | None:
        """The key to retry with after a 401, or None to give up (the caller fails)."""
        if key.source == "created" and time.monotonic() - key.created_at < FRESH_KEY_WAIT_S:
            time.sleep(min(0.1 * 2 ** int((time.monotonic() - key.created_at) * 2), 1.0))
            return key
        if key.source == "saved" and not self.renewed:
            self.renewed = True
            keys = _read_keys()
            old = keys.keys.pop(self.server, None)
            _write_keys(keys)
            err.print(f"the CLI's API key {old.id if old else ''} was refused ({error.message}); "
                      f"creating a new one")
            return self._create("the CLI's API key was refused")
        return None


# -- requests ---------------------------------------------------------------------


@dataclass
class _Proxy:
    base: str
    keys: _Keys

    def open(self, client: httpx.Client, path: str, *, json_body: Any = None,
             files: Callable[[], dict] | None = None, data: dict | None = None
             ) -> httpx.Response:
        """The successful (streaming) response to POST ``path``; else fail with its error."""
        key = self.keys.current()
        for _ in range(200):  # bounded: the fresh-key wait is bounded in time too
            request = client.build_request(
                "POST", f"{self.base}{path}", json=json_body, data=data,
                files=files() if files is not None else None,
                headers={"authorization": f"Bearer {key.secret}"})
            try:
                response = client.send(request, stream=True)
            except httpx.TransportError as exc:
                fail(f"cannot reach the inference API at {self.base}: "
                     f"{exc or type(exc).__name__}", code=UNREACHABLE)
            if response.is_success:
                return response
            body = response.read()
            response.close()
            error = ProxyError.of(response.status_code, body, response.reason_phrase)
            if response.status_code == 401 and (retry := self.keys.refused(key, error)):
                key = retry
                continue
            _fail(error, key)
        _fail(ProxyError(401, "invalid_api_key", "the API key stayed refused"), key)


def _fail(error: ProxyError, key: _Key | None = None) -> NoReturn:
    text = f"{error.message} ({error.code})"
    if error.status == 401:
        hint = {"given": "check --api-key / COSMICAC_API_KEY (`cosmicac apikeys list`)",
                "created": "the key the CLI just created is not known to the inference "
                           "API; is proxy-inference connected to the shared database?"}
        fail(f"the API key was refused: {text}; "
             f"{hint.get(key.source if key else '', 'run `cosmicac login` and try again')}",
             code=REFUSED)
    if error.code == "model_not_found":
        fail(f"{text}: see the served names with `cosmicac models list` or "
             f"`cosmicac jobs list`", code=REFUSED)
    if error.status in (400, 413, 422):
        fail(text, code=USAGE)
    if error.code in ("UPSTREAM_UNREACHABLE", "UPSTREAM_TIMEOUT") or error.status == 504:
        fail(f"the inference API is unreachable: {text}", code=UNREACHABLE)
    fail(text, code=REFUSED)


def sse_data(lines: Iterable[str]) -> Iterator[str]:
    """The ``data`` of each Server-Sent Event in ``lines`` (one event's data lines
    joined by newlines, as the SSE spec says); comments and other fields ignored."""
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        field, _, value = line.partition(":")
        if field == "data":
            data.append(value.removeprefix(" "))
    if data:
        yield "\n".join(data)


def _stream_text(response: httpx.Response, text_of: Callable[[dict], str]) -> None:
    """Write each event's text to stdout as it arrives; a newline at the end."""
    wrote = False
    try:
        for data in sse_data(response.iter_lines()):
            if data == "[DONE]":
                break
            try:
                event = json.loads(data)
            except ValueError:
                continue
            if isinstance(event, dict) and "error" in event:
                if wrote:
                    sys.stdout.write("\n")
                    sys.stdout.flush()
                _fail(ProxyError.of(502, data.encode()))
            piece = text_of(event) if isinstance(event, dict) else ""
            if piece:
                sys.stdout.write(piece)
                sys.stdout.flush()
                wrote = True
    except httpx.TransportError as exc:
        sys.stdout.write("\n")
        sys.stdout.flush()
        fail(f"the answer broke off: {exc or type(exc).__name__}", code=REFUSED)
    sys.stdout.write("\n")
    sys.stdout.flush()


def _first_choice(event: dict, *path: str) -> str:
    choices = event.get("choices")
    value: Any = choices[0] if isinstance(choices, list) and choices else None
    for part in path:
        value = value.get(part) if isinstance(value, dict) else None
    return value if isinstance(value, str) else ""


def _run(server: str | None, api_key: str | None, work: Callable[[_Proxy, httpx.Client], None]
         ) -> None:
    """Resolve server and key, then ``work``; Ctrl-C exits 130, a closed stdout 141."""
    base = server_url(server, load_session())
    base = base.removesuffix("/inference/v1").removesuffix("/inference")
    proxy = _Proxy(f"{base}/inference/v1", _Keys(base, api_key))
    try:
        with httpx.Client(timeout=_TIMEOUT) as client:
            work(proxy, client)
    except KeyboardInterrupt:
        # The with-block closed the connection: the model stops generating.
        sys.stdout.write("\n")
        sys.stdout.flush()
        raise typer.Exit(INTERRUPTED) from None
    except BrokenPipeError:
        # The reader went away (`| head`): as a shell reports SIGPIPE.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(128 + 13) from None


def _prompt(text: str) -> str:
    if text == "-":
        text = sys.stdin.read()
    if not text.strip():
        fail("the prompt is empty", code=USAGE)
    return text


def _generate(server: str | None, api_key: str | None, output: str, stream: bool,
              path: str, body: dict, text_of: Callable[[dict], str],
              answer_of: Callable[[dict], str]) -> None:
    check_output(output)
    streamed = stream and output == "table"
    body = {**body, "stream": streamed}

    def work(proxy: _Proxy, client: httpx.Client) -> None:
        with closing(proxy.open(client, path, json_body=body)) as response:
            if streamed:
                _stream_text(response, text_of)
                return
            answer = _json(response)
        if output == "json":
            print_json(answer)
        else:
            sys.stdout.write(answer_of(answer) + "\n")
            sys.stdout.flush()

    _run(server, api_key, work)


def _json(response: httpx.Response) -> dict:
    try:
        answer = json.loads(response.read())
    except ValueError:
        fail("the inference API answered with something other than JSON", code=REFUSED)
    if not isinstance(answer, dict):
        fail("the inference API answered with something other than a JSON object",
             code=REFUSED)
    return answer


# -- commands ---------------------------------------------------------------------


def _model_option() -> Any:
    return typer.Option(..., "--model", "-m", help="The served name (`cosmicac jobs list`).",
                        autocompletion=served_names)


def _key_option() -> Any:
    return typer.Option(None, "--api-key", envvar="COSMICAC_API_KEY",
                        help="An inference API key; default: the CLI's own (created at "
                             "first use when logged in).")


def _common(body: dict, max_tokens: int | None, temperature: float | None) -> dict:
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if temperature is not None:
        body["temperature"] = temperature
    return body


_MAX_TOKENS = typer.Option(None, "--max-tokens", min=1, help="Most tokens to generate.")
_TEMPERATURE = typer.Option(None, "--temperature", min=0.0, max=2.0,
                            help="Sampling temperature, 0 to 2.")
_NO_STREAM = typer.Option(False, "--no-stream", help="Wait for the whole answer.")


@app.command("chat")
def chat(prompt: str = typer.Argument(..., help="What to ask; - reads it from stdin."),
         model: str = _model_option(),
         system: str | None = typer.Option(None, "--system", "-s", help="A system message."),
         max_tokens: int | None = _MAX_TOKENS, temperature: float | None = _TEMPERATURE,
         no_stream: bool = _NO_STREAM, api_key: str | None = _key_option(),
         server: str | None = server_option(), output: str = output_option()) -> None:
    """Ask a chat model; the answer streams to stdout as it is generated.

    -o json prints the whole response (with its usage) instead, not streamed.

    Example: cosmicac inference chat --model demo "Say hi"

    Example: echo "Say hi" | cosmicac inference chat --model demo - -o json
    """
    messages = ([{"role": "system", "content": system}] if system else [])
    messages.append({"role": "user", "content": _prompt(prompt)})
    _generate(server, api_key, output, not no_stream, "/chat/completions",
              _common({"model": model, "messages": messages}, max_tokens, temperature),
              lambda e: _first_choice(e, "delta", "content"),
              lambda a: _first_choice(a, "message", "content"))


@app.command("complete")
def complete(prompt: str = typer.Argument(..., help="The text to continue; - reads stdin."),
             model: str = _model_option(),
             max_tokens: int | None = _MAX_TOKENS, temperature: float | None = _TEMPERATURE,
             no_stream: bool = _NO_STREAM, api_key: str | None = _key_option(),
             server: str | None = server_option(), output: str = output_option()) -> None:
    """Continue a text (the completions API); streams like chat.

    Example: cosmicac inference complete --model demo "Once upon a time"
    """
    _generate(server, api_key, output, not no_stream, "/completions",
              _common({"model": model, "prompt": _prompt(prompt)}, max_tokens, temperature),
              lambda e: _first_choice(e, "text"), lambda a: _first_choice(a, "text"))


@app.command("embed")
def embed(texts: list[str] = typer.Argument(..., help="Texts to embed; - reads one from "
                                                      "stdin."),
          model: str = _model_option(), api_key: str | None = _key_option(),
          server: str | None = server_option(), output: str = output_option()) -> None:
    """Embed texts: a table of each vector's size and first values, or with
    -o json the whole response (``data[i].embedding``, ``usage``).

    Example: cosmicac inference embed --model minilm "a cat" "a dog" -o json
    """
    check_output(output)
    inputs = [_prompt(text) for text in texts]

    def work(proxy: _Proxy, client: httpx.Client) -> None:
        with closing(proxy.open(client, "/embeddings", json_body={
                "model": model, "input": inputs, "encoding_format": "float"})) as response:
            answer = _json(response)
        rows = []
        for item in answer.get("data") or []:
            vector = item.get("embedding") if isinstance(item, dict) else None
            if isinstance(vector, list):
                rows.append((item.get("index"), len(vector),
                             ", ".join(f"{v:.4f}" for v in vector[:4]
                                       if isinstance(v, int | float))
                             + (", …" if len(vector) > 4 else "")))
        emit(output, answer, ("index", "dims", "first values"), rows)

    _run(server, api_key, work)


@app.command("transcribe")
def transcribe(file: Path = typer.Argument(..., help="The audio file (WAV, FLAC, MP3...); "
                                                      "- reads stdin."),
               model: str = _model_option(),
               language: str | None = typer.Option(None, "--language",
                                                   help="The audio's language (ISO-639-1)."),
               api_key: str | None = _key_option(),
               server: str | None = server_option(), output: str = output_option()) -> None:
    """Transcribe speech to text; -o json prints the whole response.

    Example: cosmicac inference transcribe talk.wav --model parakeet
    """
    check_output(output)
    if str(file) == "-":
        audio, name = sys.stdin.buffer.read(), "audio.wav"
    else:
        try:
            audio, name = file.read_bytes(), file.name
        except OSError as exc:
            fail(f"cannot read {file}: {exc.strerror or exc}", code=USAGE)
    data = {"model": model, "response_format": "json"}
    if language:
        data["language"] = language

    def work(proxy: _Proxy, client: httpx.Client) -> None:
        with closing(proxy.open(client, "/audio/transcriptions", data=data,
                        files=lambda: {"file": (name, audio, "application/octet-stream")}
                        )) as response:
            answer = _json(response)
        if output == "json":
            print_json(answer)
        else:
            sys.stdout.write(str(answer.get("text", "")) + "\n")
            sys.stdout.flush()

    _run(server, api_key, work)
