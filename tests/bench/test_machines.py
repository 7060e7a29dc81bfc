"""Every result JSON says where its machines ran; every two-sided bench takes the cpu knob."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks.report import Machines, save_json
from tandem.cli import app
from tandem.testbed.cpus import plan


def test_save_json_records_sets_threads_and_load_before_and_after(tmp_path):
    machines = Machines(cpus={"device": [0], "cloud": [1, 2]}, isolation="processes")
    machines.load_before = [9.0, 9.0, 9.0]  # so "after" is visibly read at save time
    save_json(tmp_path, "x", {"table": []}, machines=machines)
    saved = json.loads((tmp_path / "x.json").read_text())
    record = saved["machines"]
    assert record["cpus"] == {"device": [0], "cloud": [1, 2]}
    assert record["threads"] == {"device": 1, "cloud": 2}  # one engine thread per core
    assert record["overlap"] == [] and record["isolation"] == "processes"
    assert record["load_average"]["before"] == [9.0, 9.0, 9.0]
    assert len(record["load_average"]["after"]) == 3
    assert record["load_average"]["after"] != record["load_average"]["before"]
    assert saved["environment"]["this_process"]["cpus"]  # single-machine benches get this
    assert set(saved["environment"]["cpu"]) == {"model", "mhz", "isa"}  # boxes differ by ISA
    save_json(tmp_path, "y", {})
    assert "machines" not in json.loads((tmp_path / "y.json").read_text())


def test_a_llama_cpp_that_does_not_load_still_lets_the_result_be_saved(tmp_path, monkeypatch):
    import sys
    import types

    from benchmarks.report import llama_cpp_build

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import raises ImportError
    assert llama_cpp_build() is None

    def no_library():
        raise OSError("libllama.so: cannot open shared object file")

    broken = types.SimpleNamespace(__version__="0", llama_print_system_info=no_library)
    monkeypatch.setitem(sys.modules, "llama_cpp", broken)  # installed, its library won't load
    assert llama_cpp_build() is None
    save_json(tmp_path, "x", {})
    assert json.loads((tmp_path / "x.json").read_text())["environment"]["llama_cpp"] is None


def test_every_result_records_the_code_that_made_it(tmp_path):
    import subprocess

    import tandem
    from benchmarks.report import code_version

    save_json(tmp_path, "x", {})
    code = json.loads((tmp_path / "x.json").read_text())["environment"]["code"]
    root = Path(tandem.__file__).resolve().parent.parent
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True)
    if head.returncode != 0:
        pytest.skip("this tandem is not a git checkout")
    assert code["commit"] == head.stdout.decode().strip()
    assert isinstance(code["dirty"], bool)
    assert code_version(tmp_path) == {"commit": None, "dirty": None}  # no checkout there


@pytest.mark.skipif(shutil.which("git") is None, reason="no git on this machine")
def test_a_change_outside_the_results_makes_the_code_dirty(tmp_path):
    import subprocess

    from benchmarks.report import code_version

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "benchmarks" / "results" / "r.json").write_text("{}\n")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    assert code_version(tmp_path)["dirty"] is False
    (tmp_path / "benchmarks" / "results" / "r.json").write_text("{1}\n")  # a run's own output
    assert code_version(tmp_path)["dirty"] is False
    (tmp_path / "a.py").write_text("x = 2\n")
    assert code_version(tmp_path)["dirty"] is True


@pytest.mark.parametrize(
    "command",
    [
        ["bench", "spec"], ["bench", "spec-net"], ["bench", "spec-regimes"],
        ["bench", "rapid-net"], ["bench", "link"], ["bench", "serve"],
        ["bench", "dragon", "latency"], ["bench", "dragon", "ttft"],
        ["bench", "dragon", "scheduling"], ["net", "up"],
    ],
)  # fmt: skip
def test_two_sided_commands_take_the_cpu_knob(command):
    shown = CliRunner().invoke(app, [*command, "--help"], terminal_width=200)
    assert shown.exit_code == 0
    assert "--device-cpus" in shown.output and "--cloud-cpus" in shown.output


def test_serve_bench_runs_each_side_on_its_cores(tmp_path):
    from benchmarks.serve_load import run

    payload = run(
        device_model="tiny-qwen2", cloud_model="tiny-qwen2-b", sessions=[2], tokens=3,
        delay_ms=0.0, batch_window_ms=2.0, pipeline="sync", codec="dense", out=tmp_path,
    )  # fmt: skip
    saved = json.loads((tmp_path / "serve_load.json").read_text())
    sets = plan()
    assert saved["machines"]["cpus"] == sets
    for role in ("device", "cloud"):
        seen = saved["machines"]["observed"][role]
        assert seen["cpus"] == sets[role] and seen["engine_threads"] == len(sets[role])
    assert all(p["same_outputs_as_unbatched"] for p in payload["points"] if p["batching"])


def test_serve_bench_counts_refused_sessions(tmp_path):
    from benchmarks.serve_load import run

    payload = run(
        device_model="tiny-qwen2", cloud_model="tiny-qwen2-b", sessions=[4], tokens=3,
        delay_ms=20.0, batch_window_ms=2.0, pipeline="sync", codec="dense", out=tmp_path,
        max_sessions=2,
    )  # fmt: skip
    for point in payload["points"]:
        assert point["sessions_held"] + point["refused"] == 4
        assert point["sessions_held"] >= 1 and point["refused"] >= 1, point
        assert set(point["refusal_reasons"]) == {"cloud full"}
        assert point["tpot_p99_ms"] >= point["tpot_p50_ms"]


def test_plots_without_matplotlib_are_one_line(monkeypatch):
    import sys

    import pytest

    from benchmarks.report import new_figure
    from tandem.errors import TandemError

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(TandemError, match=r"pip install 'tandem\[bench\]'"):
        new_figure()
