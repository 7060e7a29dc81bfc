"""Generated code runs in another process, folder and environment, within time and memory."""

from __future__ import annotations

import os

from tandem.sandbox import execute


def test_an_endless_program_times_out_with_its_children():
    result = execute("import os, time\nos.fork()\nwhile True:\n    pass\n", timeout_s=1.0)
    assert result.status == "timeout" and result.returncode is None
    assert result.seconds < 5


def test_programs_run_in_another_process_folder_and_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_SECRET", "do-not-leak")
    program = (
        "import os, sys\n"
        f"assert os.getpid() != {os.getpid()}\n"
        f"assert os.getcwd() != {str(os.getcwd())!r}\n"
        "assert 'TANDEM_SECRET' not in os.environ\n"
        "open('left-behind.txt', 'w').write('x')\n"
        "sys.modules['__main__'].MARK = 1\n"
    )
    assert execute(program).passed
    assert not hasattr(__import__("__main__"), "MARK")
    assert not (tmp_path / "left-behind.txt").exists() and not os.path.exists("left-behind.txt")


def test_memory_is_limited():
    result = execute("x = bytearray(8 << 30)\n", memory_mb=512)
    assert result.status == "failed" and "MemoryError" in result.output
