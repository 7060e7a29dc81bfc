"""Where results go by default: never the folder the user stands in."""

from __future__ import annotations

from pathlib import Path

from benchmarks import RESULTS, results_dir

ROOT = Path(__file__).resolve().parents[2]


def test_a_checkout_writes_next_to_the_published_results(monkeypatch, tmp_path):
    monkeypatch.delenv("TANDEM_RESULTS", raising=False)
    monkeypatch.chdir(tmp_path)  # where the user stands does not matter
    assert results_dir() == ROOT / "benchmarks" / "results"
    assert (ROOT / "benchmarks" / "results" / "decode.json").is_file()


def test_the_environment_variable_wins(monkeypatch, tmp_path):
    monkeypatch.setenv("TANDEM_RESULTS", str(tmp_path / "mine"))
    assert results_dir() == tmp_path / "mine"


def test_an_installed_copy_writes_to_the_user_data_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("TANDEM_RESULTS", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    site = tmp_path / "site-packages" / "benchmarks"  # no pyproject.toml beside it
    site.mkdir(parents=True)
    assert results_dir(site) == tmp_path / "data" / "tandem" / "results"


def test_the_default_is_absolute():
    assert RESULTS.is_absolute()


def test_every_saved_file_is_named_on_stderr(tmp_path, capsys):
    """A benchmark says where its JSON and PNG went (in a checkout: over the published
    ones), on stderr, so stdout keeps only the figures."""
    import pytest

    from benchmarks.report import new_figure, save_json, save_png

    path = save_json(tmp_path, "x", {})
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", f"saved {path}\n")
    pytest.importorskip("matplotlib")
    fig, _ = new_figure()
    png = save_png(fig, tmp_path, "x")
    assert png.is_file() and capsys.readouterr().err == f"saved {png}\n"
