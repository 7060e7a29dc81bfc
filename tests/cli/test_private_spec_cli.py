"""The private-spec mode on the command line: flags registered, bad input named before any
model loads, and (slow) `tandem demo --mode private-spec` end to end with the real pair."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from tandem.cli import app
from tandem.errors import TandemError


def test_private_spec_flags_are_registered():
    runner = CliRunner()
    assert "--eta" in runner.invoke(app, ["demo", "--help"]).output
    assert "private-spec" in runner.invoke(app, ["device", "run", "--help"]).output
    assert "--eta" in runner.invoke(app, ["device", "serve", "--help"]).output
    assert "--latency-questions" in runner.invoke(app, ["bench", "private-spec", "--help"]).output


def test_private_spec_needs_a_corpus():
    result = CliRunner().invoke(app, ["device", "run", "--mode", "private-spec"])
    assert isinstance(result.exception, TandemError) and "--corpus" in str(result.exception)


def test_unknown_demo_mode_is_named():
    result = CliRunner().invoke(app, ["demo", "--mode", "nope"])
    assert isinstance(result.exception, TandemError) and "nope" in str(result.exception)


def test_separate_codec_with_eta_is_refused_by_the_settings():
    from tandem.protocols.private_spec import private_config

    with pytest.raises(TandemError, match="separate"):
        private_config(codec="separate")


@pytest.mark.slow
def test_demo_private_spec_end_to_end(tmp_path, monkeypatch):
    """Both real models, the cloud as its own pinned process: the answer streams, each side
    used its own chunks, the uplink stays within 64 bits per draft; no folder is left."""
    import tempfile

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    out = tmp_path / "report.json"
    args = ["demo", "--mode", "private-spec", "-n", "12", "--json", str(out)]
    cores = os.sched_getaffinity(0)
    result = CliRunner().invoke(app, args)
    assert os.sched_getaffinity(0) == cores  # the demo pinned itself for a while, then let go
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["mode"] == "private-spec" and len(report["tokens"]) >= 1
    assert report["docs"] and report["cloud"]["public_docs"]
    # the default question (the DRAGON demo's) retrieves backoff.py#0 and #2; #1 is put back
    assert report["put_back"] == ["private-notes/snippets/backoff.py#1"]
    assert isinstance(report["cloud"]["public_put_back"], list)
    assert report["payload_bits"] <= 64 * report["drafts_sent"]
    assert report["cloud"]["agrees_with_device"]
    assert not list(scratch.glob("tandem-*"))  # the cloud's log went with its folder
