"""Turning a token stream into text steps: UTF-8 reassembly and stop strings (sans-IO).

A real tokenizer's tokens are byte pieces: one character may span two tokens,
and a stop string may span several. :class:`TextAssembler` takes each token's
bytes and says what text may be sent now, holding back only what could still
turn out to be the start of a stop string, so a streamed answer never shows
text that the whole answer would not contain. The engine drives it; the HTTP
layer never sees bytes.

With ``trim`` the answer is also stripped of leading and trailing whitespace
(held back until more text follows it), which a chat answer needs when the
template leaves the model to write the space after "Assistant:".
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence

__all__ = ["TextAssembler"]


class TextAssembler:
    """The text of a generation so far, cut at the first stop string.

    ``feed(piece)`` returns the text to send for that token (possibly ``""``);
    once it reports :attr:`stopped`, the answer is over and later pieces are
    ignored. ``flush()`` returns what was held back when the answer ends for
    another reason (end of sequence, ``max_tokens``).
    """

    def __init__(self, stop: Sequence[str] = (), *, trim: bool = False) -> None:
        self._stops = tuple(s for s in stop if s)
        self._trim = trim
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._text = ""  # everything decoded so far
        self._sent = 0  # how much of it was returned (or dropped as leading space)
        self._lead = 0  # with trim: how much leading whitespace was dropped
        self.stopped = False

    def feed(self, piece: bytes) -> str:
        """Add one token's bytes; the text that can be sent now."""
        if self.stopped:
            return ""
        # Search from where a stop string could first have started in the new text.
        longest = max((len(s) for s in self._stops), default=0)
        search_from = max(0, len(self._text) - longest + 1)
        self._text += self._decoder.decode(piece)
        hits = [at for s in self._stops if (at := self._text.find(s, search_from)) >= 0]
        if hits:
            self.stopped = True
            return self._take(min(hits))
        return self._take(len(self._text) - self._held_back())

    def flush(self) -> str:
        """Everything not yet sent (the answer ended without a stop string)."""
        if self.stopped:
            return ""
        self._text += self._decoder.decode(b"", final=True)
        return self._take(len(self._text))

    @property
    def text(self) -> str:
        """All text sent so far."""
        return self._text[self._lead : self._sent]

    def _take(self, end: int) -> str:
        if self._trim:
            if self._sent == self._lead:  # nothing sent yet: skip leading whitespace
                head = self._text[self._sent :]
                self._lead = self._sent = self._sent + len(head) - len(head.lstrip())
            tail = self._text[self._sent : max(end, self._sent)]
            end = self._sent + len(tail.rstrip())  # trailing space waits for more text
        end = max(end, self._sent)
        out = self._text[self._sent : end]
        self._sent = end
        return out

    def _held_back(self) -> int:
        """Length of the longest tail of the text that begins some stop string."""
        best = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(self._text)), best, -1):
                if self._text.endswith(stop[:size]):
                    best = size
                    break
        return best
