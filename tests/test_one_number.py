"""One number, one value: a fold's test Sharpe as the sweep records it (the FoldRecord its trial
reports, and the `test_sharpe` that fxray.track.runs.Tracker.log_fold sends MLflow at step = fold)
and as `fxray backtest --window test` of its `fxray export --model last` bundle computes it are
equal, bit for bit on the CPU, with `dqn.inputs: ridge` (the default experiment's): the trainer's
Q-values are those of the plain network the checkpoint stores, not of its front end and first
layer as two maps (float32 rounding apart, ~1e-7 of Q, which can flip a near tie between two
actions). `--model ensemble` differs by design, and the backtest says so. (MLflow's store round
trip of that value: tests/test_compare.py, on a real sweep; a store here would cost ~9 s.)"""

import json

import pytest
import torch

from fxray import backtest, export
from fxray.data import cache
from fxray.data.folds import FoldSpec, make_folds
from fxray.data.synth import SynthSpec, to_cache
from fxray.policy.bundle import load
from fxray.policy.frozen import q_values
from fxray.rl.config import DQNConfig
from fxray.rl.device import DeviceData
from fxray.rl.trainer import Trainer
from fxray.track.records import FoldRecord

# experiments/smoke.yaml's market and folds, a smaller network, the default experiment's inputs
CFG = DQNConfig(
    hidden=16, num_envs=16, batch_size=64, buffer_steps=32, episode_len=32, epochs=2, steps_per_epoch=10
).replace(inputs="ridge")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, one_torch_thread_module):
    """Two folds of one trial as a sweep trains them (Trainer.run_fold: what every sweep worker
    calls), the records its trial reports; the trainer kept for its Q-values of the last fold."""
    d = tmp_path_factory.mktemp("one_number")
    path = d / "synth.fxcache"
    to_cache(SynthSpec(n_bars=20_000, seed=0), path)
    market = cache.open(path)
    data = DeviceData(market, "cpu")
    folds = make_folds(market.ts, FoldSpec("4d", "2d", "2d", max_folds=2))
    trainer = Trainer(data, [CFG])
    records = []
    for fold in folds:
        (result,) = trainer.run_fold(fold, [0], checkpoint_dirs=[d / "ckpt"])
        record = FoldRecord.from_flat(FoldRecord.from_result(result.as_dict()).flat())  # as Tune carries it
        records.append(record)
    return {"dir": d, "cache": path, "data": data, "folds": folds, "trainer": trainer, "records": records}


@pytest.fixture(scope="module")
def one_torch_thread_module():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run_backtest(t, model: str, capsys) -> tuple[dict, str]:
    d = t["dir"]
    out = d / model
    assert export.main([str(d / "ckpt"), "--data", str(t["cache"]), "--out", str(out), "--model", model]) == 0
    capsys.readouterr()
    args = ["--policy", str(out), "--data", str(t["cache"]), "--window", "test", "--device", "cpu"]
    assert backtest.main([*args, "--json", str(d / f"{model}.json")]) == 0
    return json.loads((d / f"{model}.json").read_text()), capsys.readouterr().out


def test_the_sweeps_fold_test_sharpe_the_backtest_and_mlflow_agree(trained, capsys):
    """The last fold: the trial's record, the backtest of its `--model last` export and the metric
    MLflow gets at that step are one value, and every window metric is equal (==, not approx)."""
    t, fold, record = trained, trained["folds"][-1], trained["records"][-1]
    bt, screen = run_backtest(t, "last", capsys)
    bundle = load(t["dir"] / "last")
    # the cause: the trainer scored the fold with the very Q-values the bundle computes
    torch.testing.assert_close(
        q_values(bundle, t["data"], fold.test), t["trainer"].q_all(fold.test, [0])[0], rtol=0, atol=0
    )
    got = bt["policy"]["metrics"]
    assert got["n_trades"] > 0 and got["sharpe"] != 0.0  # a policy that trades: the comparison means something
    assert got == {k: (int(v) if k in ("n_trades", "n_days") else v) for k, v in record.test.items()}
    assert record.fold == fold.k and record.mlflow_metrics()["test_sharpe"] == got["sharpe"]
    assert bt["as_trained"]["equal"] and bt["as_trained"]["fold"] == fold.k
    assert f"{got['sharpe']:+.2f}" in screen and "equal to training's" in screen


def test_an_ensemble_differs_by_design_and_says_so(trained, capsys):
    bt, screen = run_backtest(trained, "ensemble", capsys)
    assert bt["as_trained"]["why"].startswith("differs by design: --model ensemble is the mean Q of folds 0, 1")
    assert "differs by design" in screen
