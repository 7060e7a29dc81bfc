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


def test_device_run_timeline_reaches_the_dragon_device(monkeypatch):
    import tandem.cli.demo as demo

    seen = {}
    monkeypatch.setattr(demo, "run_dragon_device", lambda **kwargs: seen.update(kwargs))
    args = ["device", "run", "--mode", "dragon", "--corpus", "x", "--timeline"]
    assert CliRunner().invoke(app, args).exit_code == 0
    assert seen["timeline"] is True and seen["corpus"] == "x"


def test_timeline_lines_show_ms_and_shares():
    from tandem.protocols.dragon.profiler import summarize
    from tandem.protocols.dragon.report import timeline_lines

    rows = [
        {"position": p, "gap_ms": g, "own_ms": o, "peer_ms": g - o, "resolve_ms": 0.0}
        for p, g, o in ((0, 900.0, 800.0), (1, 100.0, 80.0), (2, 100.0, 60.0))
    ]
    lines = timeline_lines(summarize({"decode": 0.15}, rows), "device")
    assert lines[0].startswith("device: 3 tokens, 100.0 ms/token") and "TTFT 900 ms" in lines[0]
    assert "own 70.0 (70%)" in lines[1] and "peer 30.0 (30%)" in lines[1]
    assert "decode 50.0 (50%)" in lines[2] and lines[3].startswith("  cpu          decode 0.0")
    assert "every thread" not in lines[3]  # no process clock: nothing to say
    clocks = {"process_per_later_token": 0.012, "decode_per_later_token": 0.009}
    cpu_line = timeline_lines(summarize({}, rows, clocks), "device")[3]
    assert cpu_line.endswith("; every thread 12.0 ms/token (3.0 of it beyond decoding)")
    assert timeline_lines(None, "cloud") == ["cloud: no timeline"]


def test_demo_runs_one_row_per_side_with_static_weights_unless_told(monkeypatch):
    import tandem.models.registry as registry
    import tandem.serve.dragon_demo as dragon_demo
    from tandem.protocols.dragon.report import SideReport

    configs = []
    monkeypatch.setattr(registry, "load_tokenizer", lambda model: _Tokenizer())
    monkeypatch.setattr(
        dragon_demo,
        "run_demo",
        lambda **kwargs: configs.append(kwargs["config"]) or SideReport(role="device"),
    )
    runner = CliRunner()
    assert runner.invoke(app, ["demo", "-n", "3"]).exit_code == 0
    assert (
        runner.invoke(app, ["demo", "--rows", "documents", "--scorer", "embedding"]).exit_code == 0
    )
    assert [(c.rows, c.scorer) for c in configs] == [("side", "static"), ("documents", "embedding")]
    bad = runner.invoke(app, ["demo", "--scorer", "psychic"])
    assert isinstance(bad.exception, TandemError) and "scorer must be one of" in str(bad.exception)


def test_device_run_passes_rows_and_scorer(monkeypatch):
    import tandem.cli.demo as demo

    seen = {}
    monkeypatch.setattr(demo, "run_dragon_device", lambda **kwargs: seen.update(kwargs))
    args = ["device", "run", "--mode", "dragon", "--corpus", "x", "--rows", "documents"]
    assert CliRunner().invoke(app, args).exit_code == 0
    assert seen["rows"] == "documents" and seen["scorer"] == "static"


class _Tokenizer:
    eos_token_id = 0

    def decode(self, tokens):
        return ""
