"""The same training as a finished sweep, in one plain process: no Ray, no Tune, no MLflow.

    python scripts/replay.py runs/default/results.json [--device cuda] [--json replay.json]

Reads what `fxray.tune --json` wrote and trains, in this one process on one device,
every fold each trial trained in the sweep (same full config, same fold, same seed;
a trial's folds in order on one Trainer, as a FoldWorker does), writing checkpoints
to a temporary folder as the sweep does. The clock starts when this process starts,
so the plain loop pays what a FoldWorker pays once too (import torch, CUDA context,
the upload, the first graph capture).

That gives the sweep's overhead against the plain loop doing the same work:

    ideal wall on N workers = plain start-up + plain fold time / N
    overhead                = 1 - ideal wall / sweep wall

which counts as overhead everything Ray, Tune, Optuna and MLflow add (Ray's start,
worker processes, trial start and dispatch, folds started ahead and cancelled,
reporting, the tracking) and nothing the training itself costs. It also checks that
the plain loop reproduces each fold's val Sharpe (exactly on CPU; on CUDA the
reductions' order may differ by a few ulps, so to 1e-3). Every trial is trained
with the last round's seed: after an extension round run with another --seed, the
earlier rounds' folds are timed right but will not match.
"""

from __future__ import annotations

import time

T0 = time.time()  # before importing torch: the plain loop's start-up counts

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", type=Path, help="a sweep's results.json (fxray.tune --json)")
    p.add_argument("--device", default="auto", help="cuda, cpu or auto (cuda if there is one)")
    p.add_argument("--json", type=Path, help="write the timings and the comparison here")
    args = p.parse_args(argv)
    res = json.loads(args.results.read_text())

    import torch

    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    torch.set_num_threads(1)  # as a FoldWorker (its torch_threads)
    torch.zeros(1, device=device).add_(1).cpu()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from fxray.data import cache
    from fxray.data.arrays import host_arrays
    from fxray.data.folds import Fold
    from fxray.rl.config import make_config
    from fxray.rl.device import DeviceData
    from fxray.rl.trainer import Trainer

    market = cache.open(res["data"]["path"])
    if market.content_hash != res["data"]["content_hash"]:
        print(f"replay: {res['data']['path']} changed since the sweep (content hash differs)", file=sys.stderr)
        return 2
    data = DeviceData(host_arrays(market), device=device, dtype=res["base_config"].get("dtype", "float32"))
    data.synchronize()
    folds = {f["k"]: Fold.from_dict(f) for f in res["folds"]}
    seed = res["rounds"][-1]["seed"]  # what fxray.tune trains the last round with
    t_ready = time.time()

    fold_s, matched, worst, n = 0.0, 0, 0.0, 0
    tol = 0.0 if device == "cpu" else 1e-3
    with tempfile.TemporaryDirectory() as ckpt:
        for trial in res["trials"]:
            trainer = Trainer(data, [make_config(trial["config"])])
            for rec in trial["folds"]:
                t = time.time()
                (out,) = trainer.run_fold(folds[rec["fold"]], [seed], checkpoint_dirs=[f"{ckpt}/{trial['trial_id']}"])
                fold_s += time.time() - t
                diff = abs(float(out.val.get("sharpe", 0.0)) - rec["val"]["sharpe"])
                worst, n = max(worst, diff), n + 1
                matched += diff <= tol
    data.synchronize()
    wall = time.time() - T0
    startup = t_ready - T0
    workers = max(len(res.get("workers") or []), 1)
    ideal = startup + (wall - startup) / workers
    out = {
        "results": str(args.results),
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "folds": n,
        "plain_wall_s": wall,
        "plain_startup_s": startup,
        "plain_fold_s": fold_s,
        "sweep_wall_s": res["wall_s"],
        "sweep_workers": workers,
        "ideal_wall_s": ideal,
        "overhead_share": 1.0 - ideal / res["wall_s"],
        "val_sharpe_matched": matched,
        "val_sharpe_max_abs_diff": worst,
        "tolerance": tol,
    }
    print(f"replay of {args.results} on {out['device']}: {n} folds of {len(res['trials'])} trials")
    for k in (
        "plain_startup_s",
        "plain_fold_s",
        "plain_wall_s",
        "sweep_wall_s",
        "sweep_workers",
        "ideal_wall_s",
        "overhead_share",
        "val_sharpe_matched",
        "val_sharpe_max_abs_diff",
    ):
        v = out[k]
        print(f"  {k:<26} {v:.4g}" if isinstance(v, float) else f"  {k:<26} {v}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
