"""Compare sweeps logged in MLflow, and deflate each best Sharpe for the trials it was picked from.

    python -m fxray.compare                                   # every fxray sweep in ./mlflow.db
    python -m fxray.compare smoke default --tracking-uri sqlite:///$PWD/mlflow.db --json compare.json
    python -m fxray.compare smoke --out compare/ --no-log     # PNGs only on disk

Per experiment (its latest sweep, i.e. parent run): the number of trials, the best and
median mean val Sharpe, the best trial's per-fold val / test Sharpe against buy-and-hold
and flat, its test turnover, and on its out-of-sample test days (the folds' test windows
concatenated): the Sharpe, the Probabilistic Sharpe Ratio PSR(0) and the Deflated Sharpe
Ratio DSR = PSR(SR0), SR0 the Sharpe the best of N zero-skill trials reaches by luck
(Bailey & Lopez de Prado 2014; fxray.eval.metrics). PNGs (per-fold Sharpe, equity of the best
trials' test windows, Optuna's hyperparameter importance) go to --out and to each
sweep's parent run under compare/.

The best trial is the one the sweep picked: highest mean val Sharpe among trials that
ran every fold (when any did). Its test days were never used for selection, yet the
trial was still picked out of N, so DSR asks the honest question: is its out-of-sample
Sharpe above what the luckiest of N skill-less configs would show?
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fxray.eval import metrics

PER_FOLD = ("val_sharpe", "test_sharpe", "bh_test_sharpe", "test_turnover")  # best trial, step = fold
RETURNS_DIR = "test_daily_returns"  # child-run artifacts fold<k>.json, logged by fxray.track.runs
PLOTS = ("sharpe_by_fold.png", "equity.png", "importance.png")


class CompareError(ValueError):
    """Bad input (unknown experiment, no runs, no store): one line, exit code 2."""


@dataclass
class Trial:
    run_id: str
    name: str
    params: dict  # the logged DQNConfig, as strings
    val_sharpe: dict  # fold k -> annualised val Sharpe
    per_fold: dict = field(default_factory=dict)  # metric -> {fold k: value} (best trial only)
    test_daily: list | None = None  # [(k, daily log returns)] in fold order; None: not logged

    @property
    def folds_done(self) -> int:
        return len(self.val_sharpe)

    @property
    def mean_val_sharpe(self) -> float:
        return float(np.mean(list(self.val_sharpe.values())))


# --- reading MLflow -----------------------------------------------------------------------


def open_store(uri: str | None):
    """An MlflowClient on `uri` (default: as fxray.tune logs); a missing sqlite file is an error,
    not a new empty store."""
    import mlflow
    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one per small download
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).is_file():
        raise CompareError(f"--tracking-uri {uri}: no such sqlite file (run python -m fxray.tune first)")
    mlflow.set_tracking_uri(uri)
    return MlflowClient(uri), uri


def sweep_experiments(client) -> list[str]:
    """Names of the experiments holding at least one fxray sweep (a run tagged with its folds)."""
    import mlflow

    exps = client.search_experiments()
    runs = mlflow.search_runs([e.experiment_id for e in exps], "tags.`fxray.folds` != ''", output_format="list")
    ids = {r.info.experiment_id for r in runs}
    return [e.name for e in exps if e.experiment_id in ids]


def load_experiment(client, name: str, uri: str) -> dict:
    """The latest sweep of experiment `name`: its parent run, folds and trials (child runs)."""
    import mlflow

    exp = client.get_experiment_by_name(name)
    if exp is None:
        known = ", ".join(sweep_experiments(client)) or "none"
        raise CompareError(f"experiment {name!r} not found in {uri} (fxray sweeps there: {known})")
    runs = mlflow.search_runs([exp.experiment_id], output_format="list")
    parents = [r for r in runs if "fxray.folds" in r.data.tags and "mlflow.parentRunId" not in r.data.tags]
    if not parents:
        raise CompareError(f"experiment {name!r} has no fxray sweep run in {uri} (run python -m fxray.tune)")
    parent = max(parents, key=lambda r: r.info.start_time)
    trials = []
    for r in runs:
        if r.data.tags.get("mlflow.parentRunId") != parent.info.run_id:
            continue
        val = {m.step: m.value for m in client.get_metric_history(r.info.run_id, "val_sharpe")}
        if val:  # a trial with no finished fold has nothing to compare
            trials.append(Trial(r.info.run_id, r.info.run_name, dict(r.data.params), val))
    if not trials:
        raise CompareError(f"experiment {name!r}: sweep run {parent.info.run_id} has no trial with a finished fold")
    n_folds = len(json.loads(parent.data.tags["fxray.folds"]))
    full = [t for t in trials if t.folds_done >= n_folds]
    best = max(full or trials, key=lambda t: t.mean_val_sharpe)  # as fxray.track.results.best_trial
    best.per_fold = {k: {m.step: m.value for m in client.get_metric_history(best.run_id, k)} for k in PER_FOLD}
    with tempfile.TemporaryDirectory() as tmp:
        for t in trials:
            t.test_daily = read_test_returns(client, t, Path(tmp) / t.run_id)
        space = search_space(client, parent, trials, Path(tmp) / "experiment")
    return {
        "name": name,
        "experiment_id": exp.experiment_id,
        "parent": parent,
        "n_sweeps": len(parents),
        "n_folds": n_folds,
        "trials": trials,
        "best": best,
        "space": space,
    }


def read_test_returns(client, trial: Trial, dst: Path) -> list | None:
    """[(fold k, daily returns)] from a child run's artifacts; None if a logged fold lacks them."""
    if not client.list_artifacts(trial.run_id, RETURNS_DIR):
        return None
    dst.mkdir(parents=True)
    local = Path(client.download_artifacts(trial.run_id, RETURNS_DIR, str(dst)))
    folds = {}
    for path in local.glob("fold*.json"):  # {"fold": k, "test_daily_returns": [log return per UTC day]}
        record = json.loads(path.read_text())
        folds[record["fold"]] = record["test_daily_returns"]
    if not set(trial.val_sharpe) <= set(folds):
        return None
    return [(k, folds[k]) for k in sorted(trial.val_sharpe)]


# --- the numbers ----------------------------------------------------------------------------


def per_period_sharpe(daily_returns) -> float:
    """mean / std(ddof=1) of daily returns, NOT annualised: the units of PSR / DSR (0.0 if undefined)."""
    return metrics.sharpe(daily_returns, periods=1)


def trial_sharpe_variance(trial_returns: list) -> float:
    """Variance (ddof=1) across trials of their per-period Sharpe on their own test days:
    V of the expected-max-Sharpe formula, in the units of SR^. 0.0 with fewer than 2 trials."""
    srs = [per_period_sharpe(r) for r in trial_returns]
    return float(np.var(srs, ddof=1)) if len(srs) >= 2 else 0.0


def mean_or_none(values: list) -> float | None:
    present = [v for v in values if v is not None]  # a fold whose metric was not logged
    return float(np.mean(present)) if present else None


def summarize(exp: dict) -> dict:
    """The comparison numbers of one loaded experiment (see the module doc)."""
    trials, best = exp["trials"], exp["best"]
    vals = [t.mean_val_sharpe for t in trials]
    folds = sorted(best.val_sharpe)
    pf = best.per_fold
    rows = [
        {
            "fold": k,
            "val_sharpe": best.val_sharpe[k],
            "test_sharpe": pf["test_sharpe"].get(k),
            "bh_test_sharpe": pf["bh_test_sharpe"].get(k),
            "flat_test_sharpe": 0.0,  # flat earns 0 every day: Sharpe 0 by fxray.eval.metrics' convention
            "test_turnover": pf["test_turnover"].get(k),
        }
        for k in folds
    ]
    out = {
        "experiment": exp["name"],
        "experiment_id": exp["experiment_id"],
        "parent_run_id": exp["parent"].info.run_id,
        "n_sweeps": exp["n_sweeps"],
        "n_folds": exp["n_folds"],
        "n_trials": len(trials),
        "best_mean_val_sharpe": best.mean_val_sharpe,
        "median_mean_val_sharpe": float(np.median(vals)),
        "best": {
            "run_id": best.run_id,
            "run_name": best.name,
            "folds_done": best.folds_done,
            "mean_val_sharpe": best.mean_val_sharpe,
            "mean_test_sharpe": mean_or_none([r["test_sharpe"] for r in rows]),
            "folds": rows,
        },
    }
    oos = {
        "n_trials": len(trials),
        "n_days": 0,
        "sharpe": None,
        "psr": None,
        "dsr": None,
        "sr0_annualised": None,
        "var_trial_sharpe": None,
        "n_trials_in_variance": 0,
    }
    if best.test_daily is not None:
        # N counts every trial tried (each was a chance to get lucky); V uses those whose days were logged
        days = np.concatenate([np.asarray(d, dtype=np.float64) for _, d in best.test_daily])
        logged = [
            np.concatenate([np.asarray(d, dtype=np.float64) for _, d in t.test_daily]) for t in trials if t.test_daily
        ]
        var = trial_sharpe_variance(logged)
        sr0 = metrics.expected_max_sharpe(len(trials), var)
        oos.update(
            n_days=int(days.size),
            sharpe=metrics.sharpe(days),
            psr=metrics.probabilistic_sharpe(days),
            dsr=metrics.deflated_sharpe(days, len(trials), var),
            sr0_annualised=sr0 * math.sqrt(metrics.PERIODS_PER_YEAR),
            var_trial_sharpe=var,
            n_trials_in_variance=len(logged),
        )
    out["best"]["out_of_sample"] = oos
    return out


# --- the report -----------------------------------------------------------------------------


def fmt(v, spec="+7.2f") -> str:
    """format(v, spec), or "n/a" as wide, for a number that was not logged."""
    return "n/a".rjust(int(spec.lstrip("+").split(".")[0] or 0)) if v is None else format(v, spec)


def report(s: dict) -> str:
    b, o = s["best"], s["best"]["out_of_sample"]
    lines = [
        f"== {s['experiment']}: sweep run {s['parent_run_id']}"
        + (f" (latest of {s['n_sweeps']} sweeps)" if s["n_sweeps"] > 1 else ""),
        f"   {s['n_trials']} trials x {s['n_folds']} folds; mean val Sharpe: best "
        f"{s['best_mean_val_sharpe']:+.2f}, median {s['median_mean_val_sharpe']:+.2f}",
        f"   best {b['run_name']} (run {b['run_id']}): mean val {b['mean_val_sharpe']:+.2f}, "
        f"mean test {fmt(b['mean_test_sharpe'], '+.2f')}",
        f"   {'fold':>4} {'val SR':>7} {'test SR':>7} {'B&H SR':>7} {'flat SR':>7} {'turnover':>8}",
    ]
    for r in b["folds"]:
        lines.append(
            f"   {r['fold']:>4} {fmt(r['val_sharpe'])} {fmt(r['test_sharpe'])} "
            f"{fmt(r['bh_test_sharpe'])} {fmt(r['flat_test_sharpe'])} {fmt(r['test_turnover'], '8.4f')}"
        )
    if o["sharpe"] is None:
        lines.append("   out of sample: n/a (this sweep logged no test_daily_returns artifacts)")
    else:
        lines += [
            f"   out of sample, {o['n_days']} test days: Sharpe {o['sharpe']:+.2f}  PSR(0) {o['psr']:.3f}  "
            f"DSR {o['dsr']:.3f}",
            f"     (DSR = PSR(SR0): N = {o['n_trials']} trials, variance of per-day trial Sharpes "
            f"{o['var_trial_sharpe']:.3g} over {o['n_trials_in_variance']}: the best of N by luck "
            f"SR0 = {o['sr0_annualised']:+.2f} annualised)",
        ]
    return "\n".join(lines)


def summary_table(sums: list[dict]) -> str:
    """One row per experiment; Sharpe annualised; PSR / DSR on the best trial's test days."""
    head = (
        f"{'experiment':<20} {'trials':>6} {'best val':>8} {'median':>7} {'test':>7} {'OOS SR':>7} "
        f"{'PSR':>6} {'DSR':>6}"
    )
    rows = [head, "-" * len(head)]
    for s in sums:
        o = s["best"]["out_of_sample"]
        rows.append(
            f"{s['experiment'][:20]:<20} {s['n_trials']:>6} {s['best_mean_val_sharpe']:>+8.2f} "
            f"{s['median_mean_val_sharpe']:>+7.2f} {fmt(s['best']['mean_test_sharpe'])} "
            f"{fmt(o['sharpe'])} {fmt(o['psr'], '6.3f')} {fmt(o['dsr'], '6.3f')}"
        )
    return "\n".join(rows)


# --- plots ----------------------------------------------------------------------------------


def plot_all(exps: list[dict], sums: list[dict], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    paths = [out / name for name in PLOTS]
    # per-fold Sharpe of each best trial: test bars, val dots, buy-and-hold dashes
    fig, ax = plt.subplots(figsize=(9, 4))
    width = min(0.8 / len(sums), 0.3)
    for i, s in enumerate(sums):
        rows = s["best"]["folds"]
        x = np.array([r["fold"] for r in rows]) + (i - (len(sums) - 1) / 2) * width
        c = colors[i % len(colors)]
        ax.bar(x, [r["test_sharpe"] or 0.0 for r in rows], width, color=c, label=f"{s['experiment']} test")
        ax.plot(x, [r["val_sharpe"] for r in rows], "o", color=c, mec="k", label=f"{s['experiment']} val")
        ax.plot(
            x,
            [r["bh_test_sharpe"] if r["bh_test_sharpe"] is not None else np.nan for r in rows],
            "_",
            color="k",
            ms=14,
            mew=2,
            label="buy & hold (test)" if i == 0 else None,
        )
    ax.axhline(0.0, color="0.5", lw=0.8)
    ax.set_xticks(sorted({r["fold"] for s in sums for r in s["best"]["folds"]}))
    ax.set(xlabel="fold", ylabel="Sharpe (annualised)", title="best trial of each sweep, per fold")
    ax.legend(fontsize=7, ncol=len(sums) + 1, loc="upper center", bbox_to_anchor=(0.5, -0.15))
    fig.tight_layout()
    fig.savefig(paths[0], dpi=100)
    plt.close(fig)
    # equity of each best trial over its test windows, concatenated (daily log returns add)
    fig, ax = plt.subplots(figsize=(9, 4))
    for i, e in enumerate(exps):
        daily = e["best"].test_daily
        label = f"{e['name']} ({e['best'].name})"
        if daily:
            log_eq = np.concatenate([[0.0], np.cumsum(np.concatenate([d for _, d in daily]))])
            ax.plot(np.exp(log_eq), color=colors[i % len(colors)], label=label)
        else:
            ax.plot([], [], color=colors[i % len(colors)], label=label + ": no test returns logged")
    ax.axhline(1.0, color="0.5", lw=0.8)
    ax.set(xlabel="test day (folds concatenated)", ylabel="equity", title="best trials, out of sample")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(paths[1], dpi=100)
    plt.close(fig)
    # Optuna's fANOVA importance of the searched hyperparameters for mean val Sharpe
    fig, axes = plt.subplots(1, len(exps), figsize=(4.5 * len(exps), 3), squeeze=False)
    for ax, e in zip(axes[0], exps):
        imp = importance(e)
        if imp:
            names = list(imp)[::-1]
            ax.barh(names, [imp[n] for n in names], color="tab:blue")
            ax.set_xlim(0, 1)
        else:
            ax.text(0.5, 0.5, "n/a: needs >= 2 trials\nand a searched parameter", ha="center", va="center")
        ax.set_title(f"{e['name']}: importance for mean val Sharpe (Optuna fANOVA)", fontsize=9)
    fig.tight_layout()
    fig.savefig(paths[2], dpi=100)
    plt.close(fig)
    return paths


def importance(exp: dict) -> dict:
    """{param: fANOVA importance} for mean val Sharpe over the trials; {} when it is undefined."""
    import optuna

    space = exp["space"]
    trials = [t for t in exp["trials"] if all(n in t.params for n in space)]
    if len(trials) < 2 or not space:
        return {}
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    for t in trials:
        params = {n: cast(d, t.params[n]) for n, d in space.items()}
        study.add_trial(optuna.trial.create_trial(params=params, distributions=space, value=t.mean_val_sharpe))
    try:
        return optuna.importance.get_param_importances(
            study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0)
        )
    except (RuntimeError, ValueError):  # e.g. every trial scored the same
        return {}


def search_space(client, parent, trials: list, dst: Path) -> dict:
    """Optuna distributions of the searched params: from the sweep's experiment.yaml artifact,
    else inferred from the values the trials logged (linear ranges, categories)."""
    from fxray.rl import experiment as expmod

    if any(a.path == "experiment.yaml" for a in client.list_artifacts(parent.info.run_id)):
        dst.mkdir(parents=True)
        path = client.download_artifacts(parent.info.run_id, "experiment.yaml", str(dst))
        try:
            return expmod.load(path, parent.data.tags.get("fxray.profile", "gpu")).space()
        except expmod.ExperimentError:  # written by another fxray version: infer below
            pass
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    space = {}
    for n in sorted({k for t in trials for k in t.params}):
        values = {t.params.get(n) for t in trials}
        if len(values) < 2 or None in values:
            continue
        try:
            nums = [float(v) for v in values]
            space[n] = FloatDistribution(min(nums), max(nums))
        except ValueError:
            space[n] = CategoricalDistribution(sorted(values))
    return space


def cast(dist, text: str):
    """A logged param (a string) as a value of its Optuna distribution."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    if isinstance(dist, CategoricalDistribution):
        return next((c for c in dist.choices if str(c) == text), text)
    return int(float(text)) if isinstance(dist, IntDistribution) else float(text)


# --- CLI ------------------------------------------------------------------------------------


def run(args) -> dict:
    client, uri = open_store(args.tracking_uri)
    names = args.experiments or sweep_experiments(client)
    if not names:
        raise CompareError(f"no fxray sweep in {uri} (run python -m fxray.tune first)")
    exps = [load_experiment(client, n, uri) for n in names]
    sums = [summarize(e) for e in exps]
    for s in sums:
        print(report(s) + "\n")
    print(summary_table(sums))
    paths = plot_all(exps, sums, Path(args.out))
    print(f"plots: {', '.join(str(p) for p in paths)}")
    if not args.no_log:
        for e in exps:  # every sweep gets the whole comparison: it was compared against the others
            for p in paths:
                client.log_artifact(e["parent"].info.run_id, str(p), artifact_path="compare")
        print(f"logged to the parent runs under compare/: {', '.join(e['parent'].info.run_id for e in exps)}")
    result = {"tracking_uri": uri, "experiments": sums, "plots": [str(p) for p in paths]}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1))
        print(f"wrote {args.json}")
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m fxray.compare",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "experiments",
        nargs="*",
        metavar="EXPERIMENT",
        help="MLflow experiment names (default: every experiment with an fxray sweep)",
    )
    p.add_argument("--tracking-uri", help="MLflow store (default: $MLFLOW_TRACKING_URI, else sqlite:///./mlflow.db)")
    p.add_argument("--out", default="compare", help="directory for the PNGs (default ./compare)")
    p.add_argument("--no-log", action="store_true", help="do not log the PNGs to the sweeps' parent runs")
    p.add_argument("--json", help="write the numbers here")
    args = p.parse_args(argv)
    from mlflow.exceptions import MlflowException

    try:
        run(args)
    except (CompareError, MlflowException) as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"fxray.compare: error: {msg}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
