"""A sweep's results from its fold log: the trials table, the chosen trial, the pooled
out-of-sample verdict, and the files written at the end of a run (folds.csv,
equity.png, results.json, the last screen).

    records = load_records(storage)        # {(trial_id, fold): FoldRecord flat dict} from folds.jsonl
    best = best_trial(records, n_folds)    # the trial the sweep picked (highest score)
    write_results(storage, sweep, records, ...)   # the files, and the parent run's summary

No Ray and no mlflow here: the driver calls it after Tune, tests call it on any folds.jsonl.
"""

from __future__ import annotations

import csv
import json
import math
import sys
import time
from pathlib import Path

from fxray.data.atomic import atomic_path
from fxray.eval import pooled, selection
from fxray.track.records import CSV_COLUMNS, FoldRecord, fold_checkpoints, with_baselines
from fxray.track.report import closing_lines, equity_png, market_info, print_last_screen, seed_spread
from fxray.track.timing import time_breakdown
from fxray.track.verdict import eval_trials, json_ready, sentence, snooping_verdict
from fxray.track.verdict import metrics as verdict_metrics
from fxray.track.verdict import text as verdict_text

DEFAULT_PPY = 6261.0  # periods per year of a 24x5 market, for sweeps that did not log theirs
REFERENCES = ("oracle", "ridge", "screened", "buy_and_hold")  # the rules beside every policy (fxray.eval.baselines)


def trial_label(trial_id: str) -> str:
    """Tune's trial id 'a1b2c3d4' -> 'trial-a1b2c3d4' (the MLflow run name)."""
    return "trial-" + trial_id.replace("_", "-")


def fmt_s(s: float) -> str:
    s = int(max(s, 0))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


# --- the sweep's fold records (folds.jsonl, written by the driver) ---------------------


def load_records(storage) -> dict:
    """{(trial_id, fold): record} from folds.jsonl; a fold logged twice keeps its last line."""
    path, cache = Path(storage) / "folds.jsonl", {}
    records = [json.loads(line) for line in (path.read_text().splitlines() if path.exists() else []) if line.strip()]
    return {(r["trial_id"], r["fold"]): with_baselines(storage, r, cache) for r in records}


def trials_table(records: dict) -> dict:
    """{trial_id: {"config", "folds": [records in fold order], "folds_done", "score", "status"}}:
    cheap (the progress line calls it per fold); the pooled statistics are `pooled_stats`."""
    trials: dict = {}
    for (tid, _), rec in sorted(records.items()):
        t = trials.setdefault(tid, {"trial_id": tid, "config": rec["config"], "folds": []})
        t["folds"].append(rec)
    for t in trials.values():
        f = t["folds"]
        t["status"] = "ok" if all(r["status"] == "ok" for r in f) else "diverged"
        # a diverged trial has no score (its Tune score, fxray.sweep.trial.DIVERGED, is a stand-in)
        t["folds_done"], t["score"] = len(f), f[-1]["score"] if t["status"] == "ok" else None
        t["mean_val_sharpe"], t["mean_test_sharpe"] = f[-1].get("mean_val_sharpe"), f[-1].get("mean_test_sharpe")
    return trials


def chosen(trials, n_folds: int | None = None) -> dict | None:
    """The trial the sweep picks: the highest score (the sweep's objective), among trials that
    ran every fold when any did; never a trial that diverged (None when every trial did).
    `trials`: trials_table's values, or fxray.compare's trials read from MLflow."""
    ok = [t for t in trials if t["status"] == "ok" and t["score"] is not None]
    full = [t for t in ok if n_folds and t["folds_done"] >= n_folds]
    return max(full or ok, key=lambda t: t["score"]) if ok else None


def best_trial(records: dict, n_folds: int | None = None) -> dict | None:
    """`chosen` among the trials of folds.jsonl's records."""
    return chosen(trials_table(records).values(), n_folds)


def pooled_stats(trial: dict, cost: float, periods_per_year: float) -> dict:
    """A trial's pooled val and test statistics, the references' on the same test windows,
    and its share of the oracle (None without one)."""
    folds = [FoldRecord.from_flat(r) for r in trial["folds"]]
    ok = [f for f in folds if f.ok]
    out = {w: pooled.pooled([getattr(f, f"{w}_periods") for f in ok], cost, periods_per_year) for w in ("val", "test")}
    refs, ref_windows = {}, {}
    for name in REFERENCES:
        windows = [f.baseline_periods[name]["test"] for f in ok if name in f.baseline_periods]
        if windows and len(windows) == len(ok):
            refs[name], ref_windows[name] = pooled.pooled(windows, cost, periods_per_year), windows
    test, test_windows = out["test"], [f.test_periods for f in ok]
    for key, name in (("oracle_share", "oracle"), ("ridge_share", "ridge")):
        test[key] = pooled.oracle_share(test, refs.get(name))
        test[f"{key}_se"] = pooled.oracle_share_se(test_windows, ref_windows[name]) if test[key] is not None else None
    linear = {  # the learner's value: over the better by val of the supervised rules, on the same test days
        n: {w: [f.baseline_periods[n][w] for f in ok if w in f.baseline_periods[n]] for w in ("val", "test")}
        for n in ref_windows
        if n in pooled.SUPERVISED_RULES
    }
    test.update(pooled.minus_linear(test, test_windows, linear, cost, periods_per_year))
    out["baselines"] = refs
    return out


def judge(trials: list, best: dict, n_folds: int, cost: float, ppy: float, n_started: int):
    """The trials' pooled statistics, and the chosen trial out of sample: its test Sharpe
    deflated by the N trials started, the walk-forward selection (each test window's trial
    chosen on the val windows before it) and the verdict in one answer (docs/metrics.md).
    Returns (stats {trial id: pooled_stats}, the chosen trial's block: its pooled_stats with
    fxray.eval.selection.deflated's keys and "walk_forward", verdict)."""
    stats = {t["trial_id"]: pooled_stats(t, cost, ppy) for t in trials}
    b = stats[best["trial_id"]]
    deflated = selection.deflated(b["test"], [s["test"] for s in stats.values()], n_started)
    walk = selection.walk_forward(eval_trials([t for t in trials if t["status"] == "ok"])[0], n_folds, cost, ppy)
    verdict = snooping_verdict(trials, n_folds, ppy, {**deflated, "trial_id": best["trial_id"], "test": b["test"]})
    return stats, {**b, **deflated, "walk_forward": walk}, verdict


def write_results(
    storage,
    sweep: dict,
    records: dict,
    worker_stats: list,
    wall_s: float,
    json_path=None,
    started: float | None = None,
    phases: dict | None = None,
    periods_per_year: float | None = None,
    n_trials_started: int | None = None,
    ensemble=None,
    asha: dict | None = None,
) -> dict:
    """folds.csv, equity.png and results.json in the run directory (and --json), the last
    screen on stdout; returns the parent run's summary metrics and artifacts.
    `ensemble(results) -> dict`, if given, fills results["ensemble"] (fxray.sweep.vote).
    `asha` ({"grace_folds", "reduction_factor", "rungs": folds done at each rung}, None where no
    scheduler stopped trials) fills results["asha"] with the trials stopped at each rung."""
    storage, n_folds, phases = Path(storage), len(sweep["folds"]), phases or {}
    trials = trials_table(records)
    if not trials:
        print("no trial finished a fold")
        return {"mlflow_summary": {}, "artifacts": []}
    cost = sweep["base"]["cost"]
    ppy = periods_per_year or sweep.get("calendar", {}).get("periods_per_year", DEFAULT_PPY)
    best = chosen(trials.values(), n_folds)
    rows = [
        {
            "trial_id": tid,
            "config": {**sweep["base"], **t["config"]},
            "sampled": t["config"],
            **{k: t[k] for k in ("folds_done", "status", "score")},
            "folds": [FoldRecord.from_flat(r).results_json() for r in t["folds"]],
        }
        for tid, t in trials.items()
    ]
    results = {
        "experiment": sweep["experiment"],
        "profile": sweep["profile"],
        "storage": str(storage),
        "tracking_uri": sweep.get("mlflow", {}).get("uri"),
        "data": {**sweep["data"], **market_info(sweep["data"].get("path"))},
        "folds": sweep["folds"],
        "base_config": sweep["base"],
        "rounds": sweep["rounds"],
        "started": started,
        "phases": phases,
        "wall_s": wall_s,
        "time_breakdown": None if started is None else time_breakdown(started, wall_s, phases, worker_stats, rows),
        "workers": worker_stats,
        "n_trials": len(trials),
        "trials": rows,
        "best": None,
    }
    if best is None:  # every trial diverged: results.json says so (no chosen trial, no verdict)
        write_json(storage, json_path, results)
        print(f"\nno chosen trial: all {len(trials)} trials diverged (see {storage / 'results.json'})")
        return {"mlflow_summary": {"n_trials": len(trials)}, "artifacts": []}
    names = sorted({k for t in trials.values() for k in t["config"]})
    # --- fold table: one row per trial x fold -------------------------------------
    with open(storage / "folds.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["trial", *CSV_COLUMNS, *names])
        for t in trials.values():
            for r in t["folds"]:
                row = FoldRecord.from_flat(r).csv_row()
                w.writerow([trial_label(t["trial_id"]), *row, *(t["config"].get(n, "") for n in names)])
    # --- the verdict: the best trial out of sample, deflated, and choosing in real time ----
    n_started = max(n_trials_started or 0, len(trials))
    stats, judged, verdict = judge(list(trials.values()), best, n_folds, cost, ppy, n_started)
    best_folds = [FoldRecord.from_flat(r) for r in best["folds"]]
    title = f"{sweep['experiment']}: chosen {trial_label(best['trial_id'])}, test windows (out of sample)"
    equity = equity_png(storage / "equity.png", best_folds, title)
    # --- results.json -------------------------------------------------------------------
    results.update(n_trials_started=n_started, periods_per_year=ppy)
    for row, (tid, t) in zip(results["trials"], trials.items()):
        row["stopped_early"] = t["folds_done"] < n_folds and t["status"] == "ok"
        row.update({k: t[k] for k in ("mean_val_sharpe", "mean_test_sharpe")}, val=stats[tid]["val"])
        row["test"] = stats[tid]["test"]
    if asha is not None:
        results["asha"] = {**asha, "stopped_per_rung": stopped_per_rung(results["trials"], asha["rungs"])}
    results["best"] = {
        "config": {**sweep["base"], **best["config"]},
        "sampled": best["config"],
        **{k: best[k] for k in ("trial_id", "folds_done", "score", "mean_val_sharpe", "mean_test_sharpe")},
        **judged,  # val, test and the references' (baselines) pooled statistics, DSR, walk-forward
        "seed_spread": seed_spread(best["folds"]),  # None unless seeds > 1
    }
    results["verdict"] = json_ready(verdict)  # fxray.sweep.placebo adds the placebo sweeps' p-value
    results["selection"] = val_test_ranks(results["trials"], n_folds)
    if ensemble is not None:
        results["ensemble"] = run_ensemble(ensemble, results)
        if "test" in results["ensemble"]:  # deflated as the best trial is: see below
            d = selection.deflated(results["ensemble"]["test"], [s["test"] for s in stats.values()], n_started)
            results["ensemble"].update({k: d[k] for k in ("dsr", "sr0", "n_trials_counted")})
    write_json(storage, json_path, results)
    if asha is not None:
        print(asha_line(results["asha"], results["trials"], n_folds))
    print(selection_line(results["selection"]))
    print_last_screen(results, names, n_folds)
    print(verdict_text(verdict, with_sentence=False))  # the evidence; the sentence closes the screen
    print("\n" + "\n".join(closing_lines(results, sentence(verdict))))
    ckpt = max((f for f in best_folds if f.ok and f.checkpoint), key=lambda f: f.val_score, default=None)
    artifacts = [(None, storage / "folds.csv"), (None, equity)]
    if ckpt is not None:  # a seed ensemble's fold: every member's
        weights = fold_checkpoints(Path(ckpt.checkpoint).parent, ckpt.fold) or [Path(ckpt.checkpoint)]
        artifacts += [("best_checkpoint", f) for w in weights for f in (w, w.with_suffix(".json"))]
    test = judged["test"]
    keys = ("sharpe", "sharpe_se", "psr", "oracle_share", "oracle_share_se", "break_even_cost", "flat_windows")
    summary = {
        "best_score": best["score"],
        **{f"best_test_{k}": test.get(k) for k in (*keys, "minus_linear", "minus_linear_se")},
        "best_test_dsr": judged["dsr"],
        "n_trials": len(trials),
        "n_trials_counted": n_started,
        "walk_forward_test_sharpe": (judged["walk_forward"] or {}).get("sharpe"),
        "wall_s": wall_s,
        "periods_per_year": ppy,
    }
    summary.update({f"{name}_test_sharpe": s["sharpe"] for name, s in judged["baselines"].items()})
    vote = results.get("ensemble") or {}
    if "test" in vote:
        summary.update({f"ensemble_test_{k}": vote["test"][k] for k in ("sharpe", "sharpe_se", "oracle_share")})
        summary.update(ensemble_test_dsr=vote.get("dsr"), ensemble_members=vote["n_members"])
    summary.update(verdict_metrics(verdict), spearman_val_test=results["selection"]["spearman_val_test"])
    return {"mlflow_summary": {k: v for k, v in summary.items() if v is not None}, "artifacts": artifacts}


def val_test_ranks(trials: list, n_folds: int) -> dict:
    """Whether choosing on val carried information: Spearman's rank correlation between the
    score that chose (the pooled val score) and the pooled test Sharpe, over the trials that
    ran every fold (results.json's trials, with their pooled `test`); None below 3 of them."""
    full = [t for t in trials if t["status"] == "ok" and t["folds_done"] >= n_folds and t["score"] is not None]
    rho = selection.spearman([t["score"] for t in full], [t["test"]["sharpe"] for t in full])
    return {"spearman_val_test": rho, "n_trials": len(full)}


def selection_line(ranks: dict) -> str:
    """The last screen's line on it, with the spread a rank correlation of n unrelated pairs has."""
    n, rho = ranks["n_trials"], ranks["spearman_val_test"]
    if rho is None:
        return f"selection: did val rank the trials as test did? needs 3 trials that ran every fold ({n} did)"
    return (
        f"selection: did val rank the trials as test did? Spearman(val score, test Sharpe) {rho:+.2f} "
        f"over the {n} trials that ran every fold (unrelated trials: 0 ± {1 / math.sqrt(n - 1):.2f})"
    )


def stopped_per_rung(trials: list, rungs: list) -> list[int]:
    """The trials stopped early (results.json's `stopped_early`) at each rung (folds done)."""
    return [sum(t.get("stopped_early", False) and t["folds_done"] == r for t in trials) for r in rungs]


def asha_line(asha: dict, trials: list, n_folds: int) -> str:
    """The last screen's line on ASHA: how many trials each rung stopped."""
    full = sum(t["folds_done"] == n_folds for t in trials)
    ran = f"{full} of {len(trials)} ran all {n_folds} folds"
    if not asha["rungs"]:
        return f"ASHA off (grace_folds {asha['grace_folds']} of {n_folds} folds): {ran}"
    stops = ", ".join(f"{n} at fold {r}" for n, r in zip(asha["stopped_per_rung"], asha["rungs"]))
    return f"ASHA stopped trials at its rungs: {stops}; {ran}"


def run_ensemble(ensemble, results: dict) -> dict:
    """results["ensemble"]: what `ensemble(results)` returns; its failure is recorded, not
    raised (the sweep's own results are written either way). write_results deflates the vote's
    test Sharpe as the best trial's is (fxray.eval.selection.deflated: the same trials' Sharpe
    variance and N): the vote is one policy, but its members are the trials that ASHA kept on
    their val scores among the N started, so its PSR alone overstates the evidence as the best
    trial's would (on the CPU twin of 2026-12-03 a vote reached PSR 0.986 where the best trial's
    DSR was 0.04: docs/benchmarks.md "Demonstrations")."""
    t0 = time.time()
    print("voting: the trials that ran every fold, as one policy (fxray.sweep.vote) ...", file=sys.stderr, flush=True)
    try:
        out = ensemble(results)
    except Exception as e:  # noqa: BLE001 (an extra line of the report must not lose the sweep's results)
        out = {"skipped": f"failed: {type(e).__name__}: {e}"}
    out["wall_s"] = time.time() - t0
    return out


def write_json(storage: Path, json_path, results: dict) -> None:
    """results.json in the run directory, and a copy at --json: one line per top-level key
    (json's C encoder; with `indent` the pure-Python one took seconds on a GPU sweep's ~40 MB)."""
    text = "{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in results.items()) + "\n}\n"
    for path in [storage / "results.json", *([json_path] if json_path else [])]:
        with atomic_path(path) as tmp:  # whole or not at all
            tmp.write_text(text)
