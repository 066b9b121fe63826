"""The learner grid (issue 17): train configs on planted markets, one line per config, with
the pooled test Sharpe of each seed beside the market's oracle and the ridge rule on the
same test windows, and the share of the oracle. No Ray, no sweep: one config at a time,
every fold, so that a change to the learner is judged on its own, on several markets and
seeds.

    python lab/learner_grid.py lab/grids/gpu_levers.json            # the GPU machine
    python lab/learner_grid.py lab/grids/gpu_levers.json --json grid.json

On a market whose edge is on only in some hours (the "session" structure), each seed also
gets `in_edge_hours`: the share of its traded units (|position change|) in those hours, beside
the oracle's: a policy that cannot tell the hour trades there about 4 / 24 of the time.

A grid file is a JSON list of jobs: {"tag": str, "market": SynthSpec keys, "folds": FoldSpec
keys, "cfg": DQNConfig keys, "seeds": [int, ...], "ensemble": false}. With "ensemble": true
the seeds are trained alone and the policy of each test window is their mean Q. Five probes,
which are diagnostics and not features: "edge_input": true puts the exact 0/1 indicator of
the market's edge hours in place of the input dow_sin (is the learner able to use the hour
when it is handed it?); "hour_inputs": true appends 24 inputs, the one-hot UTC hour of each
bar's close, after the order flow (inputs 50-73); "session_inputs": true appends 3, whether
the Tokyo, London and New York sessions are open (FX_SESSIONS); "clean_columns": [i, ...]
takes input noise off those input columns only (with "cfg": {"noise_calendar": false});
"ridge_inputs": true appends 3 inputs (50-52), each fold's ridge predictions of the next 5, 20
and 60 bars' return fitted on its train slice (RidgeInputData; the ridge reference rule then
fits on them too); with it, "only_columns": [i, ...] makes every other input read 0 (a
diagnostic: the oracle and ridge references then read those 0s too and are not the market's);
"ridge_columns": [i, ...] or "oracle" fits those predictions on those inputs only (told them);
"epoch_tests": true also scores every epoch's weights (a seed ensemble's: their mean Q) on the
fold's test window, never used to choose anything: each seed gets `epochs`, per epoch the
pooled test Sharpe, share and trades of the policy that stopped there (give the job "cfg":
{"patience": epochs} so every fold runs them all), a diagnostic of where in training the
out-of-sample edge is; and `common_epoch`, the one epoch for every fold that the pooled val
windows of all folds choose, with its test.
"snapshots": true (a seed ensemble's config too) keeps every epoch's Q-values of every member on
the fold's val and test windows, and scores policies made of them on test, from the same
training: "last" (the members' mean Q at the last epoch: `select: last`), "e<j>" (at epoch j),
"snap_all" (the mean Q over every epoch and member: a snapshot ensemble), "snap_late" (over
every epoch but the first); each seed gets `snapshots`, per policy the pooled test Sharpe, share
and trades, beside the fold's own policy (the config's `select`). A diagnostic, never used to
choose anything: does a mean over epochs hedge between a market whose edge peaks early and one
whose edge peaks late?
Fold k of seed s trains with seed s + k (100 s + k in an ensemble), as `fxray train` does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from fxray.data import cache
from fxray.data.arrays import host_arrays
from fxray.data.calendar import HOUR_NS
from fxray.data.features import FEATURE_NAMES
from fxray.data.folds import FoldSpec, make_folds
from fxray.data.synth import SynthSpec, default_path, to_cache
from fxray.eval import pooled
from fxray.eval.backtest import backtest
from fxray.rl import frontend
from fxray.rl.config import DQNConfig
from fxray.rl.device import DeviceData
from fxray.rl.ensemble import make_trainer

NO_RESULT = {"net": [], "units": [], "hours": [], "n_bars": 0, "n_trades": 0, "n_days": 0}  # a diverged fold


def market(kw: dict):
    spec = SynthSpec(**kw)
    path = default_path(spec)
    if not path.exists():
        to_cache(spec, path)
    return cache.open(path)


def in_hours(windows: list[dict], hours: tuple[int, int] | None, period_ns: int) -> float | None:
    """The share of the traded units of these test windows (PeriodReturns dicts) in the UTC
    hours [start, end); None without hours or without a trade."""
    if hours is None or not windows:
        return None
    units = np.concatenate([np.asarray(w["units"], float) for w in windows])
    hour = np.concatenate([np.asarray(w["hours"], np.int64) for w in windows]) * period_ns // HOUR_NS % 24
    total = units.sum()
    inside = (hour >= hours[0]) & (hour < hours[1])
    return float(units[inside].sum() / total) if total > 0 else None


EDGE_INPUT_COLUMN = FEATURE_NAMES.index("dow_sin")  # what the "edge_input" probe overwrites


def close_hour(ts: np.ndarray) -> np.ndarray:
    """The UTC hour each bar closes in, as the calendar's periods count it (a bar closing at
    13:00 belongs to the 12:00 hour)."""
    return (ts - 1) // HOUR_NS % 24


def with_edge_input(m) -> dict:
    """The market's arrays with input dow_sin replaced by 1 in the edge's hours, else 0."""
    arrays = host_arrays(m)
    start, end = arrays["oracle_hours"].tolist()
    hour = close_hour(arrays["ts"])
    features = np.array(arrays["features"])
    features[:, EDGE_INPUT_COLUMN] = (hour >= start) & (hour < end)
    return {**arrays, "features": features}


def with_hour_inputs(arrays: dict) -> dict:
    """The arrays with 24 more inputs after the order flow: the one-hot UTC hour of the bar's close."""
    hour = close_hour(arrays["ts"])
    onehot = (hour[:, None] == np.arange(24)).astype(np.float32)
    return {**arrays, "ofi": np.concatenate([arrays["ofi"], onehot], 1)}


FX_SESSIONS = ((0, 9), (7, 16), (12, 21))  # Tokyo, London, New York: [start, end) hours UTC, winter times


def with_session_inputs(arrays: dict) -> dict:
    """The arrays with 3 more inputs after the order flow: 1 while the Tokyo, London, New York
    session is open (FX_SESSIONS, fixed by the market's hours, not fitted), else 0."""
    hour = close_hour(arrays["ts"])
    open_ = np.stack([(hour >= a) & (hour < b) for a, b in FX_SESSIONS], 1).astype(np.float32)
    return {**arrays, "ofi": np.concatenate([arrays["ofi"], open_], 1)}


RIDGE_HORIZONS = frontend.HORIZONS  # bars: the "ridge_inputs" probe's predictions, one input each


class RidgeInputData(DeviceData):
    """DeviceData whose last len(RIDGE_HORIZONS) inputs are, on each fold, the ridge regression's
    prediction of the next-h-bar return from the other inputs, fitted on the fold's train slice
    only (fxray.rl.frontend.fit, `dqn.inputs: ridge`'s front end, on every other input, the clock
    included), normalised on that slice as every input is. Made from arrays with that many
    placeholder columns after the order flow."""

    def set_fold(self, fold) -> None:
        k = len(RIDGE_HORIZONS)
        n = self.n_inputs - k
        self.x[:, n:] = 0.0
        super().set_fold(fold)  # the other inputs' train-slice normalisation
        regressors = torch.zeros(self.n_inputs, dtype=torch.bool, device=self.device)
        regressors[:n] = True if self.ridge_columns is None else self.ridge_columns > 0  # told them: a diagnostic
        A, c = frontend.fit(self, fold, "next_open", regressors)
        for rows in torch.arange(self.n_bars, device=self.device).split(65536):
            self.x[rows, n:] = (self.states(rows) @ A[:k].T + c[:k]).to(self.x.dtype)
        super().set_fold(fold)  # now with the predictions' own train-slice mean and scale
        if self.keep is not None:  # "only_columns": the other inputs read 0 (the references too)
            self.inv_std.mul_(self.keep)

    keep: torch.Tensor | None = None
    ridge_columns: torch.Tensor | None = None  # (n,) 0/1 float64: the inputs the fit may use


def with_placeholder_inputs(arrays: dict, k: int) -> dict:
    """The arrays with k more (zero) inputs after the order flow."""
    return {**arrays, "ofi": np.concatenate([arrays["ofi"], np.zeros((len(arrays["ts"]), k), np.float32)], 1)}


def run_job(job: dict, device: str, on_fold=None) -> dict:
    """Train `job` on every fold; `on_fold(numbers so far)` after each (a stopped run keeps them)."""
    m = market(job.get("market", {}))
    folds = make_folds(m.ts, FoldSpec(**job.get("folds", {})))
    arrays = with_edge_input(m) if job.get("edge_input") else host_arrays(m)
    if job.get("hour_inputs"):
        arrays = with_hour_inputs(arrays)
    if job.get("session_inputs"):
        arrays = with_session_inputs(arrays)
    if job.get("ridge_inputs"):
        data = RidgeInputData(with_placeholder_inputs(arrays, len(RIDGE_HORIZONS)), device)
    else:
        data = DeviceData(arrays, device)
    if "ridge_columns" in job:  # a diagnostic: the ridge inputs fitted on these inputs only ("oracle" = its)
        cols = data.oracle[0].tolist() if job["ridge_columns"] == "oracle" else job["ridge_columns"]
        data.ridge_columns = torch.zeros(data.n_inputs - len(RIDGE_HORIZONS), dtype=torch.float64, device=data.device)
        data.ridge_columns[cols] = 1.0
    if "only_columns" in job:  # a diagnostic: its oracle and ridge are not the market's (they read 0s)
        data.keep = torch.zeros(data.n_inputs, device=data.device)
        data.keep[job["only_columns"]] = 1.0
    if "clean_columns" in job:
        data.noise_mask.fill_(1.0)
        data.noise_mask[job["clean_columns"]] = 0.0
    ppy = data.calendar.periods_per_year
    cfg = DQNConfig(**job.get("cfg", {}))
    trainer = make_trainer(data, cfg)  # "cfg": {"seeds": S} trains S seeds as one population, scored as their mean Q
    seeds, ensemble = tuple(job.get("seeds", [0])), bool(job.get("ensemble"))
    t0 = time.time()
    tests = {s: [] for s in seeds}
    per_epoch = {s: [] for s in seeds}  # "epoch_tests": per fold, each epoch's val and test periods
    snap_tests = {s: {} for s in seeds}  # "snapshots": per seed, per policy, each fold's test periods
    watch = watch_epochs(trainer) if job.get("epoch_tests") or job.get("snapshots") else {}
    ens, refs, best_epochs = [], {}, []
    edge_hours = data.oracle[1] if data.oracle else None
    period_ns = data.calendar.period_ns

    def summary() -> dict:
        """The job's numbers over the folds done so far (every fold at the end)."""
        ref = {n: pooled.pooled(w, cfg.cost, ppy) for n, w in refs.items()}
        oracle = ref.get("oracle")

        def stat(windows):
            p = pooled.pooled(windows, cfg.cost, ppy)
            share = pooled.oracle_share(p, oracle)
            out = {
                "sharpe": p["sharpe"],
                "sharpe_se": p["sharpe_se"],
                "n_trades": p["n_trades"],
                "oracle_share": share,
                "oracle_share_se": None if share is None else pooled.oracle_share_se(windows, refs["oracle"]),
                "folds_done": len(windows),
            }
            if edge_hours:
                out["in_edge_hours"] = in_hours(windows, edge_hours, period_ns)
            return out

        def brief(windows):  # what an epoch's row keeps of stat (computed once)
            full = stat(windows)
            return {k: full[k] for k in ("sharpe", "oracle_share", "n_trades")}

        def epochs(s):  # epoch e's weights on every fold that ran it (a fold that stopped early: fewer)
            runs = per_epoch[s]
            n = max((len(r) for r in runs), default=0)
            return [brief([r[e]["test"] for r in runs if len(r) > e]) for e in range(n)]

        def common_epoch(s):
            """One epoch for every fold, chosen on the pooled chooser windows of all folds (the
            selection score, fxray.eval.pooled.score), and its test: the alternative to each
            fold choosing its own epoch on its own 5 days. Over the folds that ran every epoch."""
            runs = [r for r in per_epoch[s] if r]
            n = min((len(r) for r in runs), default=0)
            if n == 0:
                return None
            scores = [pooled.score(pooled.pooled([r[e]["val"] for r in runs], cfg.cost, ppy)) for e in range(n)]
            e = int(np.argmax(scores))
            return {"epoch": e, "val_score": scores[e]} | brief([r[e]["test"] for r in runs])

        out = {
            "tag": job.get("tag", ""),
            "wall_s": time.time() - t0,
            "folds_done": len(refs["ridge"]),
            "folds": len(folds),
            "oracle": oracle and oracle["sharpe"],
            "ridge": ref["ridge"]["sharpe"],
            "buy_and_hold": ref["buy_and_hold"]["sharpe"],
            "seeds": {
                str(s): stat(tests[s])
                | ({"epochs": epochs(s), "common_epoch": common_epoch(s)} if job.get("epoch_tests") else {})
                | ({"snapshots": {n: brief(w) for n, w in snap_tests[s].items()}} if job.get("snapshots") else {})
                for s in seeds
            },
            "best_epochs": best_epochs,
        }
        if edge_hours:
            out["edge_hours"] = list(edge_hours)
            out["oracle_in_edge_hours"] = in_hours(refs["oracle"], edge_hours, period_ns)
        if ensemble:
            out["ensemble"] = stat(ens)
        return out

    for f in folds:
        qs = []
        for s in seeds:
            if watch:
                watch.update(fold=f, into=[])
            r = trainer.run_fold(f, seed=(100 * s if ensemble else s) + f.k)
            if watch:
                chooser, test = data.window(f.chooser, cfg.fill), data.window(f.test, cfg.fill)

                def periods(q, window):
                    return backtest(q, window, cfg.cost).periods.as_dict()

                if job.get("epoch_tests"):  # each epoch's policy: the mean Q of the members it scored
                    per_epoch[s].append(
                        [
                            {"val": periods(e["val"].mean(0), chooser), "test": periods(e["test"].mean(0), test)}
                            for e in watch["into"]
                        ]
                    )
                if job.get("snapshots"):

                    def val_score(q, chooser=chooser):  # the trainer's selection score of one member's Q
                        return pooled.score(pooled.pooled([periods(q, chooser)], cfg.cost, ppy))

                    for name, q in snapshot_policies(watch["into"], val_score).items():
                        snap_tests[s].setdefault(name, []).append(periods(q, test))
            tests[s].append(r.test_periods or NO_RESULT)
            best_epochs.append(r.best_epoch)
            net_bp = 1e4 * float(np.sum(tests[s][-1]["net"]))
            print(  # progress: a fold's test P&L, so a grid stopped at a time limit still says something
                f"  {job.get('tag', '')} fold {f.k} seed {s}: test net {net_bp:+.1f} bp,"
                f" best epoch {r.best_epoch}, {time.time() - t0:.0f}s",
                file=sys.stderr,
                flush=True,
            )
            if ensemble:
                qs.append(trainer.q_all(f.test))  # the kept weights are loaded after run_fold
        if ensemble:
            q = torch.stack(qs).mean(0)
            ens.append(backtest(q, data.window(f.test, cfg.fill), cfg.cost).periods.as_dict())
        for name, d in r.baseline_periods.items():
            refs.setdefault(name, []).append(d["test"])
        if on_fold is not None:
            on_fold(summary())
    return summary()


def watch_epochs(trainer) -> dict:
    """Make `trainer` (a Trainer or an EnsembleTrainer) keep every epoch's Q-values: run_fold
    scores each epoch on `fold.chooser` and nothing else on it, so at each such call the scored
    members' Q on that window and on the fold's test window go to `watch["into"]`, one
    {"members", "val", "test"} per epoch ((M, T, 3, 3) each), while `watch["fold"]` is that
    fold (the caller sets both before each run_fold). The weights then are that epoch's
    (scoring comes before any copy to the kept weights). What "epoch_tests" and "snapshots"
    score. A diagnostic: run_fold's choices are unchanged."""
    watch = {"fold": None, "into": None}
    population = getattr(trainer, "population", None)
    if population is None:  # one seed: Trainer.evaluate(window)
        evaluate = trainer.evaluate

        def scored(window):
            keep(window, [0], lambda w: trainer.q_all(w).unsqueeze(0))
            return evaluate(window)

        trainer.evaluate = scored
    else:  # a seed ensemble: PopulationTrainer.evaluate(window, members)
        evaluate = population.evaluate

        def scored_many(window, members):
            keep(window, list(members), lambda w: population.q_all(w, list(members)))
            return evaluate(window, members)

        population.evaluate = scored_many

    def keep(window, members, q_of):
        fold = watch["fold"]
        if fold is not None and tuple(window) == tuple(fold.chooser):
            with torch.no_grad():
                watch["into"].append({"members": members, "val": q_of(fold.chooser), "test": q_of(fold.test)})

    return watch


def snapshot_policies(epochs: list[dict], val_score=None) -> dict[str, torch.Tensor]:
    """The test window's (T, 3, 3) Q of each snapshot policy (learner_grid's doc, "snapshots"),
    from `epochs` as watch_snapshots keeps them. Only the members that every epoch scored count
    (a diverged or stopped member drops out of all of them); none: no policies. With
    `val_score(q)` (a member's Q on the chooser window -> its selection score) also "val_all",
    each member's epoch chosen on that score as the trainer chooses it (the first best), their
    mean Q (the fold's own policy under `select: val_score`), and "val_late", the same choice
    among the epochs after the first (epoch 0 ends while epsilon is still falling; its greedy
    policy is mostly flat, and flat scores 0, above any unlucky epoch's val)."""
    if not epochs:
        return {}
    common = set(epochs[0]["members"]).intersection(*(e["members"] for e in epochs))
    if not common:
        return {}

    def mean_q(e):  # the members' mean Q at epoch e
        rows = [e["members"].index(k) for k in sorted(common)]
        return e["test"][rows].mean(0)

    per_epoch = [mean_q(e) for e in epochs]
    out = {f"e{j}": q for j, q in enumerate(per_epoch)}
    out["last"] = per_epoch[-1]
    out["snap_all"] = torch.stack(per_epoch).mean(0)
    if len(per_epoch) > 1:
        out["snap_late"] = torch.stack(per_epoch[1:]).mean(0)
    if val_score is not None:
        scores = {k: [val_score(e["val"][e["members"].index(k)]) for e in epochs] for k in sorted(common)}
        for name, first in (("val_all", 0), ("val_late", 1)):
            if len(epochs) <= first:
                continue
            picks = []
            for k, member in scores.items():
                e = epochs[first + int(np.argmax(member[first:]))]  # the first best, as the trainer keeps it
                picks.append(e["test"][e["members"].index(k)])
            out[name] = torch.stack(picks).mean(0)
    return out


def line(r: dict) -> str:
    def share(x):
        return "n/a" if x is None else f"{x:.2f}"

    def done(v):  # a seed stopped at a time limit: its numbers are over the folds it did
        n = v.get("folds_done", r.get("folds"))
        return f" [{n}/{r['folds']} folds]" if n != r.get("folds") else ""

    seeds = " ".join(f"s{s} {v['sharpe']:+.2f} ({share(v['oracle_share'])}){done(v)}" for s, v in r["seeds"].items())
    ens = (
        f" | ensemble {r['ensemble']['sharpe']:+.2f} ({share(r['ensemble']['oracle_share'])})"
        if "ensemble" in r
        else ""
    )
    oracle = "n/a" if r["oracle"] is None else f"{r['oracle']:+.2f}"
    hours = ""
    if "edge_hours" in r:
        a, b = r["edge_hours"]
        each = " ".join(share(v["in_edge_hours"]) for v in r["seeds"].values())
        hours = f" | traded in {a}-{b} UTC: {each} (oracle {share(r['oracle_in_edge_hours'])})"
    curves = [v["epochs"] for v in r["seeds"].values() if "epochs" in v]
    if curves:  # "epoch_tests": the seeds' mean share (and trades) of each epoch's weights
        shares = [
            [c[e]["oracle_share"] for c in curves if len(c) > e and c[e]["oracle_share"] is not None]
            for e in range(max(map(len, curves)))
        ]
        trades = [[c[e]["n_trades"] for c in curves if len(c) > e] for e in range(len(shares))]
        hours += " | by epoch, mean share (trades): " + " ".join(
            f"e{e} {np.mean(x):.2f} ({np.mean(t):.0f})" if x else f"e{e} n/a"
            for e, (x, t) in enumerate(zip(shares, trades))
        )
        common = [v["common_epoch"] for v in r["seeds"].values() if v.get("common_epoch")]
        if common and all(c["oracle_share"] is not None for c in common):
            each = " ".join(f"e{c['epoch']} {c['oracle_share']:.2f}" for c in common)
            mean = np.mean([c["oracle_share"] for c in common])
            hours += f" | one epoch for all folds, chosen on pooled val: {each} (mean {mean:.2f})"
    snaps = [v["snapshots"] for v in r["seeds"].values() if "snapshots" in v]
    if snaps:  # "snapshots": the seeds' mean share (and trades) of each policy made of the epochs
        names = sorted({n for sn in snaps for n in sn}, key=lambda n: (n[0] != "e", n))
        cells = []
        for n in names:
            x = [sn[n]["oracle_share"] for sn in snaps if n in sn and sn[n]["oracle_share"] is not None]
            t = [sn[n]["n_trades"] for sn in snaps if n in sn]
            cells.append(f"{n} {np.mean(x):.2f} ({np.mean(t):.0f})" if x else f"{n} n/a")
        hours += " | snapshots, mean share (trades): " + " ".join(cells)
    head = f"{r['tag']:<24} {r['wall_s']:5.0f}s oracle {oracle} ridge {r['ridge']:+.2f} long {r['buy_and_hold']:+.2f}"
    return f"{head} | test (share) {seeds}{ens}{hours}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("grid", type=Path, metavar="GRID.json", help="a JSON list of jobs (lab/grids/)")
    p.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        metavar="DEVICE",
        help="cpu or cuda (default: cuda when there is one)",
    )
    p.add_argument("--json", type=Path, metavar="PATH", help="also write every job's numbers here")
    args = p.parse_args(argv)
    os.environ.setdefault("FXRAY_CACHE_DIR", str(Path.home() / ".cache" / "fxray"))
    jobs = json.loads(args.grid.read_text())
    results = []

    def write(partial=None):  # after every fold: a run stopped at a time limit keeps the folds it did
        if args.json:
            tmp = args.json.with_suffix(".part")
            tmp.write_text(json.dumps(results + ([partial] if partial else []), indent=1))
            tmp.replace(args.json)

    for job in jobs:
        results.append(run_job(job, args.device, on_fold=write))
        print(line(results[-1]), flush=True)
    write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
