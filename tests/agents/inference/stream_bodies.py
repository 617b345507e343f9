"""Request bodies in every shape JSON allows for ``stream``, and how the model servers read
them: the strategies and oracles of the tests of streams billed 0."""

from __future__ import annotations

import json

from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
CONTENT_TYPES = ["application/json", "text/plain", "Application/JSON",
                 "application/json; charset=utf-8", ""]
TRUTH_WORDS = ["true", "false", "1", "0", "yes", "no", "on", "off", "t", "f", "y", "n",
               "maybe", "", " true", "2"]


def _cases(word: str) -> st.SearchStrategy[str]:
    return st.lists(st.booleans(), min_size=len(word), max_size=len(word)).map(
        lambda upper: "".join(c.upper() if u else c for c, u in zip(word, upper, strict=True)))


JSON_VALUES = st.one_of(
    st.booleans(), st.none(), st.integers(-2, 3), st.sampled_from([0.0, 1.0, 0.5, -0.0]),
    st.sampled_from(TRUTH_WORDS).flatmap(_cases), st.just([]), st.just({}), st.just([True]))


@st.composite
def raw_key(draw, name: str) -> str:
    """``name`` as a JSON string, any of its characters written as a \\u escape."""
    escaped = draw(st.lists(st.booleans(), min_size=len(name), max_size=len(name)))
    return '"' + "".join(f"\\u{ord(c):04x}" if e else c
                         for c, e in zip(name, escaped, strict=True)) + '"'


#: The fields of a request other than ``stream``, by path.
FIELDS = {CHAT: ['"model":"m"', '"messages":[{"role":"user","content":"hi"}]',
                 '"temperature":0'],
          COMPLETIONS: ['"model":"m"', '"prompt":"Once upon a time"', '"max_tokens":12']}


@st.composite
def request_bodies(draw, path: str) -> bytes:
    """Bodies of ``path`` with ``stream`` (and ``stream_options``) in any shape JSON allows:
    escaped keys, repeated keys (the last wins), any value, any encoding."""
    members = list(FIELDS[path])
    for _ in range(draw(st.integers(1, 3))):
        members.append(f"{draw(raw_key('stream'))}:{json.dumps(draw(JSON_VALUES))}")
    options = draw(st.one_of(st.none(), st.just("absent"),
                             st.dictionaries(st.just("include_usage"), JSON_VALUES),
                             JSON_VALUES))
    if options != "absent":
        members.append(f'"stream_options":{json.dumps(options)}')
    order = draw(st.permutations(members))
    space = draw(st.sampled_from(["", " ", "\n\t"]))
    text = "{" + space + ("," + space).join(order) + space + "}"
    return text.encode(draw(st.sampled_from(["utf-8", "utf-16", "utf-32", "utf-16-le"])))


class VllmStreamOptions(BaseModel):
    """vLLM's ``StreamOptions`` (vllm/entrypoints/openai/protocol.py), lax as vLLM's."""

    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class VllmFields(BaseModel):
    """The stream fields of vLLM's ``ChatCompletionRequest``."""

    stream: bool | None = False
    stream_options: VllmStreamOptions | None = None


def server_reads(model: type[BaseModel], body: bytes) -> bool | None:
    """Whether a server reading ``body`` with ``json.loads`` and ``model`` streams it;
    None if it refuses the body."""
    try:
        return bool(model.model_validate(json.loads(body)).stream)
    except ValidationError:
        return None


