import pytest
from typer.testing import CliRunner

from tandem.cli import app
from tandem.errors import TandemError

runner = CliRunner()
FAST = ["--tokenizer", "tiny-qwen2", "--embedder", "hashing-1024"]


def test_build_query_info_add(tmp_path, notes):
    out = tmp_path / "ix"
    result = runner.invoke(
        app, ["index", "build", str(notes), "--out", str(out), "--chunk-tokens", "64", *FAST]
    )
    assert result.exit_code == 0, result.output
    assert "17 documents" in result.output and "embedded" in result.output
    result = runner.invoke(app, ["index", "query", str(out), "flatline check suspect", "-k", "2"])
    assert result.exit_code == 0, result.output
    assert "private-notes/" in result.output and "flatline" in result.output.lower()
    result = runner.invoke(app, ["index", "info", str(out)])
    assert "embedder: hashing-1024" in result.output and "chunk_tokens: 64" in result.output
    assert "chunk leads: stored" in result.output
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "new.md").write_text("the moon tide table for June")
    (extra / "blob.bin").write_bytes(b"\x00\x00")
    result = runner.invoke(app, ["index", "add", str(out), str(extra)])
    assert result.exit_code == 0, result.output
    assert "embedded 1," in result.output and "18 documents" in result.output


def test_bad_input_raises_one_line_tandem_errors(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = runner.invoke(
        app, ["index", "build", str(empty), "--out", str(tmp_path / "ix"), *FAST]
    )
    assert isinstance(result.exception, TandemError) and "nothing to index" in str(result.exception)
    result = runner.invoke(app, ["index", "query", str(empty), "x"])
    assert isinstance(result.exception, TandemError) and "not a tandem index" in str(
        result.exception
    )
    assert "\n" not in str(result.exception)


@pytest.mark.slow
def test_cli_entry_point_prints_error_without_traceback(tmp_path):
    import subprocess
    import sys

    (tmp_path / "empty").mkdir()
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "from tandem.cli import main; main()",
            "index",
            "build",
            str(tmp_path / "empty"),
            "--out",
            str(tmp_path / "ix"),
            *FAST,
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2
    assert (
        run.stderr.strip().startswith("error: no text documents found")
        and "Traceback" not in run.stderr
    )


def test_build_over_another_embedders_index_is_refused_unless_replace(tmp_path, notes):
    out = tmp_path / "ix"
    result = runner.invoke(app, ["index", "build", str(notes), "--out", str(out), *FAST])
    assert result.exit_code == 0, result.output
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    other = ["--tokenizer", "tiny-qwen2", "--embedder", "hashing-64"]
    result = runner.invoke(app, ["index", "build", str(notes), "--out", str(out), *other])
    assert isinstance(result.exception, TandemError)
    message = str(result.exception)
    assert "hashing-1024" in message and "hashing-64" in message and "--replace" in message
    assert "\n" not in message
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    result = runner.invoke(
        app, ["index", "build", str(notes), "--out", str(out), *other, "--replace"]
    )
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["index", "info", str(out)])
    assert "embedder: hashing-64" in result.output
    help_text = runner.invoke(app, ["index", "build", "--help"]).output
    assert "--replace" in help_text


@pytest.mark.slow
def test_cli_prints_unreadable_index_faiss_as_one_line(tmp_path, notes):
    import subprocess
    import sys

    out = tmp_path / "ix"
    result = runner.invoke(app, ["index", "build", str(notes), "--out", str(out), *FAST])
    assert result.exit_code == 0, result.output
    faiss_file = out / "index.faiss"
    faiss_file.write_bytes(faiss_file.read_bytes()[:955])
    for args in (["query", str(out), "flatline"], ["add", str(out), str(notes)]):
        run = subprocess.run(
            [sys.executable, "-c", "from tandem.cli import main; main()", "index", *args],
            capture_output=True,
            text=True,
        )
        assert run.returncode == 2, run.stderr
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
        assert lines[0].startswith(f"error: {out}: index.faiss is unreadable (truncated")


def test_damaged_index_names_the_file_and_its_rebuild_command_works(tmp_path, notes):
    import shlex

    out = tmp_path / "ix"
    build = ["index", "build", str(notes), "--out", str(out), "--chunk-tokens", "32", *FAST]
    assert runner.invoke(app, build).exit_code == 0
    (out / "index.faiss").write_bytes(b"")
    result = runner.invoke(app, ["index", "query", str(out), "flatline"])
    message = str(result.exception)
    assert isinstance(result.exception, TandemError) and "\n" not in message
    assert message.startswith(f"{out}: index.faiss is unreadable (truncated")
    command = shlex.split(message.split("; rebuild it: ", 1)[1])
    assert command[:3] == ["tandem", "index", "build"] and "--chunk-tokens" in command
    result = runner.invoke(app, command[1:])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["index", "query", str(out), "flatline check suspect", "-k", "1"])
    assert result.exit_code == 0 and "flatline" in result.output.lower()


def test_unreadable_files_in_a_corpus_are_skipped_with_a_warning_naming_them(tmp_path, monkeypatch):
    import os
    from pathlib import Path

    src = tmp_path / "src"
    src.mkdir()
    (src / "good.md").write_text("the moon tide table for June")
    (src / "[draft] blob.bin").write_bytes(b"\x7fELF\x00\x00\x01")  # not rich markup
    (src / "latin1.txt").write_bytes("caf\xe9 cr\xe8me".encode("latin-1"))
    (src / "secret.md").write_text("locked away")
    (src / "secret.md").chmod(0)
    if os.geteuid() == 0:  # root reads mode-000 files: make the read fail as it would
        real = Path.read_bytes

        def read_bytes(self):
            if self.name == "secret.md":
                raise PermissionError(13, "Permission denied")
            return real(self)

        monkeypatch.setattr(Path, "read_bytes", read_bytes)
    try:
        result = runner.invoke(
            app, ["index", "build", str(src), "--out", str(tmp_path / "ix"), *FAST]
        )
    finally:
        (src / "secret.md").chmod(0o644)
    assert result.exit_code == 0, result.output
    assert "1 documents" in result.output and "skipped 3 files" in result.output
    for name, reason in (
        ("[draft] blob.bin", "binary file"),
        ("latin1.txt", "not UTF-8 text"),
        ("secret.md", "unreadable (Permission denied)"),
    ):
        assert f"skipped {src / name}: {reason}" in result.output


def test_info_says_an_older_index_joins_by_newlines_and_how_to_rebuild_it(tmp_path, notes):
    import sqlite3

    out = tmp_path / "ix"
    build = ["index", "build", str(notes), "--out", str(out), "--chunk-tokens", "64", *FAST]
    assert runner.invoke(app, build).exit_code == 0
    with sqlite3.connect(out / "docstore.sqlite") as db:  # as written before chunks had leads
        db.execute("ALTER TABLE chunks DROP COLUMN lead")
    result = runner.invoke(app, ["index", "info", str(out)])
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("chunk leads:"))
    assert "not stored" in line and "new line" in line
    assert f"tandem index build {notes} --out {out}" in line and "--chunk-tokens 64" in line
    assert runner.invoke(app, build).exit_code == 0  # the rebuild it names stores them
    assert "chunk leads: stored" in runner.invoke(app, ["index", "info", str(out)]).output
