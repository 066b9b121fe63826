"""The fold record: one trained fold of one trial, and every form it is written in.

    record = FoldRecord.from_result(fold_result_dict)   # on the trial side, from a FoldWorker
    record.flat()            # what the trial reports to Tune and the driver appends to folds.jsonl
    FoldRecord.from_flat(d)  # a folds.jsonl line back
    put_baselines(storage, record); with_baselines(storage, flat_dict, cache)   # their file, apart
    record.results_json()    # a fold of results.json (val/test metric dicts, timings)
    record.csv_row()         # a row of folds.csv (columns CSV_COLUMNS)
    record.mlflow_metrics()  # the child run's metrics at step = fold

Every form is derived from the fields below and from fxray.eval.metrics.Metrics (the
window metrics, as `val_<name>` / `test_<name>`): adding a metric is one edit there,
adding a fold field one edit here. A field's `metadata` says where it goes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from fxray.eval.metrics import Metrics

WINDOWS = ("val", "test")
WINDOW_METRICS = tuple(f.name for f in dataclasses.fields(Metrics))  # sharpe, sortino, ...
TIMINGS = ("fold_switch_s", "train_s", "eval_s", "fold_time_s", "trial_start")
# MLflow names of window metrics whose unit is not the obvious one (both are sums of log returns)
MLFLOW_NAMES = {"max_drawdown": "max_drawdown_log", "total_return": "total_return_log"}
# ratios that fxray.eval.metrics sets to exactly 0.0 when they are undefined ("no evidence"):
# Sharpe of < 2 days or no dispersion (a window that stayed flat), Sortino without a losing
# day, Calmar without a drawdown. A computed ratio is exactly 0.0 only when the mean return
# is exactly 0.0, which in practice is the flat window, undefined already.
UNDEFINED_AT_ZERO = ("sharpe", "sortino", "calmar")


def fold_checkpoints(folder: Path, k: int) -> list[Path]:
    """A trial's checkpoints of fold k in `folder`: its one network (fold<k>.safetensors), or a
    seed ensemble's members (fold<k>.m<i>.safetensors, fxray.rl.trainer); [] if none."""
    one = folder / f"fold{k}.safetensors"
    return [one] if one.exists() else sorted(folder.glob(f"fold{k}.m*.safetensors"))


def _f(default=None, *, metric=False, csv=True, factory=None):
    """A FoldRecord field: `metric` -> an MLflow metric of the child run; `csv` -> a folds.csv column."""
    meta = {"metric": metric, "csv": csv}
    return field(default_factory=factory, metadata=meta) if factory else field(default=default, metadata=meta)


def seed_fields(spread: dict) -> dict:
    """FoldRecord's seed fields from a FoldResult's seed_spread (fxray.rl.trainer)."""
    if not spread:
        return {}

    def std(values):
        xs = [float(v) for v in values if v is not None and math.isfinite(v)]
        return statistics.stdev(xs) if len(xs) >= 2 else None

    return {
        "seeds": len(spread["seeds"]),
        "seed_val_sharpe_std": std(spread["val_sharpe"]),
        "seed_test_sharpe_std": std(spread["test_sharpe"]),
        "seed_test_sharpe": list(spread["test_sharpe"]),
    }


@dataclass
class FoldRecord:
    """One fold of one trial. `val`/`test`: {metric: value} of the kept weights on the
    window (Metrics fields: per-window numbers, for tables; empty when the fold has no
    result, e.g. it diverged); a flat form names them `val_sharpe`, ... (None if empty).
    `val_periods`/`test_periods`: the windows' hourly returns (PeriodReturns.as_dict()),
    what the pooled statistics are made of; `baseline_periods` the same of the reference
    rules ({"buy_and_hold" | "ridge" | "oracle": {"val": ..., "test": ...}})."""

    fold: int = _f(0)
    status: str = _f("ok")  # ok | diverged | cancelled
    epochs: int = _f(0, metric=True)  # epochs run
    best_epoch: int = _f(-1)  # 0-based; -1 if none was kept
    val: dict = _f(factory=dict)
    test: dict = _f(factory=dict)
    val_score: float | None = _f(None, metric=True)  # the kept epoch's selection score on the val window
    bh_test_sharpe: float | None = _f(None, metric=True)  # buy-and-hold on the test window
    worker: int = _f(-1)
    population: int = _f(1)  # members of the population the fold trained in (its timings are the population's)
    # seeds > 1 (fxray.rl.trainer): val/test above are the ensemble's; each seed's alone beside it
    seeds: int = _f(1)
    seed_val_sharpe_std: float | None = _f(None, metric=True)  # spread of the seeds' val Sharpe
    seed_test_sharpe_std: float | None = _f(None, metric=True)
    seed_test_sharpe: list = _f(factory=list, csv=False)  # each seed's test Sharpe
    checkpoint: str = _f("")
    fold_switch_s: float = _f(0.0)
    train_s: float = _f(0.0)
    eval_s: float = _f(0.0)
    fold_time_s: float = _f(0.0, metric=True)
    val_periods: dict = _f(factory=dict, csv=False)
    test_periods: dict = _f(factory=dict, csv=False)
    baseline_periods: dict = _f(factory=dict, csv=False)
    # folds.jsonl and Tune carry the baselines' file in the run directory in their place (put_baselines)
    baselines_file: str = _f("", csv=False)
    # --- the trial's running numbers after this fold (set by the trial) ----------------------
    folds_done: int = _f(0)
    score: float = _f(0.0, metric=True)  # the sweep's objective: fxray.sweep.trial.objective
    mean_val_sharpe: float | None = _f(None, metric=True)  # per-fold means: for tables only
    mean_test_sharpe: float | None = _f(None, metric=True)
    trial_start: float | None = _f(None, csv=False)

    @classmethod
    def from_result(cls, r: dict) -> FoldRecord:
        """A FoldResult dict (fxray.rl.trainer) -> a record."""
        timings, has = r["timings"], bool(r["val"])
        return cls(
            fold=r["fold"]["k"],
            status=r["status"],
            epochs=r["epochs_run"],
            best_epoch=r["best_epoch"],
            **{w: {k: float(r[w][k]) for k in WINDOW_METRICS} if has else {} for w in WINDOWS},
            val_score=r.get("val_score") if has else None,
            bh_test_sharpe=r["baselines"].get("buy_and_hold", {}).get("sharpe"),
            worker=r.get("worker", -1),
            population=r.get("population", 1),
            **seed_fields(r.get("seed_spread") or {}),
            checkpoint=r["checkpoint"] or "",
            fold_time_s=timings.get("total_s", 0.0),
            **{k: timings.get(k, 0.0) for k in ("fold_switch_s", "train_s", "eval_s")},
            val_periods=r.get("val_periods", {}),
            test_periods=r.get("test_periods", {}),
            baseline_periods=r.get("baseline_periods", {}),
        )

    @property
    def ok(self) -> bool:
        """A fold with a result (val and test windows scored)."""
        return self.status == "ok" and bool(self.val_periods)

    # --- the flat form: Tune reports and folds.jsonl -------------------------------------------
    def flat(self) -> dict:
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in WINDOWS:  # a window's metrics: one key each
                out.update({f"{f.name}_{k}": value.get(k) for k in WINDOW_METRICS})
            else:
                out[f.name] = value
        return out

    @classmethod
    def from_flat(cls, d: dict) -> FoldRecord:
        """A flat dict (a folds.jsonl line, a Tune result) -> a record; keys it does not know
        (the trial id, the config, Tune's own) are ignored."""
        names = {f.name for f in dataclasses.fields(cls)} - set(WINDOWS)
        windows = {w: {k: d[f"{w}_{k}"] for k in WINDOW_METRICS if d.get(f"{w}_{k}") is not None} for w in WINDOWS}
        return cls(**{k: v for k, v in d.items() if k in names}, **windows)

    # --- the other forms -----------------------------------------------------------------------
    def results_json(self) -> dict:
        """A fold of results.json: val/test metric dicts and the timings grouped."""
        left = (*TIMINGS, "folds_done", "score", "mean_val_sharpe", "mean_test_sharpe")  # the trial's running numbers
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in left}
        return {**out, "timings": {k: getattr(self, k) for k in TIMINGS}}

    def csv_row(self) -> list:
        flat = self.flat()
        return ["" if flat[c] is None else flat[c] for c in CSV_COLUMNS]

    def mlflow_metrics(self) -> dict[str, float]:
        """{name: value} logged at step = fold: every window metric (named `<window>_<name>`,
        with its unit where the name alone would mislead: MLFLOW_NAMES) and the fields marked
        `metric`. An undefined value is not logged, so that the UI shows a gap, not a number
        that ranks: None/NaN (e.g. a diverged fold's Sharpe), a ratio of UNDEFINED_AT_ZERO at
        exactly 0.0 (fxray.eval.metrics reports "no evidence" so: a window Sharpe of < 2 days
        or of a flat window, Sortino with no losing day, Calmar with no drawdown; the same of
        bh_test_sharpe), and the hit rate of a window with no trade (never in the market).
        results.json and folds.csv keep the metrics' own names and values (0.0 there)."""
        out = {}
        for w in WINDOWS:
            m = getattr(self, w)
            for k in WINDOW_METRICS:
                v = m.get(k)
                if v is None or (k in UNDEFINED_AT_ZERO and v == 0.0) or (k == "hit_rate" and not m.get("n_trades")):
                    continue
                out[f"{w}_{MLFLOW_NAMES.get(k, k)}"] = v
        out.update({f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata["metric"]})
        if out.get("bh_test_sharpe") == 0.0:  # buy-and-hold's window Sharpe: undefined under 2 days
            del out["bh_test_sharpe"]
        if self.status != "ok":  # a diverged fold's trial has no score (the run's tag fxray.status says why)
            out["score"] = None
        return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(float(v))}


BASELINES_NAME = re.compile(r"baselines/[0-9a-f]{24}\.json")  # put_baselines' files, relative to the run directory


def put_baselines(storage, record: FoldRecord) -> None:
    """Move `record`'s baseline_periods into a file of the run directory, baselines/<hash of their
    content>.json, written once (every trial of a fold and shape has the same: a fold record is
    then ~0.015 MB, not ~0.1, in Tune's results, in folds.jsonl and in what each trial reads of it)."""
    if not record.baseline_periods:
        return
    text = json.dumps(record.baseline_periods, sort_keys=True)
    name = f"baselines/{hashlib.blake2b(text.encode(), digest_size=12).hexdigest()}.json"
    path = Path(storage) / name
    if not path.exists():  # another trial's identical file may land first: both are whole
        path.parent.mkdir(exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, path)
    record.baselines_file, record.baseline_periods = name, {}


def with_baselines(storage, flat: dict, cache: dict) -> dict:
    """A flat record (a folds.jsonl line) with its baseline_periods read back from its
    baselines_file (put_baselines); `cache`: {file: periods} across calls."""
    name = flat.get("baselines_file")
    if name:
        if name not in cache:
            cache[name] = json.loads((Path(storage) / name).read_text())
        flat["baseline_periods"] = cache[name]
    return flat


# folds.csv's columns: the flat form's keys, less the fields marked csv=False
_NOT_CSV = {f.name for f in dataclasses.fields(FoldRecord) if not f.metadata["csv"]}
CSV_COLUMNS = tuple(k for k in FoldRecord().flat() if k not in _NOT_CSV)
