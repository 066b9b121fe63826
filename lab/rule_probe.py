"""The fold references alone (no learner): the screened rule and the oracle, pooled over every
fold's test window, on planted markets and their twins; seconds a market on the CPU.

    python lab/rule_probe.py [--profile gpu|cpu] [--beta 0.04] [--markets flow interaction ...]

A rule change (the screen's terms, the hysteresis grid) is judged here first: what the
screened rule earns is what the demonstrations teach the learner.
"""

from __future__ import annotations

import argparse

import numpy as np

from fxray.data import cache, synth
from fxray.data.folds import make_folds
from fxray.eval.pooled import pooled
from fxray.rl import experiment as exp_mod
from fxray.rl.device import DeviceData
from fxray.rl.references import references


def run(market: str, shuffle: bool, profile: str, beta, seed: int) -> dict:
    over = {"data.synth.seed": seed, "data.synth.shuffle": shuffle}
    if market != "flow":
        over["data.synth.structure"] = market
    if beta is not None:
        over["data.synth.beta"] = beta
    exp = exp_mod.load(exp_mod.default_experiment(), profile, over)
    m = cache.open(synth.ensure_default(exp.synth, log=lambda s: None))
    cfg = exp.config
    data = DeviceData(m, "cpu", dtype=cfg.dtype)
    windows: dict[str, list] = {}
    for fold in make_folds(m.ts, exp.folds):
        _, periods = references(data, fold, cfg.cost, cfg.fill, cfg.screen_t)
        for name, w in periods.items():
            windows.setdefault(name, []).append(w["test"])
    ppy = data.calendar.periods_per_year
    return {name: pooled(ws, cfg.cost, ppy) for name, ws in windows.items()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--profile", default="gpu")
    p.add_argument("--beta", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--markets", nargs="+", default=["flow", "session", "interaction", "regime", "threshold"])
    a = p.parse_args()
    for market in a.markets:
        for shuffle in (False, True):
            r = run(market, shuffle, a.profile, a.beta, a.seed)
            o = r.get("oracle", {}).get("sharpe")
            cells = []
            for name in ("screened", "ridge", "oracle"):
                s = r.get(name)
                if s:
                    share = f" ({s['sharpe'] / o:.2f})" if o and o > 0 and not shuffle else ""
                    cells.append(f"{name} {s['sharpe']:+6.2f} ± {s['sharpe_se'] or np.nan:.2f}{share}")
            print(f"{market + (' twin' if shuffle else ''):18s} " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
