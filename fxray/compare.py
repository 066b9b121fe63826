"""Compare sweeps logged in MLflow, and say whether each one's chosen trial is better than luck.

    fxray compare                                   # every fxray sweep in ./mlflow.db
    fxray compare smoke default --tracking-uri sqlite:///$PWD/mlflow.db --json compare.json
    fxray compare smoke --out compare/ --no-log     # PNGs only on disk

Per experiment (its latest sweep, i.e. parent run): the trials, the chosen trial (the one
the sweep picked: the highest score, the pooled val Sharpe of the folds it ran, among
trials that ran every fold) and, pooled over ALL its test windows at the hourly period:
its Sharpe with the standard error, PSR(0), the Deflated Sharpe Ratio with N = every trial
the sweep started, the same positions at 2x and 3x the cost, the break-even cost, the
reference rules on the same windows (the oracle when the market carries one, the ridge
rule, buy-and-hold, flat), the share of the oracle and what it adds over the supervised rule;
walk-forward selection; and the sweep's verdict in words (fxray.track.verdict). Per-fold
values are shown for the table only: a Sharpe of a 5-day window is noise. PNGs (per-fold
Sharpe, the chosen trials' equity on their test windows beside the references, Optuna's
hyperparameter importance, the verdict) go to --out and to each sweep's parent run under
compare/.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from fxray.cli import check_file_out, command_parser, fail, run_command
from fxray.eval import snooping
from fxray.track.records import FoldRecord
from fxray.track.report import fmt, plot_equity, pooled_lines, pyplot, save, share_text, sharpe_line
from fxray.track.results import DEFAULT_PPY, chosen, judge, trial_label
from fxray.track.runs import RETURNS_DIR, RETURNS_FIELDS, open_store, search_all
from fxray.track.verdict import KEYS, add_placebo, json_ready, verdict_png
from fxray.track.verdict import text as verdict_text

PLOTS = ("sharpe_by_fold.png", "equity.png", "importance.png", "verdict.png")


class CompareError(ValueError):
    """Bad input (unknown experiment, no runs, no store): one line, exit code 2."""


# --- the sweeps as MLflow holds them --------------------------------------------------------
# Each child run holds, per fold, the artifact fold_returns/fold<k>.json (fxray.track.runs: the
# hourly returns of the val and test windows and of the reference rules) and the metric `score`
# (the sweep's objective; its last point is the trial's): the numbers here are recomputed from
# what was logged, not copied from results.json.


def sweep_experiments(client) -> list[str]:
    """Names of the experiments holding at least one fxray sweep (a run tagged with its folds)."""
    exps = client.search_experiments()
    sweeps = search_all(client, [e.experiment_id for e in exps], "tags.`fxray.folds` != ''")
    ids = {r.info.experiment_id for r in sweeps}
    return [e.name for e in exps if e.experiment_id in ids]


def read_folds(client, run_id: str, dst: Path) -> list[dict]:
    """A child run's folds as FoldRecord flat dicts (enough for fxray.track.results.pooled_stats)."""
    if not client.list_artifacts(run_id, RETURNS_DIR):
        return []
    dst.mkdir(parents=True)
    local = Path(client.download_artifacts(run_id, RETURNS_DIR, str(dst)))
    folds = [json.loads(p.read_text()) for p in local.glob("fold*.json")]
    folds = [{RETURNS_FIELDS.get(k, k): v for k, v in f.items()} for f in folds]  # fold_returns' keys -> FoldRecord's
    return sorted(folds, key=lambda f: f["fold"])


def search_space(client, parent, dst: Path) -> dict:
    """Optuna distributions of the searched params, from the sweep's experiment.yaml artifact
    (logged when the parent run is created: fxray.track.runs.Tracker); {} without a readable one."""
    from fxray.rl import experiment as expmod

    if not any(a.path == "experiment.yaml" for a in client.list_artifacts(parent.info.run_id)):
        return {}
    dst.mkdir(parents=True)
    path = client.download_artifacts(parent.info.run_id, "experiment.yaml", str(dst))
    try:
        return expmod.load(path, parent.data.tags.get("fxray.profile", "gpu")).space()
    except expmod.ExperimentError:  # written by another fxray version
        return {}


def load_experiment(client, name: str, uri: str) -> dict:
    """The latest sweep of experiment `name`: its parent run, folds and trials (child runs)."""
    exp = client.get_experiment_by_name(name)
    if exp is None:
        known = ", ".join(sweep_experiments(client)) or "none"
        raise CompareError(f"experiment {name!r} not found in {uri} (fxray sweeps there: {known})")
    runs = search_all(client, [exp.experiment_id])
    sweeps = [r for r in runs if "fxray.folds" in r.data.tags and "mlflow.parentRunId" not in r.data.tags]
    parents = [r for r in sweeps if "fxray.placebo" not in r.data.tags]  # a placebo sweep is not the experiment's
    if not parents:
        raise CompareError(f"experiment {name!r} has no fxray sweep run in {uri} (run python -m fxray.tune)")
    parent = max(parents, key=lambda r: r.info.start_time)
    # the placebo sweeps of this one (fxray.tune --placebo): their best trial's pooled test Sharpe, as
    # each logged it in its parent's summary (recomputing it would download every placebo trial's folds)
    done = [r for r in sweeps if r.info.status == "FINISHED" and "best_test_sharpe" in r.data.metrics]
    placebos = [
        r.data.metrics["best_test_sharpe"] for r in done if r.data.tags.get("fxray.placebo_of") == parent.info.run_id
    ]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    trials = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in children:
            folds = read_folds(client, r.info.run_id, Path(tmp) / r.info.run_id)
            if not folds:  # a trial with no finished fold has nothing to compare
                continue
            score = client.get_metric_history(r.info.run_id, "score")
            per_fold = {
                k: {m.step: m.value for m in client.get_metric_history(r.info.run_id, k)}
                for k in ("val_sharpe", "test_sharpe", "bh_test_sharpe", "test_turnover")
            }
            trials.append(
                {
                    "trial_id": r.data.tags.get("fxray.trial_id", r.info.run_id),
                    "run_id": r.info.run_id,
                    "name": r.info.run_name,
                    "params": dict(r.data.params),
                    "folds": folds,
                    "folds_done": len(folds),
                    # no score logged (a diverged trial's): undefined, never 0
                    "score": max(score, key=lambda m: m.step).value if score else None,
                    "status": r.data.tags.get("fxray.status")
                    or ("ok" if all(f["status"] == "ok" for f in folds) else "diverged"),
                    "per_fold": per_fold,
                }
            )
        space = search_space(client, parent, Path(tmp) / "space")
    if not trials:
        raise CompareError(f"experiment {name!r}: sweep run {parent.info.run_id} has no trial with a finished fold")
    return {
        "name": name,
        "experiment_id": exp.experiment_id,
        "parent": parent,
        "n_sweeps": len(parents),
        "n_folds": len(json.loads(parent.data.tags["fxray.folds"])),
        "trials": trials,
        "placebo_best_test_sharpe": placebos,
        "space": space,
    }


def summarize(exp: dict) -> dict:
    """The comparison numbers of one loaded experiment: the best trial's pooled val and test
    statistics beside the references', its share of the oracle, DSR with N = every trial the
    sweep started, walk-forward selection, and the per-fold rows for tables."""
    trials, parent = exp["trials"], exp["parent"]
    metrics = parent.data.metrics
    cost = float(trials[0]["params"].get("cost", 0.0))
    ppy = float(metrics.get("periods_per_year", DEFAULT_PPY))
    n_started = int(metrics.get("n_trials_counted", len(trials)))
    best = chosen(trials, exp["n_folds"])
    if best is None:
        raise CompareError(
            f"experiment {exp['name']!r}: all {len(trials)} trials of sweep run {parent.info.run_id} diverged: "
            "no chosen trial to judge"
        )
    _, judged, verdict = judge(trials, best, exp["n_folds"], cost, ppy, max(n_started, len(trials)))
    if exp["placebo_best_test_sharpe"]:
        add_placebo(verdict, snooping.placebo_pvalue(judged["test"]["sharpe"], exp["placebo_best_test_sharpe"]))
    pf = best["per_fold"]
    rows = [
        {"fold": f["fold"], **{k: pf[k].get(f["fold"]) for k in pf}, "flat_test_sharpe": 0.0} for f in best["folds"]
    ]
    scores = [t["score"] for t in trials if t["status"] == "ok"]
    vote = None  # the vote of the full trials needs their checkpoints: the sweep's own record of it
    if "ensemble_test_sharpe" in metrics:
        vote = {
            "n_members": int(metrics["ensemble_members"]),
            "test_sharpe": metrics["ensemble_test_sharpe"],
            "test_sharpe_se": metrics.get("ensemble_test_sharpe_se"),
            "oracle_share": metrics.get("ensemble_test_oracle_share"),
            "dsr": metrics.get("ensemble_test_dsr"),
        }
    return {
        "experiment": exp["name"],
        "experiment_id": exp["experiment_id"],
        "parent_run_id": parent.info.run_id,
        "n_sweeps": exp["n_sweeps"],
        "n_folds": exp["n_folds"],
        "n_trials": len(trials),
        "n_trials_counted": judged["n_trials_counted"],
        "cost": cost,
        "periods_per_year": ppy,
        **{k: verdict[k] for k in KEYS},  # the "is it real" numbers; the details under "verdict"
        "verdict": verdict,
        "best_score": best["score"],
        "median_score": float(np.median(scores)) if scores else None,
        "best": {
            "run_id": best["run_id"],
            "run_name": best["name"] or trial_label(best["trial_id"]),
            **{k: best[k] for k in ("trial_id", "folds_done", "score")},
            **judged,  # val, test and the references' (baselines) pooled statistics, DSR, walk-forward
            "folds": rows,
        },
        "ensemble": vote,
    }


# --- the report -----------------------------------------------------------------------------


def report(s: dict) -> str:
    b = s["best"]
    lines = [
        f"== {s['experiment']}: sweep run {s['parent_run_id']}"
        + (f" (latest of {s['n_sweeps']} sweeps)" if s["n_sweeps"] > 1 else ""),
        f"   {s['n_trials']} trials x {s['n_folds']} folds ({s['n_trials_counted']} started); score (pooled val "
        f"Sharpe of the folds run): the chosen trial's {s['best_score']:+.2f}, the median {fmt(s['median_score'])}",
        f"   chosen {b['run_name']} (run {b['run_id']}), {b['folds_done']} folds: pooled val Sharpe "
        f"{sharpe_line(b['val'])}",
        f"   {'fold':>4} {'val SR':>7} {'test SR':>7} {'B&H SR':>7} {'flat SR':>7} {'turnover':>8}   "
        "(per-window values: for the table only)",
    ]
    for r in b["folds"]:
        sharpes = " ".join(fmt(r[k], "+7.2f", "    n/a") for k in ("val_sharpe", "test_sharpe", "bh_test_sharpe"))
        turnover = fmt(r["test_turnover"], "8.4f", "     n/a")
        lines.append(f"   {r['fold']:>4} {sharpes} {r['flat_test_sharpe']:+7.2f} {turnover}")
    lines += ["   " + line for line in pooled_lines(b, s["cost"])]
    vote = s.get("ensemble")
    if vote:  # share_text: its oracle_share (the sweep logged no error of it)
        lines.append(
            f"     vote of the {vote['n_members']} trials that ran every fold (the sweep's record): "
            f"{vote['test_sharpe']:+.2f} ± {fmt(vote.get('test_sharpe_se'), '.2f')}"
            + share_text(vote)
            + (f"; DSR {vote['dsr']:.3f}" if vote.get("dsr") is not None else "")
        )
    lines.append(verdict_text(s["verdict"]))  # the sentence, then the evidence
    return "\n".join(lines)


# --- plots ----------------------------------------------------------------------------------


def robust_limits(values) -> tuple[float, float] | None:
    """y-limits that keep the bulk in view: the 5-95 % range widened, so one outlier (+309)
    does not squash every other point (the clipped points are marked)."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], dtype=float)
    if v.size < 3:
        return None
    lo, hi = np.percentile(v, [5, 95])
    pad = 0.25 * max(hi - lo, 1.0)
    return min(lo - pad, -pad), max(hi + pad, pad)


def plot_all(exps: list[dict], sums: list[dict], out: Path) -> list[Path]:
    plt = pyplot()

    out.mkdir(parents=True, exist_ok=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    paths = [out / name for name in PLOTS]
    plt.rcParams.update({"font.size": 10})
    # per-fold Sharpe of each chosen trial: test bars, val dots, buy-and-hold dashes (one colour each)
    fig, ax = plt.subplots(figsize=(10, 4.2))
    width = min(0.8 / len(sums), 0.3)
    points = []  # (x, value, colour) of every marker and bar
    label = {"textcoords": "offset points", "ha": "center", "fontsize": 8}  # a value's text beside its point
    for i, s in enumerate(sums):
        rows = s["best"]["folds"]
        x = np.array([r["fold"] for r in rows]) + (i - (len(sums) - 1) / 2) * width
        c = colors[i % len(colors)]
        # None (undefined) -> NaN
        test, val, bh = (
            np.array([r[k] for r in rows], dtype=float) for k in ("test_sharpe", "val_sharpe", "bh_test_sharpe")
        )
        points += [(xi, v, c) for series in (test, val, bh) for xi, v in zip(x, series)]
        ax.bar(x, test, width, color=c, alpha=0.85, label=f"{s['experiment']} test")
        for xi, v in zip(x, test):  # undefined (a flat window, < 2 days): said, not drawn as 0
            if not np.isfinite(v):
                ax.annotate("n/a", (xi, 0), xytext=(0, 3), **label)
        ax.plot(x, val, "o", color=c, mec="k", label=f"{s['experiment']} val")
        ax.plot(x, bh, "_", color=c, ms=14, mew=2.5, label=f"{s['experiment']} buy & hold (test)")
    limits = robust_limits([v for _, v, _ in points])
    if limits:
        ax.set_ylim(*limits)
        # every value beyond the axis: a marker at the edge with its value, so none is hidden
        clipped = [(x, v, c) for x, v, c in points if np.isfinite(v) and not limits[0] <= v <= limits[1]]
        for x, v, c in clipped:
            edge = limits[1] if v > limits[1] else limits[0]
            ax.plot(x, edge, "^" if v > 0 else "v", color=c, mec="k", ms=9, clip_on=False, zorder=5)
            ax.annotate(f"{v:+.0f}", (x, edge), xytext=(0, -18 if v > 0 else 9), fontweight="bold", **label)
        if clipped:
            note = f"{len(clipped)} value(s) beyond the axis, marked at its edge (the axis keeps the 5-95 % range)"
            ax.annotate(note, (0.01, 0.02), xycoords="axes fraction", fontsize=8, color="0.3")
    ax.axhline(0.0, color="0.5", lw=0.8)
    ax.set_xticks(sorted({r["fold"] for s in sums for r in s["best"]["folds"]}))
    title = "the chosen trial of each sweep, per fold (one window is noise: see the pooled numbers)"
    ax.set(xlabel="fold", ylabel="Sharpe of one window (annualised)", title=title)
    ax.legend(fontsize=8.5, ncol=len(sums), loc="upper center", bbox_to_anchor=(0.5, -0.15))
    save(fig, paths[0], 110)
    # equity of each chosen trial over its test windows, dated, beside the references
    fig, axes = plt.subplots(len(exps), 1, figsize=(10, 4.2 * len(exps)), squeeze=False)
    for ax, e, s in zip(axes[:, 0], exps, sums):
        best = next(t for t in e["trials"] if t["trial_id"] == s["best"]["trial_id"])
        folds = [FoldRecord.from_flat(f) for f in best["folds"]]
        plot_equity(ax, folds, f"{e['name']}: chosen {s['best']['run_name']}, test windows (out of sample)")
        ax.tick_params(axis="x", labelrotation=30)  # each panel its own dates (sweeps may cover other data)
    save(fig, paths[1], 110)
    # Optuna's fANOVA importance of the searched hyperparameters for the score
    fig, axes = plt.subplots(1, len(exps), figsize=(4.8 * len(exps), 3.2), squeeze=False)
    for i, (ax, e) in enumerate(zip(axes[0], exps)):
        imp = importance(e)
        if imp:
            names = list(imp)[::-1]
            ax.barh(names, [imp[n] for n in names], color=colors[i % len(colors)])  # the experiment's colour
            ax.set_xlim(0, 1)
        else:
            ax.text(0.5, 0.5, "n/a: needs >= 2 trials\nand a searched parameter", ha="center", va="center")
        n_ok = sum(t["status"] == "ok" for t in e["trials"])
        ax.set_title(f"{e['name']}: importance for the score\n(Optuna fANOVA over {n_ok} trials)", fontsize=10)
    save(fig, paths[2], 100)
    # is it real: the placebo sweeps with the real sweep marked, the CSCV logits (fxray.track.verdict)
    verdict_png(paths[3], [(s["experiment"], s["verdict"]) for s in sums])
    return paths


def importance(exp: dict) -> dict:
    """{param: fANOVA importance} for the score over the trials; {} when it is undefined."""
    import optuna

    space = exp["space"]
    trials = [t for t in exp["trials"] if all(n in t["params"] for n in space) and t["status"] == "ok"]
    if len(trials) < 2 or not space:
        return {}
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    for t in trials:
        params = {n: cast(d, t["params"][n]) for n, d in space.items()}
        study.add_trial(optuna.trial.create_trial(params=params, distributions=space, value=t["score"]))
    try:
        evaluator = optuna.importance.FanovaImportanceEvaluator(seed=0)
        return optuna.importance.get_param_importances(study, evaluator=evaluator)
    except (RuntimeError, ValueError):  # e.g. every trial scored the same
        return {}


def cast(dist, text: str):
    """A logged param (a string) as a value of its Optuna distribution."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    if isinstance(dist, CategoricalDistribution):
        return next((c for c in dist.choices if str(c) == text), text)
    return int(float(text)) if isinstance(dist, IntDistribution) else float(text)


# --- CLI ------------------------------------------------------------------------------------


def run(args) -> dict:
    check_file_out(args.json, "--json")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise CompareError(f"--out {args.out}: is not a directory; name a directory to write")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one per small download
    client, uri = open_store(args.tracking_uri)
    names = args.experiments or sweep_experiments(client)
    if not names:
        raise CompareError(f"no fxray sweep in {uri} (run python -m fxray.tune first)")
    exps = [load_experiment(client, n, uri) for n in names]
    sums = [summarize(e) for e in exps]
    for s in sums:
        print(report(s) + "\n")
    paths = plot_all(exps, sums, Path(args.out))
    print(f"plots: {', '.join(str(p) for p in paths)}")
    if not args.no_log:
        for e in exps:  # every sweep gets the whole comparison: it was compared against the others
            for p in paths:
                client.log_artifact(e["parent"].info.run_id, str(p), artifact_path="compare")
        print(f"logged to the parent runs under compare/: {', '.join(e['parent'].info.run_id for e in exps)}")
    return {
        "tracking_uri": uri,
        "experiments": [{**s, "verdict": json_ready(s["verdict"])} for s in sums],
        "plots": [str(p) for p in paths],
    }


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("compare", __doc__)
    p.add_argument(
        "experiments",
        nargs="*",
        metavar="EXPERIMENT",
        help="MLflow experiment names (default: every experiment with an fxray sweep)",
    )
    p.add_argument(
        "--tracking-uri", metavar="URI", help="MLflow store (default: $MLFLOW_TRACKING_URI, else sqlite:///./mlflow.db)"
    )
    p.add_argument("--out", default="compare", metavar="DIR", help="directory for the PNGs (default ./compare)")
    p.add_argument("--no-log", action="store_true", help="do not log the PNGs to the sweeps' parent runs")
    p.add_argument("--json", metavar="PATH", help="write the numbers here")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from mlflow.exceptions import MlflowException

    try:
        return run_command(run, args, announce=True)
    except MlflowException as e:  # the store's refusal, in one line
        return fail(e)


if __name__ == "__main__":
    sys.exit(main())
