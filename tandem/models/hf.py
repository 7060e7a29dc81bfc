"""transformers backend for the `CausalLM` protocol (CPU or GPU, float32 by default).

Owns: left-padded batched rows, explicit KV rollback, preemption between layers, and saving a
prefix's KV cache. Words as in `tandem.models.base`.

Rows are left-padded; the attention mask hides padding and position ids count only real
tokens, so a padded row computes the same logits as the row alone (tested in the contract tests).
Cancellation: a forward pre-hook on every decoder layer checks the current cancel event; when it
fires, layers that already appended keys/values are cut back, so the state is as before the call.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any

import torch

from tandem.errors import TandemError
from tandem.models.base import (
    Cancelled,
    State,
    as_new_ids,
    as_rows,
    read_kv_file,
    state_tensors,
    write_kv_file,
)

FORMAT = "tandem-kv-1"


class HFCausalLM:
    """A `transformers` causal LM behind the `CausalLM` protocol."""

    def __init__(self, model: Any, tokenizer: Any, *, name: str):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.vocab_size: int = int(model.get_output_embeddings().weight.shape[0])
        self.pad_id = 0
        self._cancel: threading.Event | None = None
        self._lock = threading.RLock()  # one forward pass at a time per model object
        self.layers = list(model.model.layers)
        for layer in self.layers:
            layer.register_forward_pre_hook(self._check_cancel)
        self.fingerprint = self._fingerprint()

    @classmethod
    def from_dir(cls, directory: Path, *, name: str, dtype: torch.dtype = torch.float32):
        from safetensors import SafetensorError
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        from tandem.models.integrity import folder_problem
        from tandem.models.tokenizer import HFTokenizer

        problem = folder_problem(directory)
        if problem is not None:
            raise TandemError(f"{directory}/{problem}; this model folder is damaged: copy it again")
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        try:
            model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype)
            tokenizer = HFTokenizer.from_dir(directory)
        except (OSError, ValueError, SafetensorError) as exc:
            raise TandemError(f"cannot load model from {directory}: {exc}".splitlines()[0]) from exc
        return cls(model, tokenizer, name=name)

    def _fingerprint(self) -> str:
        digest = hashlib.sha256(self.tokenizer.fingerprint.encode())
        digest.update(self.model.config.to_json_string(use_diff=False).encode())
        head = self.model.get_output_embeddings().weight.detach().flatten()[:4096]
        digest.update(head.to(torch.float32).numpy().tobytes())
        return digest.hexdigest()

    def _check_cancel(self, module: Any, args: Any) -> None:
        if self._cancel is not None and self._cancel.is_set():
            raise Cancelled("decode cancelled")

    # -- forward passes ---------------------------------------------------------------------

    def _forward(
        self,
        ids: torch.Tensor,  # [batch, n]
        mask: torch.Tensor,  # [batch, past + n]
        positions: torch.Tensor,  # [batch, n]
        cache: Any,
        cancel: threading.Event | None,
    ) -> torch.Tensor:  # [batch, n, vocab]
        with self._lock, torch.inference_mode():
            past = _cache_len(cache)
            self._cancel = cancel
            try:
                out = self.model(
                    input_ids=ids,
                    attention_mask=mask,
                    position_ids=positions,
                    past_key_values=cache,
                    use_cache=True,
                )
            except Cancelled:
                _cut_cache(cache, past)
                raise
            finally:
                self._cancel = None
            return out.logits.float()

    def _new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    def prefill(
        self, ids: list[int] | list[list[int]], cancel: threading.Event | None = None
    ) -> State:
        rows = as_rows(ids)
        width = max(len(r) for r in rows)
        pads = [width - len(r) for r in rows]
        tokens = torch.tensor(
            [[self.pad_id] * p + r for p, r in zip(pads, rows, strict=True)], dtype=torch.long
        )
        mask = _mask(pads, width)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = self._new_cache()
        logits = self._forward(tokens, mask, positions, cache, cancel)
        return State(ids=tokens, pads=pads, logits=logits[:, -1], cache=cache)

    def decode(
        self,
        state: State,
        ids: torch.Tensor | list[list[int]] | list[int],
        cancel: threading.Event | None = None,
    ) -> torch.Tensor:
        new = as_new_ids(ids, state.batch)  # [batch, n]
        n = new.shape[1]
        mask = _mask(state.pads, state.seq_len + n)
        start = torch.tensor(state.lengths, dtype=torch.long).unsqueeze(1)  # [batch, 1]
        positions = start + torch.arange(n).unsqueeze(0)
        logits = self._forward(new, mask, positions, state.cache, cancel)
        state.ids = torch.cat([state.ids, new], dim=1)
        state.logits = logits[:, -1]
        state.recent_logits = logits
        return logits

    def crop(self, state: State, seq_len: int) -> None:
        state.crop_bookkeeping(seq_len)
        _cut_cache(state.cache, seq_len)

    def rollback(self, state: State, num_tokens: int) -> None:
        if num_tokens:
            self.crop(state, state.seq_len - num_tokens)

    def evict(self, state: State, start: int, end: int) -> None:
        """Drop positions [start, end) of a one-row unpadded state and shift the later ones
        down (StreamingLLM): their keys are re-rotated from position p to p - (end - start)."""
        state.evict_bookkeeping(start, end)
        with torch.inference_mode():
            for layer in state.cache.layers:
                keys, values = layer.keys, layer.values  # [1, kv_heads, seq, head_dim]
                layer.keys = torch.cat(
                    [keys[..., :start, :], self._rotate_keys(keys[..., end:, :], start - end)],
                    dim=-2,
                )
                layer.values = torch.cat([values[..., :start, :], values[..., end:, :]], dim=-2)

    def _rotate_keys(self, keys: torch.Tensor, delta: int) -> torch.Tensor:
        """Keys [batch, heads, seq, head_dim] that were rotated for position p -> for p + delta."""
        from transformers.models.qwen2.modeling_qwen2 import rotate_half

        rotary = getattr(getattr(self.model, "model", None), "rotary_emb", None)
        if rotary is None or float(getattr(rotary, "attention_scaling", 1.0)) != 1.0:
            raise TandemError(f"evicting positions needs a plain-RoPE model ({self.name})")
        positions = torch.full((1, keys.shape[-2]), delta, dtype=torch.long)
        cos, sin = rotary(keys, positions)  # [1, seq, head_dim] each
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return keys * cos + rotate_half(keys) * sin

    def score(self, ids: list[int]) -> torch.Tensor:  # [len(ids), vocab]
        with self._lock, torch.inference_mode():
            tokens = torch.tensor([as_rows(ids)[0]], dtype=torch.long)
            return self.model(input_ids=tokens, use_cache=False).logits.float()[0]

    def stack(self, states: list[State]) -> State:
        width = max(s.seq_len for s in states)
        ids, pads, logits = [], [], []
        layers: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []
        for s in states:
            extra = width - s.seq_len
            ids.append(torch.nn.functional.pad(s.ids, (extra, 0), value=self.pad_id))
            pads.extend(p + extra for p in s.pads)
            logits.append(s.logits)
            for i, (k, v) in enumerate(_cache_tensors(s.cache)):
                if len(layers) <= i:
                    layers.append(([], []))
                layers[i][0].append(torch.nn.functional.pad(k, (0, 0, extra, 0)))
                layers[i][1].append(torch.nn.functional.pad(v, (0, 0, extra, 0)))
        cache = self._new_cache()
        for i, (ks, vs) in enumerate(layers):
            cache.update(torch.cat(ks), torch.cat(vs), i)
        return State(ids=torch.cat(ids), pads=pads, logits=torch.cat(logits), cache=cache)

    def split_rows(self, state: State) -> list[State]:
        """The inverse of `stack`: one single-row state per row, its left padding removed.

        Each returned state owns copies of its row's ids, KV cache and logits (nothing keeps the
        batched tensors alive) and continues decoding exactly as the row would alone.
        """
        tensors = _cache_tensors(state.cache)
        rows: list[State] = []
        for row, pad in enumerate(state.pads):
            cache = self._new_cache()
            for i, (k, v) in enumerate(tensors):  # [batch, heads, seq_len, head_dim]
                cache.update(
                    k[row : row + 1, :, pad:].clone(), v[row : row + 1, :, pad:].clone(), i
                )
            logits = None if state.logits is None else state.logits[row : row + 1].clone()
            recent = state.recent_logits
            rows.append(
                State(
                    ids=state.ids[row : row + 1, pad:].clone(),
                    pads=[0],
                    logits=logits,
                    cache=cache,
                    recent_logits=None if recent is None else recent[row : row + 1].clone(),
                )
            )
        return rows

    # -- persistence ------------------------------------------------------------------------

    def save_state(self, state: State, path: Path) -> None:
        tensors = state_tensors(state)
        for i, (k, v) in enumerate(_cache_tensors(state.cache)):
            tensors[f"k.{i}"] = k.contiguous()
            tensors[f"v.{i}"] = v.contiguous()
        write_kv_file(path, tensors, kind=FORMAT, lm=self)

    def load_state(self, path: Path) -> State:
        tensors = read_kv_file(path, kind=FORMAT, lm=self)
        cache = self._new_cache()
        for i in range(len(self.layers)):
            cache.update(tensors[f"k.{i}"], tensors[f"v.{i}"], i)
        return State(
            ids=tensors["ids"], pads=tensors["pads"].tolist(), logits=tensors["logits"], cache=cache
        )


# -- small helpers on ids, masks and caches ---------------------------------------------------


def _mask(pads: list[int], width: int) -> torch.Tensor:  # [batch, width]
    mask = torch.ones(len(pads), width, dtype=torch.long)
    for row, pad in enumerate(pads):
        mask[row, :pad] = 0
    return mask


def _cache_tensors(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def _cache_len(cache: Any) -> int:
    return cache.get_seq_length()


def _cut_cache(cache: Any, seq_len: int) -> None:
    """Cut every layer's keys/values to at most `seq_len` positions."""
    for layer in cache.layers:
        if getattr(layer, "is_initialized", False) and layer.keys.shape[-2] > seq_len:
            layer.keys = layer.keys[..., :seq_len, :]
            layer.values = layer.values[..., :seq_len, :]
