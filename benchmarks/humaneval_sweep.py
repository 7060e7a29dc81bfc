"""`tandem bench humaneval-sweep`: one table over `tandem bench humaneval` runs at several RTTs.

Reads the result files (unchanged) and derives, per RTT:
- every mode's end-to-end tokens/s (generated tokens / generation time, TTFT included) and
  decode rate (1000 / mean time per output token after the first), next to
  `speedup_vs_cloud_ar` and `speedup_vs_device_only`;
- `adaptive_vs_best_fixed`: spec-adaptive's tokens/s over the best of the fixed exact modes in
  that run (cloud AR, PicoSpec, eager; device-only is not exact, so it is reported beside);
- the extended Eq. 9 (`tandem.protocols.spec.planner.throughput`) predicted decode rate of
  ar, async and eager from the costs measured in the same run: t_draft = the spec modes' mean
  drafting time per token, t_ar = cloud AR's mean time per token, the verification line
  through t_ar and the time of a `draft_len` block's pass (on the line fitted to the cloud's
  passes where the file has them, else the mean pass of spec-async), the RTT of the run,
  and each mode's own pooled acceptance rate; `model_error` = predicted / measured - 1;
- `epoch_model`: the epoch model's (`tandem.protocols.spec.epochs`, our pipelines' own rules)
  decode rate of async, eager and eager with branches (`spec-eager-branch`, its branches priced
  with the rates its own runs counted), from the same run's draft step, RTT and the cloud's passes
  (a line fitted to each pass's drafts and time, `cloud_passes`; result files recorded before
  the bench kept them have no such check);
- `exactness`: per exact mode, whether its pass@1 equals cloud AR's and in how many problems
  its tokens or completions leave AR's; `divergences`: where (the run's own records). With
  `--margins` the sweep loads the cloud model and adds the target's logit margins at each
  divergence the run did not measure (`humaneval.measure_margins`; runs with `--no-margins`).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any

from benchmarks.report import new_figure, save_json, save_png
from tandem.errors import TandemError

FIXED = ("ar", "spec-async", "spec-eager", "spec-eager-branch")  # exact modes, fixed plans
MODEL = {"ar": "ar", "spec-async": "async", "spec-eager": "eager"}  # the closed forms' methods
PASSES = (*MODEL, "spec-eager-branch")  # modes whose cloud passes the pass line is fitted to


def _mean(values: list[float]) -> float | None:
    values = [v for v in values if v]
    return statistics.mean(values) if values else None


def summarize(payload: dict[str, Any]) -> dict[str, Any]:
    """The derived record of one humaneval result (module doc)."""
    from tandem.protocols.spec.planner import Costs, throughput

    setup, table = payload["setup"], {row["mode"]: row for row in payload["table"]}
    runs = payload["runs"]
    per_mode: dict[str, dict[str, Any]] = {}
    for mode, row in table.items():
        tpot = _mean([r["tpot_ms"] for r in runs if r["mode"] == mode])
        drafted = sum(r["drafted"] for r in runs if r["mode"] == mode)
        per_mode[mode] = {
            "tokens_per_s": row["tokens_per_s"],
            "decode_tok_s": 1000.0 / tpot if tpot else None,
            "pass_at_1": row["pass_at_1"],
            "speedup_vs_cloud_ar": row["tokens_per_s"] / table["ar"]["tokens_per_s"]
            if "ar" in table
            else None,
            "speedup_vs_device_only": row["tokens_per_s"] / table["local"]["tokens_per_s"]
            if "local" in table
            else None,
            "acceptance_rate": row.get("acceptance_rate"),
            "drafted": drafted,
        }
    record: dict[str, Any] = {"rtt_ms": setup["rtt_ms"], "modes": per_mode}
    fixed = {m: per_mode[m]["tokens_per_s"] for m in FIXED if m in per_mode}
    if fixed:
        best = max(fixed, key=fixed.get)
        record["best_fixed"] = best
        if "spec-adaptive" in per_mode:
            adaptive = per_mode["spec-adaptive"]["tokens_per_s"]
            record["adaptive_vs_best_fixed"] = adaptive / fixed[best]
            plans = [r["plan_after"] for r in runs if r["mode"] == "spec-adaptive"]
            record["adaptive_last_plan"] = plans[-1] if plans else None
    spec_runs = [r for r in runs if r["mode"] in ("spec-async", "spec-eager") and r["drafted"]]
    t_draft = _mean([r["t_draft_token_ms"] for r in spec_runs])
    t_verify = _mean([r["t_verify_ms"] for r in runs if r["mode"] == "spec-async"])
    verify_source = "mean verification pass of spec-async (passes of mixed sizes)"
    line = _pass_line(runs)
    if line:  # a draft_len block's pass on the line fitted to the passes
        t_verify = line[0] + line[1] * int(setup["draft_len"])
        verify_source = "a draft_len block on the line fitted to the cloud's passes"
    t_ar = _mean([r["tpot_ms"] for r in runs if r["mode"] == "ar"])
    if t_draft and t_verify and t_ar:
        block = int(setup["draft_len"])
        costs = Costs.from_points(
            t_draft=t_draft / 1e3, t_ar=t_ar / 1e3, t_block=t_verify / 1e3, block=block,
            rtt=setup["rtt_ms"] / 1e3,
        )  # fmt: skip
        model = {"t_draft_ms": t_draft, "t_ar_ms": t_ar, "t_verify_block_ms": t_verify,
                 "t_verify_source": verify_source, "block": block, "per_mode": {}}  # fmt: skip
        for mode, method in MODEL.items():
            if mode not in per_mode or not per_mode[mode]["decode_tok_s"]:
                continue
            alpha = per_mode[mode]["acceptance_rate"] or 0.0
            predicted = throughput(method, alpha, block, costs)
            measured = per_mode[mode]["decode_tok_s"]
            model["per_mode"][mode] = {
                "alpha": alpha, "predicted_decode_tok_s": predicted,
                "measured_decode_tok_s": measured, "model_error": predicted / measured - 1.0,
            }  # fmt: skip
        record["eq9"] = model
    if epoch := _epoch_check(setup, line, per_mode, t_draft, runs):
        record["epoch_model"] = epoch
    exactness = payload.get("exactness") or {}
    record["exactness"] = exactness.get("per_mode")
    record["divergences"] = [dict(d) for d in exactness.get("divergences", [])]
    return record


def _add_margins(records: list[dict], payloads: list[dict]) -> None:
    """The target's margins at every divergence without one (module doc), one model load."""
    from benchmarks import humaneval_tasks as tasks
    from benchmarks.humaneval import measure_margins
    from tandem.models.registry import load_model

    todo = [(r, p) for r, p in zip(records, payloads, strict=True)
            if any("target_top2_margin" not in d for d in r["divergences"])]  # fmt: skip
    if not todo:
        return
    names = {p["setup"]["cloud_model"] for _, p in todo}
    if len(names) > 1:
        raise TandemError(f"--margins needs one cloud model; the files name {sorted(names)}")
    target = load_model(names.pop(), progress=False)
    prompts = {p["task_id"]: p["prompt"] for p in tasks.load_problems()}
    for record, payload in todo:
        ids = {t: target.tokenizer.encode(prompts[t]) for t in payload["setup"]["problems"]}
        missing = [d for d in record["divergences"] if "target_top2_margin" not in d]
        measure_margins(missing, payload["runs"], ids, target)
        for d in missing:
            d["margin_source"] = "humaneval-sweep --margins (after the run)"


def _pass_line(runs: list[dict]) -> tuple[float, float] | None:
    """(ms of a pass with no drafts, ms per draft): least squares over the cloud's passes of
    the spec modes (`cloud_passes`, recorded by the bench since it exists); None without two
    pass sizes."""
    points = []
    for r in runs:
        if r["mode"] in PASSES and "cloud_passes" in r:
            passes = r["cloud_passes"]
            points += zip(passes["drafts"], passes["verify_ms"], strict=True)
    if len({n for n, _ in points}) < 2:
        return None
    slope, intercept = statistics.linear_regression(*zip(*points, strict=True))
    return intercept, slope


def _epoch_check(setup, line, per_mode, t_draft, runs) -> dict[str, Any] | None:
    """The epoch model's (tandem.protocols.spec.epochs) decode rate of async, eager and eager
    with branches from the pass line, the draft step and the RTT of this run, against the
    measured one; eager-branch's branches priced with its own counts (`branching_of`)."""
    from tandem.protocols.spec import epochs
    from tandem.protocols.spec.planner import Costs

    if line is None or not t_draft:
        return None
    base_ms, per_ms = line
    costs = Costs(t_draft=t_draft / 1e3, decode_base=(base_ms - per_ms) / 1e3,
                  decode_per_token=per_ms / 1e3, rtt=setup["rtt_ms"] / 1e3)  # fmt: skip
    block = int(setup["draft_len"])
    check = {"pass_ms": {"no_drafts": base_ms, "per_draft": per_ms},
             "t_draft_ms": t_draft, "block": block, "per_mode": {}}  # fmt: skip
    for mode in ("spec-async", "spec-eager"):
        if mode not in per_mode or not per_mode[mode]["decode_tok_s"]:
            continue
        alpha = per_mode[mode]["acceptance_rate"] or 0.0
        predicted = epochs.rate(MODEL[mode], alpha, block, costs)
        measured = per_mode[mode]["decode_tok_s"]
        check["per_mode"][mode] = {
            "alpha": alpha, "predicted_decode_tok_s": predicted,
            "measured_decode_tok_s": measured, "model_error": predicted / measured - 1.0,
        }  # fmt: skip
    mode = "spec-eager-branch"
    branching = branching_of(runs, mode, setup)
    if mode in per_mode and per_mode[mode]["decode_tok_s"] and branching is not None:
        alpha = per_mode[mode]["acceptance_rate"] or 0.0
        predicted = epochs.branch_rate(alpha, block, costs, branching)
        measured = per_mode[mode]["decode_tok_s"]
        check["per_mode"][mode] = {
            "alpha": alpha, "branching": dataclasses.asdict(branching),
            "predicted_decode_tok_s": predicted, "measured_decode_tok_s": measured,
            "model_error": predicted / measured - 1.0,
            "predicted_branch_gain": epochs.branch_gain(alpha, block, costs, branching),
        }  # fmt: skip
    return check


def branching_of(runs: list[dict], mode: str, setup: dict):
    """A mode's branch rates from its runs' counts (`runs[].branches.confidence`, summed):
    planner.Branching, or None where the runs counted nothing (no branches, older files)."""
    from tandem.protocols.spec.planner import Branching

    keys = ("match", "unsure_match", "miss", "unsure_miss", "second")
    totals = dict.fromkeys(keys, 0)
    for r in runs:
        if r["mode"] == mode and "confidence" in r.get("branches", {}):
            for key in keys:
                totals[key] += r["branches"]["confidence"][key]
    if not totals["match"] or not totals["miss"]:
        return None
    length = setup.get("modes", {}).get(mode, {}).get("branch_len", 4)
    return Branching(
        unsure_match=totals["unsure_match"] / totals["match"],
        unsure_miss=totals["unsure_miss"] / totals["miss"],
        second=totals["second"] / totals["unsure_miss"] if totals["unsure_miss"] else 0.0,
        length=length,
    )


def run(
    paths: list[Path], *, out: Path, name: str = "humaneval_sweep", margins: bool = False
) -> dict[str, Any]:
    if not paths:
        raise TandemError("give one or more `tandem bench humaneval` result files")
    records, sources, payloads = [], [], []
    for path in paths:
        try:
            payload = json.loads(Path(path).read_text())
            records.append(summarize(payload))
        except (OSError, ValueError, KeyError) as exc:
            raise TandemError(f"{path}: not a humaneval result ({exc})") from None
        payloads.append(payload)
        sources.append({"file": str(path), "environment": payload.get("environment"),
                        "machines": payload.get("machines")})  # fmt: skip
    if margins:
        _add_margins(records, payloads)
    records.sort(key=lambda r: r["rtt_ms"])
    result = {"benchmark": name, "sources": sources, "per_rtt": records}
    save_json(out, name, result)
    _plot(records, out, name)
    for r in records:
        modes = ", ".join(f"{m} {v['tokens_per_s']:.2f}" for m, v in r["modes"].items())
        ratio = r.get("adaptive_vs_best_fixed")
        best = f"; adaptive / best fixed ({r.get('best_fixed')}) = {ratio:.3f}" if ratio else ""
        print(f"RTT {r['rtt_ms']:g} ms: {modes} tok/s{best}")
        for mode, e in (r["exactness"] or {}).items():
            gaps = [f"{d['target_top2_margin']:.3f}" for d in r["divergences"]
                    if d["mode"] == mode and "target_top2_margin" in d]  # fmt: skip
            print(
                f"  {mode}: pass@1 {'=' if e.get('pass_at_1_equal_ar') else '!='} ar's; "
                f"tokens leave ar's in {e.get('problems_differing_tokens', '?')} problem(s)"
                + (f" (target top-2 margins {', '.join(gaps)})" if gaps else "")
            )
    return result


def _plot(records: list[dict], out: Path, name: str) -> Path:
    fig, axes = new_figure(ncols=2, size=(5.5, 4.0))
    modes = list(dict.fromkeys(m for r in records for m in r["modes"]))
    rtts = [r["rtt_ms"] for r in records]
    for i, mode in enumerate(modes):
        ys = [r["modes"].get(mode, {}).get("tokens_per_s") for r in records]
        axes[0][0].plot(rtts, ys, "o-", color=f"C{i}", label=mode)
        model = [r.get("eq9", {}).get("per_mode", {}).get(mode) for r in records]
        if any(model):
            axes[0][1].plot(rtts, [m and m["measured_decode_tok_s"] for m in model], "o-",
                            color=f"C{i}", label=f"{mode} measured")  # fmt: skip
            axes[0][1].plot(rtts, [m and m["predicted_decode_tok_s"] for m in model], "x--",
                            color=f"C{i}", label=f"{mode} Eq. 9")  # fmt: skip
    axes[0][0].set(xlabel="RTT (ms)", ylabel="tokens/s (end to end)", title="real pair, HumanEval")
    axes[0][1].set(xlabel="RTT (ms)", ylabel="decode tokens/s", title="extended Eq. 9 vs measured")
    for ax in axes[0]:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return save_png(fig, out, name)
