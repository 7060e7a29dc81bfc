"""`tandem demo` end to end: the README's main job, as a user runs it."""

from __future__ import annotations

import json
import os
import tempfile

import pytest
from typer.testing import CliRunner

from tandem.cli import app


@pytest.mark.slow
def test_the_dragon_demo_runs_end_to_end_and_leaves_no_folder(tmp_path, monkeypatch):
    """The real 0.5B on both sides, the cloud its own process on its own core: the answer
    streams, both sides' documents and drafts take part, and the cloud's ready file and log
    go with their folder."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    out = tmp_path / "report.json"
    cores = os.sched_getaffinity(0)
    result = CliRunner().invoke(app, ["demo", "-n", "12", "--json", str(out)])
    assert os.sched_getaffinity(0) == cores  # the demo pinned itself for a while, then let go
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["new_tokens"] >= 1 and report["finish_reason"] in ("length", "eos")
    assert report["new_tokens"] == 12 or report["finish_reason"] == "eos"
    assert not report["degraded"] and report["docs"] and report["peer_docs"] >= 1
    assert report["aggregations"] == report["new_tokens"]
    assert all(rate is not None for rate in report["acceptance_rate"].values())
    assert report["bytes_sent"] > 0 and report["bytes_received"] > 0
    assert "DRAGON session (device view)" in result.output
    # the question's retrieval: backoff.py's first and third chunks, the second put back
    backoff = "private-notes/snippets/backoff.py"
    assert [doc for doc, _ in report["docs"]] == [f"{backoff}#0", f"{backoff}#2"]
    assert report["put_back"] == [f"{backoff}#1"]
    assert not list(scratch.glob("tandem-*"))  # the cloud's ready file and log are gone


@pytest.mark.parametrize(
    "flag", [["--delay-ms", "-5"], ["--threads", "-1"], ["--kill-cloud-after", "-2"]]
)
def test_a_negative_number_is_refused_before_anything_starts(flag):
    """A negative delay was taken as no delay; now each such flag is an error that names it."""
    result = CliRunner().invoke(app, ["demo", *flag])
    assert result.exit_code == 2 and flag[0] in result.output, result.output
