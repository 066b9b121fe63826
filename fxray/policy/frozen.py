"""A frozen policy on a whole fxcache: Q-values of a window, the greedy backtest, its scores.

    data = DeviceData(market, "cuda")               # or "cpu": one upload, as in training
    q = q_values(bundle, data, (start, end))        # (T, 3, 3): bars [start, end - 1)
    report = score(bundle, data, (start, end), q)   # metrics, pooled statistics, baselines

The inputs are normalised with each member's own train-slice statistics from the bundle,
never with statistics of the new data (no look-ahead). With engine "torch" the Q-values
are computed by the network training used (fxray.rl.network, same normalisation code, same
chunks), so on the training data and device the backtest
of a fold's test window gives back the sweep's test metrics bit for bit. Engine
"onnxruntime" runs the bundle's ONNX graphs (CPU) instead.
"""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import torch

from fxray.eval import pooled
from fxray.eval.backtest import backtest, buy_and_hold, evaluate
from fxray.policy import onnx
from fxray.policy.bundle import Bundle
from fxray.rl.device import DeviceData
from fxray.rl.network import QNetwork
from fxray.rl.trainer import window_bars

ENGINES = ("torch", "onnxruntime")


def q_network(weights: dict, device="cpu") -> QNetwork:
    """A member's QNetwork (K = 1) from its weights by checkpoint name (numpy or torch)."""
    return QNetwork.from_states([{k: torch.from_numpy(np.array(v)) for k, v in weights.items()}], device)


@torch.no_grad()
def q_values(bundle: Bundle, data: DeviceData, window: tuple[int, int], engine: str = "torch") -> torch.Tensor:
    """(T, 3, 3) Q[t, previous position + 1, action] for bars [start, end - 1) of `window`
    (the bars with a next bar), on data.device. Leaves data's active-fold statistics set to
    the last member's (the bundle's, not the data's)."""
    if engine not in ENGINES:
        raise ValueError(f"engine {engine!r}: use one of {', '.join(ENGINES)}")
    qs, chunks = [], window_bars(data, window)
    for member in bundle.members:
        data.mean.copy_(torch.from_numpy(member.mean))
        data.inv_std.copy_(torch.from_numpy(member.inv_std))
        if engine == "torch":
            net = q_network(member.weights, data.device)
            qs.append(torch.cat([net.q_all(data.states(t).unsqueeze(0))[0] for t in chunks]))
        else:
            sess = onnx.session(member.onnx, threads=0)  # 0: onnxruntime's default (all cores)
            parts = [torch.from_numpy(onnx.run(sess, data.states(t).cpu().numpy())) for t in chunks]
            qs.append(torch.cat(parts).to(data.device))
    return qs[0] if len(qs) == 1 else torch.stack(qs).mean(0)  # the policy's Q: the members' mean


def score(bundle: Bundle, data: DeviceData, window: tuple[int, int], q: torch.Tensor, cost: float | None = None):
    """The greedy policy of `q` over `window`, beside buy-and-hold and flat, at `cost` (default
    the bundle's) and the bundle's fill: (report dict, the policy's BacktestResult)."""
    cost = bundle.cost if cost is None else cost
    w = data.window(window, bundle.fill)
    ppy = data.calendar.periods_per_year
    result = backtest(q, w, cost)
    runs = {
        "buy_and_hold": buy_and_hold(w, cost),
        "flat": evaluate(torch.zeros_like(w.fresh, dtype=torch.int8), w, cost),
    }

    def entry(r):
        return {"metrics": asdict(r.metrics), "pooled": pooled.pooled([r.periods.as_dict()], cost, ppy)}

    report = {
        "cost": cost,
        "fill": bundle.fill,
        "periods_per_year": ppy,
        "calendar": data.calendar.as_dict(),
        "policy": {**entry(result), "periods": result.periods.as_dict()},
        "baselines": {name: entry(r) for name, r in runs.items()},
    }
    return report, result
