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


@pytest.mark.slow
def test_quick_latency_and_ttft_runs(tmp_path, monkeypatch):
    from benchmarks import dragon_latency, dragon_ttft

    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    corpora = {}
    for name, texts in (("public", CLOUD_TEXTS), ("private", DEVICE_TEXTS)):
        folder = tmp_path / name
        folder.mkdir()
        for number, text in enumerate(texts):
            (folder / f"{name}{number}.txt").write_text(text + "\n")
        corpora[name] = str(folder)
    out = tmp_path / "out"
    common = {"out": out, "quick": True, "model": "tiny-qwen2", "net_name": "tandem-dbtest"}
    latency = dragon_latency.run(delays=(0.0, 20.0), tokens=4, **common, **corpora)
    saved = json.loads((out / "dragon_latency.json").read_text())
    assert (out / "dragon_latency.png").stat().st_size > 0
    assert saved["setup"]["network"]["mode"] in ("netns", "loopback")
    sets = plan()  # each side a process on its own cores, as it saw itself
    assert saved["machines"]["cpus"] == sets
    for role in ("device", "cloud"):
        seen = saved["machines"]["observed"][role]
        assert seen["cpus"] == sets[role] and seen["engine_threads"] == len(sets[role])
    runs = latency["runs"]
    assert {(r["method"], r["delay_ms"]) for r in runs} == {
        (m, d) for m in dragon_latency.METHODS for d in (0.0, 20.0)
    }
    assert all(len(r["tokens"]) == 4 and len(r["token_times"]) == 4 for r in runs)
    by = {(r["method"], r["delay_ms"]): r["tokens"] for r in runs}
    # one model on both sides: token-wise synchronised aggregation = DRAGON, at every delay
    assert by[("drdg-tw", 0.0)] == by[("dragon", 0.0)] == by[("dragon", 20.0)]
    assert [r["delay_ms"] for r in latency["theorem_6_2"]] == [0.0, 20.0]
    assert all(r["predicted_speedup"] >= 1 for r in latency["theorem_6_2"])
    # every run notes the load; DRAGON runs carry both sides' timelines, averaged per delay
    assert all(r["load_1min"] >= 0 for r in saved["runs"])
    for run in (r for r in saved["runs"] if r["method"] == "dragon"):
        for key in ("timeline", "peer_timeline"):
            assert run["summary"][key]["tokens"] == 4
    rows = {(r["delay_ms"], r["side"]): r for r in saved["timeline"]}
    assert set(rows) == {(d, s) for d in (0.0, 20.0) for s in ("device", "cloud")}
    assert all(r["work_ms_per_token"]["decode"] > 0 for r in rows.values())

    ttft = dragon_ttft.run(delays=(0.0,), **common, **corpora)
    assert (out / "dragon_ttft.png").stat().st_size > 0
    moved = {r["method"]: r["transfer_bytes"] for r in ttft["table"]}
    assert moved["drcg-kv"] > moved["drcg-text"] > 0 and moved["dragon"] == 0
    tokens = {r["method"]: r["tokens"] for r in ttft["runs"]}
    assert tokens["drcg-kv"] == tokens["drcg-text"]
    assert all(r["ttft_s"] > 0 for r in ttft["table"])
