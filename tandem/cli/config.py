"""`tandem config show`: the effective settings of `tandem device serve` and `tandem cloud
serve` (defaults, then the config file)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True)


def to_toml(data: dict) -> str:
    """Two-level settings as TOML (unset values shown as comments: TOML has no null)."""
    lines: list[str] = []
    for section, values in data.items():
        lines.append(f"[{section}]")
        for key, value in values.items():
            if value is None:
                lines.append(f"# {key} = (unset)")
            elif isinstance(value, dict):
                inline = ", ".join(f"{k} = {json.dumps(v)}" for k, v in value.items())
                lines.append(f"{key} = {{{inline}}}" if inline else f"{key} = {{}}")
            else:
                lines.append(f"{key} = {json.dumps(value)}")
        lines.append("")
    return "\n".join(lines)


@app.command("show")
def show(
    config: Path = typer.Option(None, "--config", help="TOML or YAML file to read."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of TOML."),
) -> None:
    """Print the effective config (both sections)."""
    from tandem.serve.settings import TandemSettings, load_settings

    settings = load_settings(config) if config else TandemSettings()
    data = settings.model_dump(mode="json")
    typer.echo(json.dumps(data, indent=2) if as_json else to_toml(data).rstrip("\n"))
