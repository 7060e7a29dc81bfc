"""Tiny random Qwen2 models and a byte-level toy tokenizer, for fast unit tests.

Same architecture as the real models (Qwen2: GQA, RoPE, SwiGLU), 2 layers, hidden size 64,
vocabulary 258 (256 bytes + eos + pad). Weights come from a fixed seed, so every machine builds
bit-identical models. Two names give two different seeds: a draft/target pair.
"""

from __future__ import annotations

import hashlib

import torch

TINY_SEEDS = {"tiny-qwen2": 1234, "tiny-qwen2-b": 5678}


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255; 256 = eos, 257 = pad."""

    vocab_size = 258
    eos_token_id = 256
    pad_token_id = 257
    fingerprint = hashlib.sha256(b"tandem-byte-tokenizer-v1").hexdigest()

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def chat_prompt(self, user_message: str, system: str | None = None) -> list[int]:
        return self.encode((f"{system}\n" if system else "") + f"User: {user_message}\nAssistant:")


def tiny_config():
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=ByteTokenizer.vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        eos_token_id=ByteTokenizer.eos_token_id,
        pad_token_id=ByteTokenizer.pad_token_id,
    )


def build_tiny(name: str):
    """(model, tokenizer) for a tiny model name; weights drawn from the name's fixed seed."""
    from transformers import Qwen2ForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_SEEDS[name])
        model = Qwen2ForCausalLM(tiny_config())
        # Larger-than-default init so the toy model's distributions are not near-uniform.
        for param in model.parameters():
            if param.dim() > 1:
                torch.nn.init.normal_(param, std=0.2)
    model.eval()
    return model, ByteTokenizer()
