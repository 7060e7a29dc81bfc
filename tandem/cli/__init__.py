"""Thin typer CLI: each sub-command parses flags, calls one library function, prints.

Sub-command groups live in one small module each (``models``, ``generate``, ``net``,
``index``, ...) so they stay readable; this module only wires them together and turns
`TandemError` into a one-line message with exit status 2. Groups from outside the library
(``bench``, from the top-level ``benchmarks`` package) come in through the ``tandem.commands``
entry point, so the library itself never imports them.
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import entry_points

import typer

from tandem.cli import cloud, config, demo, device, generate, index, models, net, rapid
from tandem.errors import TandemError

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__.splitlines()[0])
app.add_typer(models.app, name="models", help="List and prepare the named models.")
app.add_typer(net.app, name="net", help="Emulated network between a device and a cloud.")
app.add_typer(index.app, name="index", help="Build and query retrieval indexes.")
app.add_typer(cloud.app, name="cloud", help="The cloud side: serve device sessions.")
app.add_typer(device.app, name="device", help="The device side: run a generation.")
app.add_typer(rapid.app, name="rapid", help="RAPID: RAG drafter, long-context target.")
app.add_typer(config.app, name="config", help="Show the effective config (--config FILE).")
app.command("generate")(generate.generate)


@app.callback()
def _engine(
    backend: str = typer.Option(
        None,
        "--backend",
        help="Model engine for every command: llamacpp (default; the GGUF as shipped) or hf "
        "(transformers fp32, the reference). Same as $TANDEM_BACKEND.",
    ),
) -> None:
    """A device model and a cloud model generating text together over a real network."""
    if backend is not None:
        from tandem.models.registry import check_backend

        os.environ["TANDEM_BACKEND"] = check_backend(backend)  # child processes inherit it


app.command("demo")(demo.demo)


def _add_plugins() -> None:
    """Command groups that other packages register under the `tandem.commands` entry point
    (this distribution's `benchmarks.cli` adds `bench`). One that fails to import is left
    out with a one-line warning instead of breaking every other command."""
    for point in entry_points(group="tandem.commands"):
        try:
            group = point.load()
        except Exception as exc:  # a broken plugin must not take every other command down
            print(f"warning: tandem {point.name} unavailable: {exc}", file=sys.stderr)
            continue
        app.add_typer(group, name=point.name)


_add_plugins()


# rich's page width when no terminal is attached (a log, CI); rich would use 80
LOG_COLUMNS = 240


def _log_width() -> None:
    """Output that goes to a log is not wrapped at 80 columns: rich would shrink a benchmark's
    wide tables (the DRAGON timeline's 18 columns) to cells of "…". Sets COLUMNS, which rich
    reads, unless the user set it, and only when neither stdout nor stderr is a terminal: a
    progress bar on a terminal's stderr must keep the terminal's width."""
    if "COLUMNS" not in os.environ and not (sys.stdout.isatty() or sys.stderr.isatty()):
        os.environ["COLUMNS"] = str(LOG_COLUMNS)


def main() -> None:
    """Console-script entry point."""
    _log_width()
    try:
        app()
    except TandemError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
