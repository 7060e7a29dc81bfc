"""DRAGON's network benchmarks at tiny scale: device and cloud as processes in the emulated
network (namespaces as root, else the loopback proxy), every method, JSON + PNG written."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from benchmarks.cli.dragon import app
from tandem.testbed.cpus import plan

DEVICE_TEXTS = [
    "Our retry policy: base delay 0.5 s, factor 2, cap 20 s, at most 5 attempts.",
    "Buoys report salinity and water temperature every minute over LTE.",
]
CLOUD_TEXTS = [
    "asyncio.sleep(delay) suspends the current task for delay seconds.",
    "random.uniform(a, b) returns a random float N such that a <= N <= b.",
]


def test_cli_commands_are_registered():
    runner = CliRunner()
    for command in ("latency", "ttft"):
        result = runner.invoke(app, [command, "--help"])
        assert result.exit_code == 0 and "--quick" in result.output and "--out" in result.output


def test_the_testbed_sets_the_jitter_as_a_fraction_of_the_delay(monkeypatch, tmp_path):
    from tandem.baselines.dragon import testbed
    from tandem.errors import TandemError
    from tandem.testbed import netns

    seen = []
    monkeypatch.setattr(netns, "net_up", seen.append)  # the config it would bring up
    monkeypatch.setattr(netns, "netns_unavailable_reason", lambda: None)
    index = tmp_path / "index"
    for jitter, expected in ((testbed.JITTER, 60.0), (0.0, 0.0), (0.5, 150.0)):
        bed = testbed.Testbed(model="m", public_index=index, private_index=index, jitter=jitter)
        bed._net(300.0)
        assert seen[-1].jitter_ms == pytest.approx(expected) and seen[-1].delay_ms == 300.0
    assert testbed.JITTER == pytest.approx(1 / 5)  # the paper's (Sec. 7.3)
    for bad in (-0.1, 1.5):
        with pytest.raises(TandemError, match="jitter must be a fraction of the delay"):
            testbed.Testbed(model="m", public_index=index, private_index=index, jitter=bad)
    failed = CliRunner().invoke(app, ["latency", "--jitter", "2", "--quick"])
    assert failed.exit_code != 0 and isinstance(failed.exception, TandemError)
    assert "jitter must be a fraction of the delay in [0, 1], not 2" in str(failed.exception)


def test_the_testbed_removes_its_folder_when_it_closes(monkeypatch, tmp_path):
    import tempfile

    from tandem.baselines.dragon.testbed import Testbed
    from tandem.testbed import netns

    downs = []
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(netns, "net_down", downs.append)
    bed = Testbed(model="m", public_index=tmp_path, private_index=tmp_path)
    assert bed.workdir is None and not list(tmp_path.iterdir())  # made when it starts
    started = []

    def net_fails(self, delay_ms):  # the bed's start fails once its folder exists
        started.append(self.workdir)
        raise OSError("no network here")

    monkeypatch.setattr(Testbed, "_net", net_fails)
    with pytest.raises(OSError, match="no network here"), bed:
        pass
    assert started and started[0].parent == tmp_path and started[0].name.startswith("tandem-")
    assert downs == [bed.name] and not started[0].exists()  # gone with the bed
    bed.close()  # twice is harmless


def test_dragon_variants_run_the_dragon_method_with_their_config():
    from benchmarks.dragon_latency import CONTROL, DRAGONS, EXTRA_METHODS, LABELS, bench_config

    assert set(EXTRA_METHODS) - {CONTROL} <= set(DRAGONS) and set(DRAGONS) <= set(LABELS)
    assert CONTROL in LABELS and CONTROL not in DRAGONS  # a device-only run, not a variant
    configs = [bench_config(8, method=m) for m in DRAGONS]
    paper, side, static, own, peer, mirror, on_device, on_cloud = configs
    assert (mirror.rows, mirror.scorer, mirror.mirror, static.mirror) == (
        "side",
        "static",
        True,
        False,
    )
    assert (paper.rows, paper.scorer, paper.branch) == ("documents", "embedding", "off")
    assert (side.rows, side.scorer) == ("side", "embedding")
    assert (static.rows, static.scorer, static.branch) == ("side", "static", "off")
    assert (own.rows, own.scorer, own.branch) == ("side", "static", "own")
    assert (peer.rows, peer.scorer, peer.branch) == ("side", "static", "peer")
    assert not any(c.mirror for c in (paper, side, static, own, peer))  # as they were measured
    # Fig. 8's fixed placements, live: the paper's protocol, the aggregator on one side
    assert [c.strategy for c in configs] == ["dragon"] * 6 + ["device", "cloud"]
    for fixed in (on_device, on_cloud):
        assert (fixed.rows, fixed.scorer, fixed.mirror) == ("side", "static", False)
    assert (on_device.first_aggregator, on_cloud.first_aggregator) == ("device", "cloud")
    assert bench_config(8, method="crcg-device").mirror  # baselines: the bench's defaults
    assert all(c.timeline and c.max_new_tokens == 8 for c in configs)


def test_timeline_rows_are_kept_apart_per_dragon_variant():
    from benchmarks.dragon_timeline import timeline_rows
    from tandem.protocols.dragon.profiler import CRITICAL, PHASES, STARTUP

    def timeline(gap, cpu):
        return {
            "tokens": 4, "mean_gap_ms": gap, "ttft_ms": {"gap_ms": 100.0},
            "critical_ms_per_token": dict.fromkeys(CRITICAL, gap / len(CRITICAL)),
            "work_ms_per_token": dict.fromkeys(PHASES, 1.0),
            "cpu_ms_per_token": {"decode": 1.0, **cpu}, "startup_cpu_ms": {"prefill": 1.0},
            "startup_ms": dict.fromkeys(STARTUP, 1.0),
        }  # fmt: skip

    clocks = {"process": 5.0, "decode_in_window": 3.5}  # files since 2026-12-02
    runs = [
        {"method": m, "delay_ms": 0.0,
         "summary": {"timeline": timeline(g, cpu), "peer_timeline": None}}
        for m, g, cpu in (("dragon", 100.0, {}), ("dragon-side", 50.0, clocks),
                          ("crcg-device", 10.0, {}))
    ]  # fmt: skip
    rows = timeline_rows(runs, [0.0], ["dragon", "dragon-side"])
    assert [(r["method"], r["side"], r["mean_gap_ms"]) for r in rows] == [
        ("dragon", "device", 100.0),
        ("dragon-side", "device", 50.0),
    ]
    assert "beyond_decode_ms_per_token" not in rows[0]["cpu"]  # an older file: no window clock
    assert rows[1]["cpu"]["beyond_decode_ms_per_token"] == pytest.approx(1.5)


def test_stall_rows_split_each_dragon_variant_at_each_delay_against_crcg_device():
    from rich.console import Console

    from benchmarks.dragon_timeline import print_stalls, stall_rows

    times = [0.5, 0.52, 0.54, 0.84, 0.86]  # one stall (300 ms) after position 2
    verdicts = [{"position": t, "device": t != 0, "cloud": t != 2} for t in range(5)]
    runs = [
        {"method": m, "delay_ms": d, "token_times": times, "resolutions": verdicts}
        for m in ("dragon-side-static-mirror", "crcg-device") for d in (0.0, 300.0)
    ]  # fmt: skip
    rows = [
        {"method": m, "delay_ms": d, "per_token_s": s}
        for (m, d, s) in (("crcg-device", 0.0, 0.02), ("crcg-device", 300.0, 0.016),
                          ("dragon-side-static-mirror", 0.0, 0.02),
                          ("dragon-side-static-mirror", 300.0, 0.09))
    ]  # fmt: skip
    split = stall_rows(runs, rows, ["dragon-side-static-mirror", "dragon"], "crcg-device")
    assert [(r["method"], r["delay_ms"]) for r in split] == [("dragon-side-static-mirror", 300.0)]
    row = split[0]
    assert (row["stalls"], row["cycles"], row["stalls_at_cycles"]) == (1, 1, 1)
    assert row["paced_ms"] == pytest.approx(20.0) and row["paced_ratio"] == pytest.approx(1.25)
    console = Console(record=True, width=200)
    print_stalls(console, split, {"dragon-side-static-mirror": "mirrored"})
    text = console.export_text()
    assert "+300 ms: mirrored: 1 stalls (the two-chain model: 1, 1 where it puts them)" in text
    assert "outside them 20.00 ms a token, 1.250x CRCG/Device" in text


def write_corpora(tmp_path) -> dict[str, str]:
    """The public and private corpora of the quick runs, as folders of text files."""
    corpora = {}
    for name, texts in (("public", CLOUD_TEXTS), ("private", DEVICE_TEXTS)):
        folder = tmp_path / name
        folder.mkdir()
        for number, text in enumerate(texts):
            (folder / f"{name}{number}.txt").write_text(text + "\n")
        corpora[name] = str(folder)
    return corpora


@pytest.mark.slow
def test_quick_latency_and_ttft_runs(tmp_path, monkeypatch):
    from benchmarks import dragon_latency, dragon_ttft

    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    corpora = write_corpora(tmp_path)
    out = tmp_path / "out"
    common = {"out": out, "quick": True, "model": "tiny-qwen2", "net_name": "tandem-dbtest"}
    methods = (*dragon_latency.METHODS, "dragon-side-static", dragon_latency.CONTROL)
    latency = dragon_latency.run(delays=(0.0, 20.0), tokens=4, methods=methods, **common, **corpora)
    saved = json.loads((out / "dragon_latency.json").read_text())
    assert (out / "dragon_latency.png").stat().st_size > 0
    assert saved["setup"]["network"]["mode"] in ("netns", "loopback")
    sets = plan()  # each side a process on its own cores, as it saw itself
    assert saved["machines"]["cpus"] == sets
    assert any("delay proxy" in what for what in saved["machines"]["shared"])  # not pinned
    for role in ("device", "cloud"):
        seen = saved["machines"]["observed"][role]
        assert seen["cpus"] == sets[role] and seen["engine_threads"] == len(sets[role])
    runs = latency["runs"]
    assert {(r["method"], r["delay_ms"]) for r in runs} == {
        (m, d) for m in methods for d in (0.0, 20.0)
    }
    assert all(len(r["tokens"]) == 4 and len(r["token_times"]) == 4 for r in runs)
    by = {(r["method"], r["delay_ms"]): r["tokens"] for r in runs}
    # the control is CRCG/Device beside a burner that decoded on the cloud's cores meanwhile
    control = [r for r in runs if r["method"] == dragon_latency.CONTROL]
    assert all(r["burner"]["steps"] > 0 and not r["burner"]["burning"] for r in control)
    assert by[(dragon_latency.CONTROL, 0.0)] == by[("crcg-device", 0.0)]
    assert dragon_latency.CONTROL in saved["setup"]["controls"]
    # one model on both sides: token-wise synchronised aggregation = DRAGON, at every delay
    assert by[("drdg-tw", 0.0)] == by[("dragon", 0.0)] == by[("dragon", 20.0)]
    assert [r["delay_ms"] for r in latency["theorem_6_2"]] == [0.0, 20.0]
    assert all(r["predicted_speedup"] >= 1 for r in latency["theorem_6_2"])
    assert latency["stalls"] and {r["delay_ms"] for r in latency["stalls"]} == {20.0}  # none at +0
    # every run notes the load; DRAGON runs carry both sides' timelines, averaged per delay
    assert all(r["load_1min"] >= 0 for r in saved["runs"])
    for run in (r for r in saved["runs"] if r["method"] == "dragon"):
        for key in ("timeline", "peer_timeline"):
            assert run["summary"][key]["tokens"] == 4
    rows = {(r["method"], r["delay_ms"], r["side"]): r for r in saved["timeline"]}
    assert set(rows) == {
        (m, d, s)
        for m in ("dragon", "dragon-side-static")
        for d in (0.0, 20.0)
        for s in ("device", "cloud")
    }
    assert all(r["work_ms_per_token"]["decode"] > 0 for r in rows.values())

    ttft = dragon_ttft.run(delays=(0.0,), **common, **corpora)
    assert (out / "dragon_ttft.png").stat().st_size > 0
    moved = {r["method"]: r["transfer_bytes"] for r in ttft["table"]}
    assert moved["drcg-kv"] > moved["drcg-text"] > 0 and moved["dragon"] == 0
    tokens = {r["method"]: r["tokens"] for r in ttft["runs"]}
    assert tokens["drcg-kv"] == tokens["drcg-text"]
    assert all(r["ttft_s"] > 0 for r in ttft["table"])


def record_launches(monkeypatch) -> list[list[str]]:
    """The argv of every process the testbed starts from now on (they still start)."""
    from tandem.baselines.dragon import testbed

    started, popen = [], testbed.subprocess.Popen

    def recording_popen(argv, *args, **kwargs):
        started.append(list(argv))
        return popen(argv, *args, **kwargs)

    monkeypatch.setattr(testbed.subprocess, "Popen", recording_popen)
    return started


def test_the_cloud_may_run_another_model(tmp_path, monkeypatch):
    """`--cloud-model`: the cloud process loads its own model (sharing the device model's
    tokenizer), the baselines on the cloud and DRAGON's cloud side run it, and the result says
    which model each side ran."""
    from benchmarks import dragon_latency
    from tandem.baselines.dragon.testbed import Testbed

    index = tmp_path / "index"
    assert Testbed(model="m", public_index=index, private_index=index).cloud_model == "m"
    bed = Testbed(model="m", public_index=index, private_index=index, cloud_model="c")
    assert (bed.model, bed.cloud_model) == ("m", "c")
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    corpora = write_corpora(tmp_path)
    started = record_launches(monkeypatch)
    out = tmp_path / "out"
    result = dragon_latency.run(
        out=out, quick=True, model="tiny-qwen2", cloud_model="tiny-qwen2-b", delays=(0.0,),
        tokens=3, methods=("crcg-cloud", "dragon-side-static"), net_name="tandem-dbtest2",
        **corpora,
    )  # fmt: skip
    setup = json.loads((out / "dragon_latency.json").read_text())["setup"]
    assert (setup["model"], setup["cloud_model"]) == ("tiny-qwen2", "tiny-qwen2-b")
    assert setup["both_sides_same_model"] is False
    assert all(len(r["tokens"]) == 3 for r in result["runs"])
    models = {}
    for argv in started:
        for side in ("cloud", "testbed"):
            if f"tandem.baselines.dragon.{side}" in argv:
                models[side] = argv[argv.index("--model") + 1]
    assert models == {"cloud": "tiny-qwen2-b", "testbed": "tiny-qwen2"}  # testbed: the device


def test_a_busy_device_runs_burners_on_the_device_cores_for_the_whole_run(tmp_path, monkeypatch):
    """`--busy-device`: burners of the device's model decode on the device's cores (pinned and
    placed as the device worker is) from the bed's start to the last run; the result keeps
    their steps and says in its headline that the run is a testbed variant."""
    from benchmarks import dragon_latency
    from tandem.baselines.dragon import testbed
    from tandem.errors import TandemError

    index = tmp_path / "index"
    with pytest.raises(TandemError, match="busy_device must be >= 0"):
        testbed.Testbed(model="m", public_index=index, private_index=index, busy_device=-1)
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    corpora = write_corpora(tmp_path)
    started = record_launches(monkeypatch)
    out = tmp_path / "out"
    result = dragon_latency.run(
        out=out, quick=True, model="tiny-qwen2", delays=(0.0,), tokens=3, busy_device=1,
        methods=("crcg-device", "dragon-side-static"), net_name="tandem-dbtest3", **corpora,
    )  # fmt: skip

    def launched(module: str) -> list[list[str]]:
        return [argv for argv in started if f"tandem.baselines.dragon.{module}" in argv]

    (worker,), (burner,) = launched("testbed"), launched("burner")
    where = worker[: worker.index("tandem.baselines.dragon.testbed") - 2]  # namespace, cores
    assert burner[: burner.index("tandem.baselines.dragon.burner") - 2] == where
    assert burner[burner.index("--model") + 1] == "tiny-qwen2"
    busy = json.loads((out / "dragon_latency.json").read_text())["setup"]["busy_device"]
    assert busy["burners"] == 1 and busy["model"] == "tiny-qwen2"
    (stats,) = busy["stats"]  # it decoded through the warm-up and both runs, then stopped
    assert stats["steps"] > 0 and stats["burning"] is False
    assert result["headline"][0].startswith("a busy device (1 burner(s) decoding on its cores)")
    assert "median draft time device" in result["headline"][0]
    plain = dragon_latency.busy_line([], [])  # no DRAGON runs: no draft times to compare
    assert plain == "a busy device (0 burner(s) decoding on its cores): a testbed variant"


def test_target_lines_give_three_decimals_and_say_met_or_missed():
    """1.103x is not "1.10x": the headline says which side of the line a ratio falls."""
    from benchmarks.dragon_latency import targets

    def row(method, delay, per_token, ttft=1.0):
        return {"method": method, "delay_ms": delay, "per_token_s": per_token, "ttft_s": ttft}

    mirror = "dragon-side-static-mirror"
    rows = [
        row("crcg-device", 0.0, 0.0333), row(mirror, 0.0, 0.0367, ttft=0.75),
        row("crcg-device", 300.0, 0.0337), row(mirror, 300.0, 0.0400),
    ]  # fmt: skip
    lines = targets(rows, theory=[])
    assert any("+0 ms:" in x and "per-token 1.102x" in x and "missed" in x for x in lines), lines
    assert any("+300 ms:" in x and "per-token 1.187x" in x and ": met" in x for x in lines), lines
    assert any("TTFT 0.750x" in x and ": met" in x for x in lines), lines
    assert not any("testbed control" in x for x in lines), lines  # only when it ran
    # each target at the delay it names: a run of +0 alone gets no "<= 1.20x" line, one of
    # +0 and +200 none either (the +300 target is not the +200 one)
    for last in (0.0, 200.0):
        some = [r for r in rows if r["delay_ms"] == 0.0] + [
            {**r, "delay_ms": last} for r in rows if r["delay_ms"] == 300.0
        ] * (last > 0)
        lines = targets(some, theory=[])
        assert sum("target <=" in x for x in lines) == 2, lines  # +0 per token, +0 TTFT
        assert not any("1.20x" in x for x in lines), lines


def test_the_contention_control_gets_a_ratio_and_no_verdict():
    from benchmarks.dragon_latency import CONTROL, targets

    rows = [
        {"method": m, "delay_ms": 0.0, "per_token_s": t, "ttft_s": 1.0}
        for m, t in (
            ("crcg-device", 0.035),
            (CONTROL, 0.037),
            ("dragon-side-static-mirror", 0.0388),
        )
    ]
    lines = [x for x in targets(rows, theory=[]) if "testbed control" in x]
    assert len(lines) == 1 and "per-token 1.049x" in lines[0] and "(no target)" in lines[0]


def test_the_burner_decodes_between_on_and_off(tmp_path, monkeypatch):
    """`Testbed.contended`'s burner: decoding once "on" is answered, stopped with its step
    count once "off" is; a model that cannot load is an exit, reported, not a hang."""
    import subprocess
    import sys

    from tandem.baselines.dragon.testbed import _read_answer
    from tandem.errors import TandemError

    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    argv = [sys.executable, "-m", "tandem.baselines.dragon.burner", "--threads", "1"]
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True, "bufsize": 1}
    with subprocess.Popen([*argv, "--model", "tiny-qwen2"], **pipes) as burner:
        assert _read_answer(burner, "burner")["ready"]
        answers = []
        for command in ("on", "off", "on", "off"):
            burner.stdin.write(command + "\n")
            burner.stdin.flush()
            answers.append(_read_answer(burner, "burner"))
        burner.stdin.close()
    assert [a["burning"] for a in answers] == [True, False, True, False]
    assert answers[1]["steps"] >= 1 and answers[1]["ms_per_step"] > 0
    pipes["stderr"] = subprocess.DEVNULL
    with subprocess.Popen([*argv, "--model", "no-such-model"], **pipes) as broken:
        with pytest.raises(TandemError, match="burner exited"):
            _read_answer(broken, "burner")


def test_a_failed_burner_is_a_one_line_error(tmp_path):
    """The burner answers a failure (e.g. its decode raised) with "error"; the bed raises it."""
    import io
    from types import SimpleNamespace

    from tandem.baselines.dragon.testbed import MARK, Testbed
    from tandem.errors import TandemError

    bed = Testbed(
        model="m", public_index=tmp_path, private_index=tmp_path, cpus={"device": [0], "cloud": [1]}
    )
    answer = MARK + json.dumps({"burning": False, "error": "RuntimeError: boom"}) + "\n"
    bed.burner = SimpleNamespace(stdin=io.StringIO(), stdout=io.StringIO(answer))
    with pytest.raises(TandemError, match="burner failed: RuntimeError: boom"):
        bed._burn(bed.burner, "on")
    assert bed.burner.stdin.getvalue() == "on\n"
