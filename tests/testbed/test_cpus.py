"""Core sets per emulated machine: parsing, splitting, pinning."""

from __future__ import annotations

import os

import pytest

from tandem.errors import TandemError
from tandem.testbed import cpus


def test_parse_cpus():
    assert cpus.parse_cpus("0") == [0]
    assert cpus.parse_cpus("3,0-1") == [0, 1, 3]
    for bad in ("", "a", "1-x"):
        with pytest.raises(TandemError, match="bad cpu list"):
            cpus.parse_cpus(bad)


def test_cpu_info_names_the_model_and_the_vector_sets_of_the_first_processor(tmp_path):
    text = (
        "processor\t: 0\nmodel name\t: AMD EPYC 9R14\ncpu MHz\t\t: 2600.004\n"
        "flags\t\t: fpu sse2 avx avx2 fma f16c avx512f avx512bw avx512_vnni\n\n"
        "processor\t: 1\nmodel name\t: other\nflags\t\t: fpu\n"
    )
    assert cpus.parse_cpuinfo(text) == {
        "model": "AMD EPYC 9R14",
        "mhz": 2600.0,
        "isa": ["avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni"],
    }
    no_avx512 = text.replace(" avx512f avx512bw avx512_vnni", "")
    assert cpus.parse_cpuinfo(no_avx512)["isa"] == ["avx", "avx2", "fma", "f16c"]
    assert cpus.cpu_info(str(tmp_path / "missing")) == {"model": None, "mhz": None, "isa": []}


def test_plan_splits_cores_in_order_and_shares_when_short():
    assert cpus.plan(cores=[0, 1]) == {"device": [0], "cloud": [1]}
    assert cpus.plan(cores=[4, 5, 6, 7]) == {"device": [4, 5], "cloud": [6, 7]}
    assert cpus.plan(cores=[0]) == {"device": [0], "cloud": [0]}


def test_pin_role_sets_affinity_and_threads_and_rejects_unknown_roles():
    import torch

    before, threads = os.sched_getaffinity(0), torch.get_num_threads()
    try:
        got = cpus.pin_role("cloud")
        assert set(got) == os.sched_getaffinity(0)
        assert torch.get_num_threads() == len(got)
        state = cpus.machine_state()
        assert state["cpus"] == got and len(state["loadavg"]) == 3
    finally:
        os.sched_setaffinity(0, before)
        torch.set_num_threads(threads)
    with pytest.raises(TandemError, match="unknown role"):
        cpus.pin_role("edge")


def test_restored_gives_back_the_set_and_the_thread_count_even_after_an_error():
    import torch

    before, threads = os.sched_getaffinity(0), torch.get_num_threads()
    with pytest.raises(RuntimeError, match="inside"), cpus.restored():
        cpus.pin(sorted(before)[:1])
        torch.set_num_threads(threads + 1)
        assert len(os.sched_getaffinity(0)) == 1
        raise RuntimeError("inside")
    assert os.sched_getaffinity(0) == before and torch.get_num_threads() == threads


def _two_cores() -> list[int]:
    """Two cores this process may use (the tests that tell sets apart need them)."""
    cores = cpus.available()
    if len(cores) < 2:
        pytest.skip("needs two cores")
    return cores[:2]


def test_format_cpus_inverts_parse_cpus():
    for text in ("0", "0-2,5", "1,3", "4-7"):
        assert cpus.format_cpus(cpus.parse_cpus(text)) == text
    assert cpus.overlap({"device": [0, 1], "cloud": [1, 2]}) == [1]
    assert cpus.overlap({"device": [0], "cloud": [1]}) == []


def test_role_cpus_defaults_to_plan_takes_the_flags_and_refuses_foreign_cores():
    assert cpus.role_cpus() == cpus.plan()
    first, second = _two_cores()
    assert cpus.role_cpus(str(second), str(first)) == {"device": [second], "cloud": [first]}
    assert cpus.role_cpus(cloud=str(first))["device"] == cpus.plan()["device"]
    outside = max(cpus.available()) + 1
    with pytest.raises(TandemError, match=f"core\\(s\\) {outside} not available"):
        cpus.role_cpus(device=str(outside))


def test_pin_thread_pins_only_the_calling_thread():
    import threading

    first, second = _two_cores()
    before = os.sched_getaffinity(0)
    seen = {}

    def work() -> None:
        cpus.pin_thread([second])
        seen["inside"] = os.sched_getaffinity(0)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert seen["inside"] == {second}
    assert os.sched_getaffinity(0) == before


def test_launcher_runs_the_command_on_its_set_with_one_thread_per_core():
    import subprocess
    import sys

    _, second = _two_cores()
    report = (
        "import os, torch; print(sorted(os.sched_getaffinity(0)), os.environ['OMP_NUM_THREADS'],"
        " torch.get_num_threads(), flush=True); import sys; sys.stdin.read()"
    )
    child = subprocess.Popen(
        cpus.pinned_argv([second], [sys.executable, "-c", report]),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = child.stdout.readline()
        status = open(f"/proc/{child.pid}/status").read()  # the kernel's word, while it runs
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    assert line.split() == [f"[{second}]", "1", "1"]
    assert f"Cpus_allowed_list:\t{second}\n" in status


def test_launcher_rejects_a_bad_set_in_one_line():
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "tandem.testbed.cpus", "--cpus", "x", "--", "true"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and done.stderr.startswith("error: bad cpu list 'x'")


def test_machine_state_names_the_engine_threads(tiny_lm):
    import types

    assert cpus.machine_state(types.SimpleNamespace(threads=3))["engine_threads"] == 3
    import torch

    assert cpus.machine_state(tiny_lm)["engine_threads"] == torch.get_num_threads()  # hf
