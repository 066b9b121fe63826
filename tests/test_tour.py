"""The README's everyday commands, in order, as a new user types them: on a fresh HOME, in an
empty folder, at smoke size, each through `fxray.cli.main` (the `fxray` command, in this
process: no interpreter start per command) with --json where it has one.

    fxray data build --bars <CME Euro FX CSV> --instrument EURUSD --out real.fxcache   # real bars
    fxray data synth --bars 20000 --seed 0 --out synth.fxcache
    fxray data info real.fxcache --experiment experiments/smoke.yaml
    fxray tune --experiment experiments/smoke.yaml --data real.fxcache --trials 2   # your data
    fxray compare
    fxray train --from-run RUN_ID
    fxray train --experiment experiments/smoke.yaml --epochs 1 --checkpoint-dir ckpt  # the embedded market
    fxray export RUN_ID --out policy/          (and --model ensemble; and ckpt/seed0 --data synth.fxcache)
    fxray backtest --policy policy/ --data real.fxcache --window test   (and the whole file)
    fxray backtest --policy policy/ --data synth.fxcache                 # a bars policy, another market
    fxray backtest --policy policy_synth/ --data ...                     # an order-flow policy: refused on bars
    fxray live --policy policy/ --bars -       (the CSV's bars on stdin)

Each step checks its exit status, the key numbers of its JSON, and where two commands speak of
one thing, that they agree: the folds `data info` shows are the ones the sweep ran, `compare` and
MLflow report the sweep's own numbers, the market `data synth` writes is the one the embedded
market is (made in the fresh ~/.cache), the export's fold is the sweep's last and `backtest
--window test` is that fold's test window with the sweep's test Sharpe, bit for bit, and `live`
streams the positions the backtest computes on the same bars. The steps are one module's tests
in order, sharing one state (one sweep): a failing step fails alone, the ones that need its
output skip.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import shlex
import time
from pathlib import Path

import pytest
from conftest import SHARED_DATA

from fxray import cli
from fxray.data.features import MAX_LOOKBACK

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "experiments/smoke.yaml"
BARS = SHARED_DATA / "bars/6EH4.XCME_1min_bars_20240101_20240131.csv.gz"  # a plain CSV: CME Euro FX, Jan 2024
LIVE_BARS = 1500  # of BARS, streamed to `fxray live`


@pytest.fixture(scope="module")
def tour(tmp_path_factory):
    """An empty folder as the working directory, a fresh HOME (no ~/.cache/fxray), no MLflow or
    Ray address from the environment: what a new user has. The steps' outputs, by step."""
    if not BARS.exists():
        pytest.skip(f"shared data not found at {BARS}")
    d = tmp_path_factory.mktemp("tour")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(d / "home"))
        mp.setenv("XDG_CACHE_HOME", str(d / "home/.cache"))
        for name in ("FXRAY_CACHE_DIR", "MLFLOW_TRACKING_URI", "RAY_ADDRESS"):
            mp.delenv(name, raising=False)
        (d / "home").mkdir()
        mp.chdir(d)
        state = {"dir": d, "times": {}}
        yield state
        print("tour step times (s): " + ", ".join(f"{k} {v:.1f}" for k, v in state["times"].items()))
    shutdown_ray()


def shutdown_ray() -> None:
    """The sweep's local Ray ends with it, as it does when `fxray tune` exits (its reaper,
    fxray.sweep.reaper, waits for this process's end: it would take this process for Ray's)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


def fxray(tour, capsys, line: str, step: str, stdin: str | None = None) -> tuple[dict | None, str]:
    """`fxray LINE` in the tour's folder: exit 0 asserted; (its --json, its stdout + stderr)."""
    argv = shlex.split(line)
    t0 = time.perf_counter()
    if stdin is not None:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr("sys.stdin", io.StringIO(stdin))
            code = cli.main(argv)
    else:
        code = cli.main(argv)
    tour["times"][step] = time.perf_counter() - t0
    out = capsys.readouterr()
    assert code == 0, f"fxray {line}: exit {code}\n{out.err[-3000:]}"
    js = argv[argv.index("--json") + 1] if "--json" in argv else None
    result = json.loads(Path(js).read_text()) if js else None
    tour[step] = result
    return result, out.out + out.err


def need(tour, *steps: str) -> list:
    missing = [s for s in steps if s not in tour]
    if missing:
        pytest.skip(f"needs the step(s) {', '.join(missing)}, which failed above")
    return [tour[s] for s in steps]


# --- data ---------------------------------------------------------------------------------------


def test_data_build_synth_info(tour, capsys):
    build, text = fxray(
        tour, capsys, f"data build --bars {BARS} --instrument EURUSD --out real.fxcache --json build.json", "build"
    )
    assert build["n_bars"] == 29_996 - MAX_LOOKBACK and build["instrument"] == "EURUSD"  # rows less the warm-up
    assert build["book_coverage"] == 0.0 and "wrote real.fxcache: 29,876 bars of EURUSD" in text
    synth, _ = fxray(tour, capsys, "data synth --bars 20000 --seed 0 --out synth.fxcache --json synth.json", "synth")
    assert synth["n_bars"] == 20_000 and synth["seed"] == 0
    info, text = fxray(tour, capsys, f"data info real.fxcache --experiment {SMOKE} --json info.json", "info")
    assert info["rows"] == build["n_bars"] and info["content_hash"] == build["content_hash"]
    assert info["instrument"] == "EURUSD" and info["folds_error"] is None and len(info["folds"]) == 2  # max_folds
    assert "folds (4d train / 2d val / 2d test): 2" in text


# --- a sweep on the real bars, judged -----------------------------------------------------------


def test_tune_then_compare(tour, capsys):
    build, info = need(tour, "build", "info")
    try:
        results, text = fxray(
            tour, capsys, f"tune --experiment {SMOKE} --data real.fxcache --trials 2 --json tune.json", "tune"
        )
    finally:
        shutdown_ray()
    d = tour["dir"]
    assert results["data"]["content_hash"] == build["content_hash"]
    assert [{k: f[k] for k in ("k", "train", "val", "test")} for f in results["folds"]] == info["folds"]
    assert results["n_trials"] == 2 and (d / "mlflow.db").is_file() and (d / "runs/smoke/results.json").is_file()
    best = results["best"]
    assert best["folds_done"] == 2 and math.isfinite(best["test"]["sharpe"]) and best["test"]["sharpe_se"] > 0
    assert "ETA" in text and "fold 2/2: score" in text  # the progress lines
    assert "verdict:" in text and "fxray compare smoke" in text  # the last screen
    cmp, _ = fxray(tour, capsys, "compare --json compare.json", "compare")
    (s,) = cmp["experiments"]
    chosen = next(t for t in results["trials"] if t["trial_id"] == best["trial_id"])
    assert s["experiment"] == "smoke" and s["n_trials"] == 2 and s["n_folds"] == 2
    assert s["best"]["trial_id"] == best["trial_id"] and s["best"]["folds_done"] == 2
    # MLflow's numbers are the sweep's: the pooled test Sharpe and each fold's, as results.json has them
    assert s["best"]["test"]["sharpe"] == pytest.approx(best["test"]["sharpe"], rel=1e-12)
    # (a window's Sharpe that is undefined, no trade in it, is not logged to MLflow: None there, 0.0 in results.json)
    logged = [0.0 if f["test_sharpe"] is None else f["test_sharpe"] for f in s["best"]["folds"]]
    assert logged == [f["test"]["sharpe"] for f in chosen["folds"]]
    assert all((d / "compare" / p).stat().st_size > 0 for p in ("sharpe_by_fold.png", "equity.png", "verdict.png"))
    tour["run_id"], tour["chosen"] = s["best"]["run_id"], chosen


# --- one config again, without Ray --------------------------------------------------------------


def test_train_from_run_and_on_the_embedded_market(tour, capsys):
    (chosen,) = need(tour, "chosen")
    again, text = fxray(tour, capsys, f"train --from-run {tour['run_id']} --json from_run.json", "from_run")
    check = again["from_run"]
    assert check["reproduced"] and check["max_abs_diff"] == 0.0 and all(f["bitwise"] for f in check["folds"])
    # MLflow's logged fold test Sharpe (what --from-run compares with) is the sweep's
    assert [f["logged_test_sharpe"] for f in check["folds"]] == [f["test"]["sharpe"] for f in chosen["folds"]]
    # how long it will take: the sweep's time for these folds up front, then an ETA after each fold
    assert "; the sweep trained them in 0m" in text and "fxray.train: fold 0 ok (1/2 folds, 0m" in text
    assert "s; ETA ~0m" in text
    # a logged Sharpe that training does not give again (here: a later value logged to a copy of
    # the store) is reported, fold by fold, and the exit status is 1
    import shutil

    from mlflow.tracking import MlflowClient

    shutil.copy(tour["dir"] / "mlflow.db", tour["dir"] / "altered.db")
    uri, last = f"sqlite:///{tour['dir'] / 'altered.db'}", check["folds"][-1]
    MlflowClient(uri).log_metric(tour["run_id"], "test_sharpe", last["logged_test_sharpe"] + 0.5, step=last["fold"])
    argv = ["train", "--from-run", tour["run_id"], "--tracking-uri", uri, "--json", "altered.json"]
    code, text = cli.main(argv), capsys.readouterr().out
    check = json.loads(Path("altered.json").read_text())["from_run"]
    assert code == 1 and not check["reproduced"] and check["max_abs_diff"] == pytest.approx(0.5)
    assert [f["bitwise"] for f in check["folds"]] == [True] * (len(check["folds"]) - 1) + [False]
    assert "2 fold(s) reproduced NOT (max |diff| 0.5)" in text
    (synth,) = need(tour, "synth")
    train, text = fxray(
        tour, capsys, f"train --experiment {SMOKE} --epochs 1 --checkpoint-dir ckpt --json train.json", "train"
    )
    made = list((tour["dir"] / "home/.cache/fxray").glob("synth-*.fxcache"))  # made on first use, in ~/.cache
    assert len(made) == 1 and train["data"] == str(made[0]) and "generating the default synthetic market" in text
    # `data synth --bars 20000 --seed 0` is smoke.yaml's market: one spec, one market, one hash
    assert train["content_hash"] == synth["content_hash"]
    assert len(train["folds"]) == 2 and all(r["epochs_run"] == 1 for r in train["folds"])
    assert math.isfinite(train["pooled"]["test"]["sharpe"])


# --- the policy: exported, backtested, live -----------------------------------------------------


def test_export(tour, capsys):
    results, _ = need(tour, "tune", "chosen")
    run_id, last = tour["run_id"], results["folds"][-1]
    manifest, text = fxray(tour, capsys, f"export {run_id} --out policy/ --json export.json", "export")
    (member,) = manifest["members"]  # --model last: the last fold's network
    assert manifest["model"]["choice"] == "last" and member["fold"] == {k: last[k] for k in member["fold"]}
    assert manifest["data"]["content_hash"] == results["data"]["content_hash"]
    assert member["test"]["sharpe"] == tour["chosen"]["folds"][-1]["test"]["sharpe"]
    assert manifest["inputs"]["ofi_read"] == [] and "reads bars alone" in text  # trained on bars: runs on any
    every, text = fxray(
        tour, capsys, f"export {run_id} --out policy_all/ --model ensemble --json ensemble.json", "export_ensemble"
    )
    assert [m["fold"]["k"] for m in every["members"]] == [f["k"] for f in results["folds"]]
    # an ensemble's export says where it is, member by member
    assert "fxray.export: member 1/2 written and checked (0m" in text and "s; ETA ~0m" in text


def test_backtest_on_the_real_bars(tour, capsys):
    manifest, build = need(tour, "export", "build")
    bt, _ = fxray(
        tour, capsys, "backtest --policy policy/ --data real.fxcache --window test --json bt_test.json", "bt_test"
    )
    (member,) = manifest["members"]
    assert bt["data"]["same_as_training"] and bt["data"]["content_hash"] == build["content_hash"]
    assert [bt["window"]["start"], bt["window"]["end"]] == member["fold"]["test"]
    # one number, one value: the frozen policy's test Sharpe is the sweep's (and MLflow's) last fold's
    sweep_sharpe = tour["chosen"]["folds"][-1]["test"]["sharpe"]
    assert bt["policy"]["metrics"]["sharpe"] == sweep_sharpe
    if "from_run" in tour:
        assert tour["from_run"]["from_run"]["folds"][-1]["logged_test_sharpe"] == sweep_sharpe
    bt, _ = fxray(
        tour,
        capsys,
        "backtest --policy policy/ --data real.fxcache --json bt_all.json --positions bt_all.csv",
        "bt_all",
    )
    assert (bt["window"]["start"], bt["window"]["end"]) == (0, build["n_bars"])
    assert math.isfinite(bt["policy"]["pooled"]["sharpe"]) and bt["policy"]["pooled"]["n_periods"] > 300


def test_backtest_on_another_market(tour, capsys):
    """The bars policy on the synthetic market (its order flow unread); the embedded market's
    policy, which reads order flow, on the real bars: refused, saying which inputs and what to do."""
    _, synth, build, train = need(tour, "export", "synth", "build", "train")
    bt, text = fxray(tour, capsys, "backtest --policy policy/ --data synth.fxcache --json bt_synth.json", "bt_synth")
    assert not bt["data"]["same_as_training"] and bt["data"]["content_hash"] == synth["content_hash"]
    assert (bt["window"]["start"], bt["window"]["end"]) == (0, synth["n_bars"]) and bt["ofi_read"] == []
    assert "note: this policy does not read the data's order flow" in text
    manifest, _ = fxray(
        tour,
        capsys,
        "export ckpt/seed0 --data synth.fxcache --out policy_synth/ --json export_synth.json",
        "export_ckpt",
    )
    assert manifest["data"]["content_hash"] == synth["content_hash"] and manifest["inputs"]["ofi_read"]
    bt, _ = fxray(
        tour,
        capsys,
        "backtest --policy policy_synth/ --data synth.fxcache --window test --json bt_ckpt.json",
        "bt_ckpt",
    )
    assert bt["policy"]["metrics"]["sharpe"] == train["folds"][-1]["test"]["sharpe"]  # train -> export -> backtest
    argv = shlex.split("backtest --policy policy_synth/ --data real.fxcache --json refused.json")
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and not Path("refused.json").exists()
    read = ", ".join(manifest["inputs"]["ofi_read"])
    assert f"real.fxcache: lacks the order flow this policy reads: {read} " in err[0]
    assert "train a policy on this data (fxray tune --experiment EXPERIMENT.yaml --data real.fxcache)" in err[0]


def test_live_on_a_csv_of_real_bars(tour, capsys):
    need(tour, "bt_all")
    with gzip.open(BARS, "rt") as f:
        csv = "".join(f.readline() for _ in range(LIVE_BARS + 1))  # the header and LIVE_BARS bars
    summary, text = fxray(tour, capsys, "live --policy policy/ --bars - --json live.json", "live", stdin=csv)
    assert summary["bars"] == LIVE_BARS and summary["warmup_bars"] == MAX_LOOKBACK
    assert summary["positions"] == LIVE_BARS - MAX_LOOKBACK
    lines = text.splitlines()
    start = lines.index("ts,position")
    streamed = [line.split(",") for line in lines[start + 1 : start + 1 + LIVE_BARS]]
    assert [p for _, p in streamed[:MAX_LOOKBACK]] == ["warmup"] * MAX_LOOKBACK
    # bar MAX_LOOKBACK + i is the cache's row i: the same bar time and the backtest's position there
    backtested = [line.split(",") for line in Path("bt_all.csv").read_text().splitlines()[1:]]
    from fxray.live import parse_ts

    n = LIVE_BARS - MAX_LOOKBACK - 1  # the backtest has no position at its last bar
    assert [[str(parse_ts(t, None)), p] for t, p in streamed[MAX_LOOKBACK:][:n]] == backtested[:n]
