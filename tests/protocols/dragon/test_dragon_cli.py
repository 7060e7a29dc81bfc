"""The DRAGON commands are wired into the CLI (no models are loaded here)."""

from __future__ import annotations

from typer.testing import CliRunner

from tandem.cli import app
from tandem.errors import TandemError


def test_demo_and_dragon_options_are_registered():
    runner = CliRunner()
    demo = runner.invoke(app, ["demo", "--help"])
    assert demo.exit_code == 0 and "--kill-cloud-after" in demo.output
    assert "--corpus" in runner.invoke(app, ["cloud", "serve", "--help"]).output
    assert "--strategy" in runner.invoke(app, ["device", "run", "--help"]).output


def test_device_dragon_mode_needs_a_corpus():
    result = CliRunner().invoke(app, ["device", "run", "--mode", "dragon"])
    assert isinstance(result.exception, TandemError) and "--corpus" in str(result.exception)
