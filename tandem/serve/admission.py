"""Admission control of the cloud: which new sessions it accepts, and the refusal it gives.

Words used here:
- *limits*: `CloudLimits` (max_sessions, max_context, max_queued_tokens), the flags of
  `tandem cloud serve`.
- *context tokens*: what a session will hold in the cloud's KV cache at most: prompt tokens
  plus the tokens it asks to generate (`max_new_tokens` of a spec / ar start message).
- *refusal*: `Refusal(reason, message)`; `reason` is the limit's name (a metrics label, a
  log field), `message` the one line the device shows, naming the limit and its value.

Checked once per session, when its first message arrives (a session already admitted is
never dropped for load): the session count, the context it asks for, and the verification
tokens already waiting in the batcher (a busy cloud sheds new sessions, not running ones).
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.transport import Message, Start, control


@dataclass(frozen=True, kw_only=True)
class CloudLimits:
    max_sessions: int = 64  # sessions open at once
    max_context: int = 32768  # prompt + generation tokens per session
    max_queued_tokens: int = 4096  # verification tokens waiting in the batcher

    def __post_init__(self) -> None:
        for name in ("max_sessions", "max_context", "max_queued_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")


@dataclass(frozen=True)
class Refusal:
    reason: str  # the limit's name: max_sessions, max_context, max_queued_tokens
    message: str


def context_tokens(first: Message) -> int:
    """Prompt + requested new tokens of a session's first message (prompt only if unknown)."""
    prompt = len(getattr(first, "tokens", ()) or ())
    if not isinstance(first, Start):
        return prompt
    try:
        config = dict(control.body(first).get("config", {}))
        return prompt + max(0, int(config.get("max_new_tokens", 0)))
    except (ValueError, TypeError):
        return prompt


def admit(
    limits: CloudLimits, *, open_sessions: int, queued_tokens: int, context: int
) -> Refusal | None:
    """None to accept a new session, else why not (pure)."""
    if open_sessions >= limits.max_sessions:
        return Refusal(
            "max_sessions",
            f"cloud full: {open_sessions} sessions (max_sessions {limits.max_sessions})",
        )
    if context > limits.max_context:
        return Refusal(
            "max_context",
            f"context too long: {context} tokens (prompt + new) > max_context {limits.max_context}",
        )
    if queued_tokens > limits.max_queued_tokens:
        return Refusal(
            "max_queued_tokens",
            f"cloud busy: {queued_tokens} verification tokens queued "
            f"(max_queued_tokens {limits.max_queued_tokens})",
        )
    return None
