"""Context aggregation (CRCG, DRCG): documents concatenated into one prompt, decoded alone.

Words used here:
- *context layout*: `header + doc_1 + ... + doc_n + footer + question turn`, each piece
  tokenized on its own, so a *leading block* (`header + the first side's docs`) is a token
  prefix of the whole context. DRCG puts the cloud's documents first: its KV cache (the
  block's) can then be computed on the cloud and extended on the device, and the result is
  the same as prefilling the whole context locally (causal attention: a prefix's KV does not
  depend on what follows).
- *KV bytes*: a state as a safetensors file (`lm.save_state`), what DRCG/KV sends.
- *context generation*: plain autoregressive decoding of one row; greedy = argmax, else a
  draw from softmax(logits / T) with the position seed (seed, "context", position).

The template is DRAGON's (`tandem.protocols.dragon.prompt.RagPrompt`): its per-document
system turn, with all documents inside one turn instead of one turn per row.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from tandem.models.base import CausalLM, State
from tandem.protocols.decoding import OnToken, decode_steps
from tandem.protocols.dragon.config import DragonConfig
from tandem.protocols.dragon.prompt import RagPrompt


@dataclass(frozen=True)
class ContextLayout:
    block: list[int]  # header + leading docs (the part DRCG/KV receives as KV)
    rest: list[int]  # trailing docs + footer + question turn

    @property
    def ids(self) -> list[int]:
        return self.block + self.rest


def context_layout(
    tokenizer, leading_docs: list[str], trailing_docs: list[str], question: str
) -> ContextLayout:
    """The concatenated prompt; `leading_docs` form the KV-transferable block."""
    prompt = RagPrompt.for_tokenizer(tokenizer)
    if not leading_docs and not trailing_docs:
        question_ids = prompt.question_suffix(tokenizer, question)
        return ContextLayout(block=prompt.doc_prefix(tokenizer, None), rest=question_ids)
    header = prompt.doc_template.split("{doc}")[0]
    block = _encode(tokenizer, header) + _docs(tokenizer, leading_docs)
    return ContextLayout(block=block, rest=trailing_ids(tokenizer, trailing_docs, question))


def trailing_ids(tokenizer, trailing_docs: list[str], question: str) -> list[int]:
    """What follows the leading block: the trailing docs, the footer and the question turn."""
    prompt = RagPrompt.for_tokenizer(tokenizer)
    footer = prompt.doc_template.split("{doc}")[1]
    return (
        _docs(tokenizer, trailing_docs)
        + _encode(tokenizer, footer)
        + prompt.question_suffix(tokenizer, question)
    )


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text) if text else []


def _docs(tokenizer, docs: list[str]) -> list[int]:
    return [i for doc in docs for i in _encode(tokenizer, f"{doc}\n")]


def generate(
    lm: CausalLM, state: State, config: DragonConfig, *, on_token: OnToken | None = None
) -> list[int]:
    """Decode one row from a prefilled state until length or EOS; `on_token(token)` each."""
    eos = lm.tokenizer.eos_token_id if config.stop_at_eos else None
    tokens: list[int] = []
    steps = decode_steps(
        lm,
        state,
        seed=config.seed,
        temperature=0.0 if config.greedy else config.temperature,
        max_new_tokens=config.max_new_tokens,
        eos=eos,
        purpose="context",
    )
    for token in steps:
        tokens.append(token)
        if on_token is not None:
            on_token(token)
    return tokens


def block_state(lm: CausalLM, ids: list[int], kv_store=None) -> State:
    """The KV state of a leading block: from the side's `DocKVStore` when it has one."""
    if kv_store is not None and ids:
        state, _ = kv_store.get_or_prefill(ids)
        return state
    return lm.prefill(ids)


def prefill_context(lm: CausalLM, layout: ContextLayout, kv_store=None) -> State:
    """The whole context's state; the leading block from `kv_store` when the side has one
    (its documents' KV precomputed once, as DRAGON reuses each document's KV)."""
    if kv_store is None or not layout.block:
        return lm.prefill(layout.ids)
    state = block_state(lm, layout.block, kv_store)
    lm.decode(state, layout.rest)
    return state


def state_to_bytes(lm: CausalLM, state: State) -> bytes:
    """A state as safetensors bytes (the DRCG/KV payload)."""
    with tempfile.TemporaryDirectory(prefix="tandem-kv-") as folder:
        path = Path(folder) / "state.safetensors"
        lm.save_state(state, path)
        return path.read_bytes()


def state_from_bytes(lm: CausalLM, data: bytes) -> State:
    with tempfile.TemporaryDirectory(prefix="tandem-kv-") as folder:
        path = Path(folder) / "state.safetensors"
        path.write_bytes(data)
        return lm.load_state(path)
