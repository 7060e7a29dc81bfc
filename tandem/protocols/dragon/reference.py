"""Centralised references: both sides' laws computed in one process, aggregated token by token.

Words used here:
- *sent law*: a side's locally aggregated law after its codec (`transmitted_probs`), i.e.
  what the other side holds; the aggregate law is `eta_l sent_l + eta_r sent_r`.
- `CentralPair.greedy()`: greedy decoding of the aggregate law, computed centrally (argmax
  of the mixture, no speculation). Greedy DRAGON must equal it token for token.
- `CentralPair.sampled()`: token-wise synchronised aggregation (every position waits for both
  sides, VDRAG / DRDG-TW) with Algorithm 1 and the session's position seeds. Sampled DRAGON
  must equal it token for token for the same seed, whatever the strategy and the link.
- `CentralPair.laws(prefix)`: both sent laws and logweights at a prefix (exact-law tests,
  baselines that aggregate distributions directly).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem.codecs import Codec, make_codec
from tandem.protocols.dragon.aggregator import aggregate_step
from tandem.protocols.dragon.config import CLOUD, DEVICE, SIDES, DragonConfig
from tandem.protocols.dragon.decoder import DocDecoder
from tandem.protocols.dragon.knowledge import Knowledge, build_decoder
from tandem.protocols.dragon.queues import Draft, make_draft
from tandem.sampling.aggregation import mixture


@dataclass(frozen=True)
class SentLaw:
    sent_probs: torch.Tensor  # [vocab] what the peer holds
    logweight: float


class CentralPair:
    def __init__(self, decoders: dict[str, DocDecoder], codec: Codec, config: DragonConfig, eos_id):
        self.decoders, self.codec, self.config = decoders, codec, config
        self.eos_id = eos_id if config.stop_at_eos else None

    @classmethod
    def build(
        cls,
        *,
        device_lm,
        cloud_lm,
        device_knowledge: Knowledge,
        cloud_knowledge: Knowledge,
        question: str,
        config: DragonConfig,
    ) -> CentralPair:
        decoders = {}
        for side, lm, knowledge in (
            (DEVICE, device_lm, device_knowledge),
            (CLOUD, cloud_lm, cloud_knowledge),
        ):
            decoder, _ = build_decoder(lm, knowledge, question, config)
            decoder.prefill()
            decoders[side] = decoder
        codec = make_codec(config.codec, **config.codec_params)
        return cls(decoders, codec, config, device_lm.tokenizer.eos_token_id)

    def laws(self, prefix: list[int]) -> dict[str, SentLaw]:
        out = {}
        for side in SIDES:
            self.decoders[side].sync(prefix)
            law = self.decoders[side].law()
            out[side] = SentLaw(self.codec.transmitted_probs(law.probs), law.logweight)
        return out

    def drafts(self, prefix: list[int]) -> dict[str, Draft]:
        out = {}
        for side in SIDES:
            self.decoders[side].sync(prefix)
            out[side] = make_draft(
                self.decoders[side].law(),
                codec=self.codec,
                side=side,
                position=len(prefix),
                epoch=0,
                seed=self.config.seed,
                greedy=self.config.greedy,
            )
        return out

    def _stop(self, tokens: list[int]) -> bool:
        return len(tokens) >= self.config.max_new_tokens or (
            self.eos_id is not None and tokens[-1] == self.eos_id
        )

    def greedy(self) -> list[int]:
        tokens: list[int] = []
        while not tokens or not self._stop(tokens):
            laws = self.laws(tokens)
            target = mixture(
                laws[DEVICE].sent_probs,
                laws[CLOUD].sent_probs,
                laws[DEVICE].logweight,
                laws[CLOUD].logweight,
            )
            tokens.append(int(target.argmax()))
        return tokens

    def sampled(self) -> list[int]:
        tokens: list[int] = []
        while not tokens or not self._stop(tokens):
            drafts = self.drafts(tokens)
            outcome = aggregate_step(
                drafts[DEVICE], drafts[CLOUD], seed=self.config.seed, greedy=self.config.greedy
            )
            tokens.append(outcome.token)
        return tokens
