"""The sweep's full trials as one policy: at every bar and position, the action most of them take.

    ensemble = vote_of_full_trials(results, data)     # results.json's dict, before it is written
    write_results(..., ensemble=on_worker(workers))   # the sweep: the same, on FoldWorker 0
    combined = combine_trials(results, data, sizes=[1, 5, len(full)])

Why: a config's fold result is one draw from a distribution about as wide as the spread
between configs, so the chosen trial is the luckiest draw on val. A vote of the trials that
ran every fold (the ones ASHA kept, on their val windows) averages some of that luck away,
as bagging does.

Only val decides: membership is ASHA's (val scores), the ranking is by pooled val Sharpe. The
rule (all full trials, a majority vote) is fixed before a sweep starts, so its pooled test
statistics are one policy's out of sample; the sweep still reports and deflates its chosen
trial as `best`.

Members may differ in gamma, n_step and reward scale, so raw Q-values are not comparable:
each member's greedy action at every bar and previous position is one vote; the
policy takes the action with the most votes (ties: the lower action index, as argmax
breaks them).
Needs the run directory's checkpoints (checkpoints/<trial>/fold<k>.safetensors; a seed
ensemble's trial, its members' fold<k>.m<i>.safetensors, whose mean Q is its policy). A trial
that is flat on a fold (dqn.abstain: its checked screen kept nothing, or dqn.keep won: no epoch
won on val; no weights) is flat there: its vote is "no position" at every bar.
"""

from __future__ import annotations

from pathlib import Path

from fxray.rl.checkpoint import abstained
from fxray.track.records import fold_checkpoints

MIN_MEMBERS = 3  # fewer full trials: no vote (a vote of two is the first one's action at each tie)


def full_trials(results: dict) -> list[dict]:
    """The trials that ran every fold, best pooled val Sharpe first."""
    n_folds = len(results["folds"])
    full = [t for t in results["trials"] if t["status"] == "ok" and t["folds_done"] >= n_folds]
    return sorted(full, key=lambda t: t["val"]["sharpe"], reverse=True)


def missing_checkpoints(results: dict, trials: list[dict]) -> list[Path]:
    """The fold checkpoints of `trials` that are not there, but for the folds a trial abstained
    on (dqn.abstain: not trained, no weights but a marker; its vote there is flat)."""
    ckpts = Path(results["storage"]) / "checkpoints"
    folders = [(ckpts / t["trial_id"], f["k"]) for t in trials for f in results["folds"]]
    return [d / f"fold{k}.safetensors" for d, k in folders if not fold_checkpoints(d, k) and not abstained(d, k)]


def votes(q):
    """(..., n_actions) values -> one-hot greedy actions: their mean over members is each
    action's share of the votes, and its argmax the majority (ties: the lower index)."""
    import torch

    return torch.nn.functional.one_hot(q.argmax(-1), q.shape[-1]).to(q.dtype)


def combine_trials(results: dict, data, sizes: list[int]) -> dict:
    """{n: {"val": pooled stats, "test": pooled stats}} of the top n full trials combined, per
    fold, on that fold's val and test windows. `data`: a DeviceData of the sweep's market."""
    import torch

    from fxray.data.folds import Fold
    from fxray.eval import pooled
    from fxray.eval.backtest import backtest
    from fxray.rl.checkpoint import load_checkpoint
    from fxray.rl.config import make_config
    from fxray.rl.network import QNetwork
    from fxray.rl.trainer import window_bars

    full = full_trials(results)
    sizes = sorted({min(n, len(full)) for n in sizes})
    known = set(make_config({}).as_dict())  # the recorded config's keys that the config knows
    first = make_config({k: v for k, v in full[0]["config"].items() if k in known})
    ckpts, ppy = Path(results["storage"]) / "checkpoints", results["periods_per_year"]
    cost, fill = first.cost, first.fill

    def member(trial: dict, fold: Fold) -> dict:
        """{window: (T, 3, 3) votes (one-hot greedy actions)}."""
        paths = fold_checkpoints(ckpts / trial["trial_id"], fold.k)
        if not paths and abstained(ckpts / trial["trial_id"], fold.k):  # untrained, flat: it votes flat
            flat = torch.tensor([0.0, 1.0, 0.0], device=data.device)  # action 1: no position (greedy_positions)
            n = {w: getattr(fold, w)[1] - 1 - getattr(fold, w)[0] for w in ("val", "test")}
            return {w: flat.expand(n[w], 3, 3) for w in n}
        net = QNetwork.from_states([load_checkpoint(p)[0] for p in paths], data.device)  # a seed ensemble: K > 1
        k, out = len(paths), {}
        for w in ("val", "test"):
            with torch.no_grad():  # its mean Q, as the trainer scored it
                chunks = window_bars(data, getattr(fold, w))
                q = torch.cat([net.q_all(data.states(t).unsqueeze(0).expand(k, -1, -1)) for t in chunks], 1).mean(0)
            out[w] = votes(q)  # its greedy action, as the trainer's backtest takes it
        return out

    periods = {n: {"val": [], "test": []} for n in sizes}
    for fd in results["folds"]:
        fold = Fold.from_dict(fd)
        data.set_fold(fold)  # the fold's train-slice normalisation, as in training
        members = [member(t, fold) for t in full[: sizes[-1]]]
        for n in sizes:
            for w in ("val", "test"):
                mean = torch.stack([m[w] for m in members[:n]]).mean(0)
                periods[n][w].append(backtest(mean, data.window(getattr(fold, w), fill), cost).periods.as_dict())
    return {n: {w: pooled.pooled(periods[n][w], cost, ppy) for w in ("val", "test")} for n in sizes}


def slim(results: dict) -> dict:
    """What a vote reads of results.json's dict (a GPU sweep's is ~12 MB: the periods of every fold)."""
    keep = ("trial_id", "status", "folds_done", "config")
    return {
        **{k: results[k] for k in ("folds", "storage", "periods_per_year", "data", "base_config")},
        "best": {"baselines": results["best"].get("baselines") or {}},
        "trials": [{**{k: t[k] for k in keep}, "val": {"sharpe": t["val"]["sharpe"]}} for t in results["trials"]],
    }


def on_worker(workers):
    """`ensemble` for fxray.track.results.write_results: the vote, run by FoldWorker 0 (torch
    and the data are loaded there, on the sweep's device; the driver imports no torch), on
    the CPU with every worker's threads (its forwards of every member over every val and test
    window are most of a CPU sweep's end)."""
    import ray

    threads = workers.plan.n_workers * workers.plan.torch_threads
    return lambda results: ray.get(workers.handles[0].vote.remote(slim(results), threads), timeout=600)


def vote_of_full_trials(results: dict, data) -> dict:
    """What results.json's "ensemble" holds: the vote of all full trials, pooled on val and
    test, its shares of the oracle and the ridge rule on the chosen trial's test windows (the
    same windows: every member ran every fold); or {"skipped": why}. `data`: a DeviceData of
    the sweep's market (a FoldWorker's)."""
    full = full_trials(results)
    out = {"combine": "vote", "members": [t["trial_id"] for t in full], "n_members": len(full)}
    if len(full) < MIN_MEMBERS:
        return {**out, "skipped": f"{len(full)} trial(s) ran every fold; a vote needs {MIN_MEMBERS}"}
    missing = missing_checkpoints(results, full)
    if missing:
        return {**out, "skipped": f"{len(missing)} checkpoint(s) missing, e.g. {missing[0]}"}
    from fxray.eval import pooled

    stats = combine_trials(results, data, [len(full)])[len(full)]
    refs = results["best"].get("baselines") or {}
    stats["test"]["oracle_share"] = pooled.oracle_share(stats["test"], refs.get("oracle"))
    stats["test"]["ridge_share"] = pooled.oracle_share(stats["test"], refs.get("ridge"))
    return {**out, **stats}
