"""Train one DQN config over every walk-forward fold, with no Ray.

    fxray train                                  # embedded synthetic market
    fxray train --data eurusd.fxcache --epochs 3 --folds 0,1 --device cuda
    fxray train --set lr=1e-3 --set hidden=128 --json result.json
    # tiny CPU run (seconds):
    fxray train --synth-bars 120000 --set steps_per_epoch=50 --epochs 2 --folds 0
    # re-train a sweep's trial from MLflow (config, folds, data hash, seed) and check its Sharpe:
    fxray train --from-run 20ed2998c1e44394887c65ed43ac6c64 --device cpu

A line per epoch (loss, val Sharpe, epoch time), then a per-fold table: val and
test Sharpe of the selected epoch against buy-and-hold and flat on the test window.
With --from-run, also the logged against the reproduced per-fold Sharpe (exit 1 if they
differ by more than --tolerance; 0 = bitwise, what a CPU run gives).
Also as python -m fxray.train.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import torch

from fxray.cli import check_file_out, command_parser, positive_int, run_command, same_data, seed
from fxray.data import cache
from fxray.data.folds import Fold, make_folds
from fxray.rl.config import DQNConfig, make_config
from fxray.rl.device import DeviceData
from fxray.rl.overrides import parse_sets
from fxray.rl.trainer import Trainer
from fxray.track.records import FoldRecord
from fxray.track.report import pooled_lines, sharpe_line
from fxray.track.results import fmt_s, pooled_stats


def resolve_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: no CUDA device is visible here; use --device cpu")
    if name != "cpu" and not name.startswith("cuda"):
        raise ValueError(f"--device {name!r}: use cpu, cuda, cuda:N or auto")
    return name


def parse_folds(text: str | None, n: int) -> list[int]:
    if text in (None, "all"):
        return list(range(n))
    try:
        ks = [int(k) for k in text.split(",")]
    except ValueError:
        raise ValueError(f"--folds {text!r}: give fold numbers like 0,2 or 'all'") from None
    bad = [k for k in ks if not 0 <= k < n]
    if bad:
        raise ValueError(f"--folds: fold(s) {bad} do not exist; this data has folds 0..{n - 1}")
    if len(set(ks)) != len(ks):
        raise ValueError(f"--folds {text!r}: a fold named twice; name each once")
    return ks


def load_setup(args):
    """(market path, FoldSpec, config, experiment name) from the CLI and the experiment file.

    The experiment's `cpu:` profile applies when training on the CPU, as in the sweep.
    """
    from fxray.data import synth
    from fxray.rl import experiment as exp_mod

    file = args.experiment or exp_mod.default_experiment()
    profile = "cpu" if args.device == "cpu" else "gpu"
    overrides = {"data.synth.n_bars": args.synth_bars} if args.synth_bars else {}
    exp = exp_mod.load(file, profile, overrides)
    sets = parse_sets(args.set or [])
    if args.epochs is not None:
        sets["epochs"] = args.epochs
    cfg = make_config({**exp.config.as_dict(), **sets}, where="--set")
    for line in exp_mod.load(file, profile, {**overrides, **{f"dqn.{k}": v for k, v in sets.items()}}).warnings():
        print(f"fxray.train: warning: {line}", file=sys.stderr)
    data_path = args.data or exp.data_path or synth.ensure_default(exp.synth, log=print)
    return data_path, exp.folds, cfg, f"{exp.name} ({profile} profile)"


def fold_table(results: list[dict]) -> str:
    """Per-fold values (a window's own daily Sharpe: for the table, not for judging); status
    "flat": a fold the learner abstained on (DQNConfig.abstain), not trained."""
    refs = [n for n in ("oracle", "ridge", "screened") if results and n in results[0]["baselines"]]
    head = (
        f"{'fold':>4} {'status':>8} {'best':>4} {'val SR':>8} {'test SR':>8} {'B&H SR':>8} "
        + "".join(f" {n + ' SR':>11}" for n in refs)
        + f" {'test DD log':>11} {'trades':>7} {'time s':>7}"
    )
    rows = [head, "-" * len(head)]
    nan = float("nan")
    for r in results:
        val, test, base = r["val"], r["test"], r["baselines"]
        status = "flat" if r.get("abstained") else r["status"]
        rows.append(
            f"{r['fold']['k']:>4} {status:>8} {r['best_epoch']:>4} {val.get('sharpe', nan):>8.2f} "
            f"{test.get('sharpe', nan):>8.2f} {base['buy_and_hold']['sharpe']:>8.2f} "
            + "".join(f" {base[n]['sharpe']:>11.2f}" for n in refs)
            + f" {test.get('max_drawdown', nan):>11.4f} {test.get('n_trades', 0):>7} {r['timings']['total_s']:>7.1f}"
        )
    return "\n".join(rows)


def run(args) -> dict:
    if args.from_run and (args.set or args.epochs is not None or args.experiment or args.synth_bars):
        raise ValueError("--from-run takes its config from the run: drop --set/--epochs/--experiment/--synth-bars")
    for flag, path, want_dir in (("--json", args.json, False), ("--checkpoint-dir", args.checkpoint_dir, True)):
        if path is not None and path.exists() and path.is_dir() != want_dir:  # found now, not after training
            raise ValueError(f"{flag} {path}: is {'not ' if want_dir else ''}a directory")
    check_file_out(args.json, "--json")
    device = args.device = resolve_device(args.device)
    origin = load_run(args) if args.from_run else None
    if origin:
        data_path, spec, cfg, name = origin["data_path"], None, origin["config"], f"MLflow run {args.from_run}"
    else:
        data_path, spec, cfg, name = load_setup(args)
    t0 = time.perf_counter()
    market = cache.open(data_path)  # values and content hash verified
    if origin:
        same_data(data_path, market.content_hash, args.from_run, origin["dataset_hash"])
        folds = origin["folds"]
        chosen = [k for k in parse_folds(args.folds, len(folds)) if k in origin["logged"]["fold_time_s"]]
        # a logged trial's folds: how long the sweep took for them, an estimate before the first fold ends
        took = f"; the sweep trained them in {fmt_s(sum(origin['logged']['fold_time_s'][k] for k in chosen))}"
    else:
        folds = make_folds(market.ts, spec)
        chosen, took = parse_folds(args.folds, len(folds)), ""
    data = DeviceData(market, device, dtype=cfg.dtype)
    t_load = time.perf_counter() - t0
    print(
        f"fxray.train: {name} on {data_path} ({market.n_bars:,} bars), {len(chosen)}/{len(folds)} folds, "
        f"device {device}, {cfg.epochs} epochs x {cfg.steps_per_epoch} steps, batch {cfg.batch_size}, "
        f"{cfg.num_envs} envs (load {t_load:.2f}s){took}",
        flush=True,
    )
    trainer = Trainer(data, [cfg])  # built once, reused fold after fold
    results, t_folds = [], time.perf_counter()
    for i, k in enumerate(chosen):
        seed = origin["seed"] if origin else args.seed + k  # a sweep trains every fold with its seed
        ckpt = args.checkpoint_dir / f"seed{seed if origin else args.seed}" if args.checkpoint_dir else None
        (r,) = trainer.run_fold(folds[k], [seed], log=lambda s: print(s, flush=True), checkpoint_dirs=[ckpt])
        results.append(r.as_dict())
        done, spent = i + 1, time.perf_counter() - t_folds
        eta = f"; ETA ~{fmt_s(spent / done * (len(chosen) - done))}" if done < len(chosen) else ""
        print(f"fxray.train: fold {k} {r.status} ({done}/{len(chosen)} folds, {fmt_s(spent)}{eta})", flush=True)
    print(fold_table(results))
    records = [FoldRecord.from_result(r).flat() for r in results]
    pooled = pooled_stats({"folds": records}, cfg.cost, data.calendar.periods_per_year)
    # the numbers to judge by: val and test windows pooled, with errors and the references
    print(f"val windows pooled: Sharpe {sharpe_line(pooled['val'])}; fill {cfg.fill}")
    print(*pooled_lines(pooled, cfg.cost), sep="\n")
    out = {
        "experiment": name,
        "data": str(data_path),
        "content_hash": market.content_hash,
        "device": device,
        "seed": origin["seed"] if origin else args.seed,
        "config": cfg.as_dict(),
        "fold_spec": spec.__dict__ if spec else None,
        "folds": results,
        "timings": {"load_s": t_load, "total_s": time.perf_counter() - t0},
        "pooled": pooled,
        "calendar": data.calendar.as_dict(),
    }
    if origin:
        out["from_run"] = check_reproduced(args.from_run, origin["logged"], results, args.tolerance)
    return out


# --- --from-run: a logged sweep trial, trained again ----------------------------------------


def load_run(args) -> dict:
    """Config, folds, seed, data file and logged per-fold Sharpe of an fxray trial run in MLflow.

    MLflow is imported here only: the rest of fxray.train runs without it.
    """
    from fxray.track.runs import trial_run

    run_id = args.from_run
    client, run, _ = trial_run(run_id, args.tracking_uri, ("fxray.folds", "fxray.dataset_hash"), f"--from-run {run_id}")
    tags = run.data.tags
    seed = int(tags["fxray.seed"]) if "fxray.seed" in tags else args.seed
    if seed is None:
        raise ValueError(f"--from-run {run_id}: the run has no fxray.seed tag; pass --seed (its sweep.seed)")
    data_path = args.data or tags.get("fxray.data_path")
    if data_path is None or not Path(data_path).exists():
        raise ValueError(
            f"--from-run {run_id}: its data file {data_path or '(not recorded)'} is not here; "
            "pass --data with a copy of it"
        )
    # [k, train, val, test] and, where the sweep chose its epochs on a holdout window, that window
    folds = [
        Fold.from_dict(dict(zip(("k", "train", "val", "test", "holdout"), f))) for f in json.loads(tags["fxray.folds"])
    ]
    # fold_time_s: logged for every fold that ran; a window's Sharpe is not logged where it is
    # undefined (fxray.track.records.mlflow_metrics), which the trainer reports as 0.0
    logged = {
        m: {p.step: p.value for p in client.get_metric_history(run_id, m)}
        for m in ("val_sharpe", "test_sharpe", "fold_time_s")
    }
    return {
        "config": config_from_params(run.data.params, run_id),
        "folds": folds,
        "seed": seed,
        "data_path": data_path,
        "dataset_hash": tags["fxray.dataset_hash"],
        "logged": logged,
    }


def config_from_params(params: dict, run_id: str):
    """The config a trial logged as MLflow params (strings), with its exact Python types:
    str(float) round-trips bit for bit; an int given to a float field stays an int."""
    types = {f.name: f.type for f in dataclasses.fields(DQNConfig)}  # "int", "float", "bool", "str"
    values = {}
    for key, text in params.items():
        kind = types.get(key, "str")  # an unknown key: make_config names it (an older run's algo: read past)
        try:
            if kind == "bool":
                values[key] = {"true": True, "false": False}[text.lower()]
            elif kind == "int" or (kind == "float" and text.lstrip("-").isdigit()):
                values[key] = int(text)
            else:
                values[key] = float(text) if kind == "float" else text
        except (KeyError, ValueError):
            raise ValueError(f"--from-run {run_id}: param {key}={text!r} is not a valid {kind}") from None
    return make_config(values, where=f"--from-run {run_id}: params")


def check_reproduced(run_id: str, logged: dict, results: list[dict], tolerance: float) -> dict:
    """Logged vs re-trained per-fold Sharpe, as the sweep reports them (no finished epoch: 0.0)."""
    rows, diff = [], 0.0
    print(f"{'fold':>4} {'logged val':>14} {'now val':>14} {'logged test':>14} {'now test':>14}  same")
    for r in results:
        k, row = r["fold"]["k"], {"fold": r["fold"]["k"]}
        for w in ("val", "test"):
            was = logged[f"{w}_sharpe"].get(k, 0.0 if k in logged["fold_time_s"] else None)
            row[f"logged_{w}_sharpe"], row[f"{w}_sharpe"] = was, float(r[w].get("sharpe", 0.0))
            # a fold whose Sharpe was never logged cannot be checked
            diff = max(diff, math.inf if was is None else abs(row[f"{w}_sharpe"] - was))
        row["bitwise"] = all(row[f"logged_{w}_sharpe"] == row[f"{w}_sharpe"] for w in ("val", "test"))
        rows.append(row)
        cells = [row[c] for c in ("logged_val_sharpe", "val_sharpe", "logged_test_sharpe", "test_sharpe")]
        print(
            f"{k:>4} "
            + " ".join("n/a".rjust(14) if v is None else f"{v:>+14.8f}" for v in cells)
            + f"  {'yes' if row['bitwise'] else 'NO'}"
        )
    ok = bool(rows) and diff <= tolerance
    verdict = ("bitwise" if all(r["bitwise"] for r in rows) else f"within {tolerance:g}") if ok else "NOT"
    print(f"run {run_id}: {len(rows)} fold(s) reproduced {verdict}" + ("" if ok else f" (max |diff| {diff:.3g})"))
    return {"run_id": run_id, "folds": rows, "max_abs_diff": diff, "tolerance": tolerance, "reproduced": ok}


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("train", __doc__)
    p.add_argument(
        "--data",
        type=Path,
        metavar="FXCACHE",
        help="an fxcache (default: the experiment's data, else the synthetic market)",
    )
    p.add_argument(
        "--experiment",
        type=Path,
        metavar="YAML",
        help="experiment YAML for folds and the base config (default: experiments/default.yaml)",
    )
    p.add_argument("--epochs", type=int, metavar="N", help="max epochs per fold (overrides the config)")
    p.add_argument("--folds", metavar="K,K,...", help="fold numbers, e.g. 0,2 (default: all)")
    p.add_argument("--device", default="auto", metavar="DEVICE", help="cpu, cuda, cuda:N or auto (default)")
    p.add_argument(
        "--seed",
        type=seed,
        metavar="INT",
        help="fold k trains with seed + k (default 0; with --from-run: "
        "the run's seed, used for every fold as in the sweep)",
    )
    p.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="override a config field, repeatable (fxray/rl/config.py)"
    )
    p.add_argument("--synth-bars", type=positive_int, metavar="N", help="size of the synthetic market when no --data")
    p.add_argument(
        "--checkpoint-dir", type=Path, metavar="DIR", help="write each fold's best weights here (safetensors + JSON)"
    )
    p.add_argument("--json", type=Path, metavar="PATH", help="write per-fold metrics, config and timings as JSON")
    p.add_argument(
        "--from-run",
        metavar="RUN_ID",
        help="re-train an MLflow trial run of a sweep: its config, "
        "folds, seed and data (content hash checked); compare its per-fold Sharpe",
    )
    p.add_argument(
        "--tracking-uri",
        metavar="URI",
        help="MLflow store of --from-run (default: $MLFLOW_TRACKING_URI, else sqlite:///./mlflow.db)",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=0.0,
        metavar="X",
        help="--from-run: max |Sharpe difference| that counts as reproduced (default 0: bitwise, as on CPU)",
    )
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if not args.from_run and args.seed is None:
        args.seed = 0
    # exit status 1: a --from-run whose Sharpe was not reproduced
    return run_command(
        run, args, announce=True, status=lambda r: int("from_run" in r and not r["from_run"]["reproduced"])
    )


if __name__ == "__main__":
    sys.exit(main())
