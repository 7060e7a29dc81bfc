"""From committed token ids to the text a client sees: stop strings and streaming pieces.

Words used here:
- *stop string*: text that ends the answer; it is cut from the output (OpenAI's `stop`).
- *held back*: the tail of the text that could still become a stop string (or is an
  incomplete UTF-8 sequence); a stream sends it only once it is known not to be one.
- *finish reason* (OpenAI's): "stop" (eos or a stop string) or "length" (the token budget).
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"


def held_back(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest


def first_stop(text: str, stops: list[str]) -> int | None:
    """Index where the earliest stop string starts in `text`, or None."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


class TextTracker:
    """Feeds on token ids; gives the safe-to-send text pieces; knows when and why to stop."""

    def __init__(self, tokenizer, *, eos_id: int | None, stops: list[str], limit: int) -> None:
        self.tokenizer = tokenizer
        self.eos_id = eos_id
        self.stops = [s for s in stops if s]
        self.limit = limit
        self.tokens: list[int] = []  # every counted token (eos included)
        self._text_ids: list[int] = []
        self.text = ""  # the answer so far (cut at a stop string)
        self.sent = 0  # characters of `text` already handed out
        self.finish: str | None = None  # set once the answer is complete
        self.cut = False  # a stop string ended it (the backend should stop now)

    @property
    def done(self) -> bool:
        return self.finish is not None

    def push(self, token: int) -> str:
        """Take one token; return the new text that is safe to send (maybe "")."""
        if self.done:
            return ""
        self.tokens.append(token)
        if token == self.eos_id:
            self.finish = "stop"
            return self.flush()
        self._text_ids.append(token)
        text = self.tokenizer.decode(self._text_ids)
        cut = first_stop(text, self.stops)
        if cut is not None:
            self.text, self.finish, self.cut = text[:cut], "stop", True
            return self.flush()
        if len(self.tokens) >= self.limit:
            self.text, self.finish = text, "length"
            return self.flush()
        safe = text.rstrip(REPLACEMENT)  # an incomplete multi-byte character: wait
        safe = safe[: len(safe) - held_back(safe, self.stops)]
        self.text = text
        piece = safe[self.sent :] if len(safe) > self.sent else ""
        self.sent = max(self.sent, len(safe))
        return piece

    def flush(self) -> str:
        """Everything not sent yet (the answer is over)."""
        piece = self.text[self.sent :] if len(self.text) > self.sent else ""
        self.sent = max(self.sent, len(self.text))
        return piece

    def close(self, backend_finish: str) -> str:
        """The backend returned: settle the finish reason; return the unsent rest."""
        if self.finish is None:
            self.finish = "stop" if backend_finish in ("eos", "stop") else "length"
        return self.flush()
