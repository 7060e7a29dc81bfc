"""RAPID's drafter: proposes gamma tokens and the law each was drawn from (the decoding core's
`Drafter`, `tandem.protocols.decoding`).

Words used here:
- *draft law* (draft_probs): the distribution a draft token was sampled from. When a codec is
  given it is the codec's transmitted law (the law the verifier will see), never the raw one,
  so verification stays exact (QS principle, DESIGN errata 2).
- *bonus row*: the drafter's law after its last draft token (gamma + 1 rows); RAPID's exact
  mode needs it so that the bonus token also follows p_hat.
- *fed*: a token already in the drafter's KV cache. After a round, rejected drafts are rolled
  back and the accepted ones not yet fed, plus the next token, are fed at the next round.
- draws: the token at output position p is drawn with the generator of (seed, "draft", p)
  (`tandem.sampling.seeds`), on the device of a split run as in the local loop.
"""

from __future__ import annotations

import torch

from tandem.codecs import Codec
from tandem.models.base import CausalLM, State
from tandem.sampling.seeds import sample_at
from tandem.sampling.warp import warp


class ModelDrafter:
    """An LM drafting on its own prompt (the RAG drafter reads C^S; see also StreamingDrafter)."""

    def __init__(
        self,
        lm: CausalLM,
        state: State,
        *,
        seed: int,
        temperature: float,
        bonus_row: bool = False,
        codec: Codec | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
    ):
        self.lm, self.state, self.seed = lm, state, seed
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.bonus_row, self.codec = bonus_row, codec
        self.unfed: list[int] = []
        self.fed_drafts = 0
        self.drafts: list[int] = []

    def law(self, logits: torch.Tensor) -> torch.Tensor:  # [vocab] -> [vocab] draft law
        probs = warp(logits, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)
        return self.codec.transmitted_probs(probs) if self.codec is not None else probs

    def _feed(self, ids: list[int]) -> torch.Tensor:  # next-token logits [vocab]
        return self.lm.decode(self.state, [ids])[0, -1]

    def before_round(self) -> None:
        """Hook for drafters that manage their cache (StreamingDrafter compresses it here)."""

    def propose(self, gamma: int, position: int) -> tuple[list[int], torch.Tensor]:
        self.before_round()
        logits = self._feed(self.unfed) if self.unfed else self.state.logits[0]
        tokens, rows = [], []
        for i in range(gamma):
            probs = self.law(logits)
            token = sample_at(probs, self.seed, "draft", position + i)
            tokens.append(token)
            rows.append(probs)
            if i + 1 < gamma or self.bonus_row:
                logits = self._feed([token])
        if self.bonus_row:
            rows.append(self.law(logits))
        self.unfed = []
        self.drafts = tokens
        self.fed_drafts = gamma if self.bonus_row else gamma - 1
        return tokens, torch.stack(rows).float()

    def accept(self, num_accepted: int, next_token: int) -> None:
        keep = min(num_accepted, self.fed_drafts)
        self.lm.rollback(self.state, self.fed_drafts - keep)
        self.unfed = [*self.drafts[keep:num_accepted], next_token]
