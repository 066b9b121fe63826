"""A frozen policy on a whole fxcache: Q-values of a window, the greedy backtest, its scores.

    data = DeviceData(market, "cuda")               # or "cpu": one upload, as in training
    q = q_values(bundle, data, (start, end))        # (T, 3, 3): bars [start, end - 1)
    report = score(bundle, data, (start, end), q)   # metrics, pooled statistics, baselines
    as_trained(bundle, "test", report["policy"]["metrics"], changes=[])   # beside training's own

The inputs are normalised with each member's own train-slice statistics from the bundle,
never with statistics of the new data (no look-ahead). With engine "torch" the Q-values
are computed by the network training used (fxray.rl.network, same normalisation code, same
chunks), so on the training data and device the backtest
of a fold's test window gives back the sweep's test metrics bit for bit (the sweep's Q-values
are the checkpointed plain network's, fxray.rl.network.QNetwork.q_all, so its float32 numbers are
these). Engine "onnxruntime" runs the bundle's ONNX graphs (CPU) instead.
"""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import torch

from fxray.eval import pooled
from fxray.eval.backtest import backtest, buy_and_hold, evaluate
from fxray.policy import onnx
from fxray.policy.bundle import Bundle, check_engine
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
    check_engine(engine, ENGINES)
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
    flat = torch.zeros_like(w.fresh, dtype=torch.int8)

    def entry(r):
        return {"metrics": asdict(r.metrics), "pooled": pooled.pooled([r.periods.as_dict()], cost, ppy)}

    report = {
        "cost": cost,
        "fill": bundle.fill,
        "periods_per_year": ppy,
        "calendar": data.calendar.as_dict(),
        "policy": {**entry(result), "periods": result.periods.as_dict()},
        "baselines": {"buy_and_hold": entry(buy_and_hold(w, cost)), "flat": entry(evaluate(flat, w, cost))},
    }
    return report, result


def as_trained(bundle: Bundle, window: str, metrics: dict, changes: list[str]) -> dict:
    """This backtest's `metrics` of `window` ("val" | "test": the last member's fold's) beside
    the ones training logged for that fold, i.e. the sweep's fold Sharpe (folds.csv, MLflow's
    `<window>_sharpe` at step = fold) and `fxray train`'s fold table: {"fold", "trained" (the
    manifest's metrics of the fold, or None), "equal", "why": one sentence}.

    They are equal, every metric bit for bit, where the bundle is the fold's own policy (every
    member of that one fold: --model last, fold:K, best) and the backtest runs it as training
    ran it: `changes` empty (the CLI lists what it runs otherwise: --cost, --from/--to, the ONNX
    engine, a GPU). They differ by design where the policy is not the one the fold scored
    (--model ensemble: several folds' networks) or is run another way."""
    members = bundle.manifest["members"]
    k = members[-1]["fold"]["k"]
    trained = members[-1].get(window) or None
    folds = sorted({m["fold"]["k"] for m in members})
    equal = trained is not None and all(metrics[name] == trained.get(name) for name in metrics)
    choice = bundle.manifest["model"]["choice"]
    if len(folds) > 1:
        why = (
            f"differs by design: --model {choice} is the mean Q of folds {', '.join(map(str, folds))}'s networks, "
            f"the sweep scored fold {k}'s alone"
        )
    elif trained is None:
        why = f"the bundle holds no {window} metrics of fold {k} to compare with"
    elif equal:
        why = "equal to training's, every metric bit for bit"
        if choice == "best":
            why += f" (--model best chose fold {k} by its val score: its test window no longer checks that choice)"
    elif changes:
        why = f"differs by design: {', '.join(changes)}, not as training ran it"
    else:  # a GPU-trained policy: training's float rounding (TF32, reduction order) can flip a near tie
        why = "differs from training's: expected equal where training ran on the CPU (docs/policy.md)"
    return {"fold": k, "window": window, "trained": trained, "equal": equal, "why": why}
