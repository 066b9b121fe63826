"""A fold's references and the learner's abstention, both decided on the fold alone (no trial's
hyperparameters): what every trained policy is shown beside, and whether there is anything to train.

    table, periods = references(data, fold, cost, fill, screen_t)   # kept on `data` once per fold
    abstains(data, fold, cfg)                                        # the checked screen keeps nothing
"""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import torch

from fxray.data.folds import Fold
from fxray.eval import baselines
from fxray.eval.backtest import buy_and_hold, evaluate
from fxray.eval.metrics import summarize
from fxray.rl import frontend
from fxray.rl.config import DQNConfig
from fxray.rl.device import DeviceData


def references(data: DeviceData, fold: Fold, cost: float, fill: str, screen_t: float = 0.0) -> tuple[dict, dict]:
    """buy_and_hold and flat; the supervised rule ("ridge": all the inputs), with `screen_t` > 0
    the same rule on the inputs of the learner's checked screen ("screened": its demonstrator's
    rule, fxray.rl.demo), and, on a planted market, the oracle (the same rule on the columns that
    carry the signal, in the hours it is on; fxray.eval.baselines), all fitted on the train
    slice only. Returns (test metrics by name, hourly returns by name and window), computed once
    per (fold, cost, fill, screen_t) on `data` and kept there, beside the demonstrator's moves on
    the train bars (the rule's path from each previous position: "screened", else "ridge")."""
    key = (repr(fold.as_dict()), cost, fill, screen_t)
    if key in data.references:
        return data.references[key][:2]
    windows = {w: data.window(getattr(fold, w), fill) for w in ("val", "test")}
    runs = {"buy_and_hold": {w: buy_and_hold(windows[w], cost) for w in windows}}
    train = data.window(fold.train, fill)
    # each window's bars that have a next bar, and their inputs (read by every rule)
    spans = {w: (getattr(fold, w)[0], getattr(fold, w)[1] - 1) for w in ("train", "val", "test")}
    x = {w: data.states(torch.arange(*span, device=data.device)) for w, span in spans.items()}
    rules = {"ridge": (None, None, None)}
    if screen_t > 0:
        rules["screened"] = (frontend.screened_inputs(data, fold, cost, fill, screen_t), None, None)
    if data.oracle is not None:
        rules["oracle"] = data.oracle  # (columns, hours, form: a nonlinear market's, else None)
    for name, (columns, hours, form) in rules.items():
        gate = data.hour_gate(*spans["train"], hours)
        rule = baselines.fit_rule(
            x["train"], train.fresh, cost, carry=train.carry, columns=columns, gate=gate, form=form
        )
        runs[name] = {
            w: evaluate(rule.positions(x[w], data.hour_gate(*spans[w], hours)), windows[w], cost) for w in windows
        }
        if name == ("screened" if screen_t > 0 else "ridge"):  # the demonstrator (fxray.rl.demo)
            moves = baselines.hysteresis_moves(rule.signal(x["train"]), rule.enter, rule.exit).to(torch.int8)
    table = {name: asdict(run["test"].metrics) for name, run in runs.items()}
    table["flat"] = asdict(summarize(np.zeros(runs["buy_and_hold"]["test"].metrics.n_days)))
    periods = {name: {w: r.periods.as_dict() for w, r in run.items()} for name, run in runs.items()}
    data.references[key] = table, periods, moves
    return table, periods


def abstains(data: DeviceData, fold: Fold, cfg: DQNConfig) -> bool:
    """`cfg.abstain` and the checked screen keeps no input on `fold`'s train slice. Leaves `fold`
    active on `data`."""
    if not cfg.abstain:
        return False
    if data.fold != fold:
        data.set_fold(fold)
    return frontend.screened_inputs(data, fold, cfg.cost, cfg.fill, cfg.screen_t).numel() == 0
