"""The data and train CLIs end to end, in subprocesses: results, JSON, and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fxray.data import cache
from fxray.eval import pooled

ROOT = Path(__file__).resolve().parents[1]


def run(*args, cwd=None, env=None):
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=cwd or ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=600,
    )


def one_line_error(proc, *needles):
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])


# --- fxray.data ---------------------------------------------------------------------


def test_synth_then_info_with_folds(tmp_path):
    out = tmp_path / "s.fxcache"
    p = run(
        "fxray.data_cmd",
        "synth",
        "--bars",
        "30_000",
        "--seed",
        "3",
        "--out",
        str(out),
        "--json",
        str(tmp_path / "s.json"),
    )
    assert p.returncode == 0, p.stderr
    market = cache.open(out)
    assert market.n_bars == 30_000 and market.meta["synth"]["seed"] == 3
    assert json.loads((tmp_path / "s.json").read_text())["content_hash"] == market.content_hash
    exp = tmp_path / "e.yaml"
    exp.write_text("name: t\nfolds: {train: 10d, val: 3d, test: 3d}\n")
    p = run("fxray.data_cmd", "info", str(out), "--experiment", str(exp), "--json", str(tmp_path / "i.json"))
    assert p.returncode == 0, p.stderr
    info = json.loads((tmp_path / "i.json").read_text())
    assert info["rows"] == 30_000 and len(info["columns"]) == 50 and info["folds"]
    assert "fold 0: train" in p.stdout and "adx_14" in p.stdout


def test_build_from_histdata_bars(tmp_path, shared_data):
    out = tmp_path / "eu.fxcache"
    p = run(
        "fxray.data_cmd",
        "build",
        "--bars",
        str(shared_data / "bars/eurusd_m1_2017q1"),
        "--format",
        "histdata",
        "--instrument",
        "EURUSD",
        "--out",
        str(out),
    )
    assert p.returncode == 0, p.stderr
    market = cache.open(out)
    assert market.meta["instrument"] == "EURUSD" and market.n_bars > 90_000
    # HistData is EST (UTC-5) stamped at bar open: the first close is 2017-01-02 ~ 00:00 UTC + warm-up
    assert str(market.ts[0].astype("datetime64[ns]")).startswith("2017-01-02")


def test_build_bars_and_order_flow_from_an_mbo_book(tmp_path, shared_data):
    pytest.importorskip("numba")
    out = tmp_path / "es.fxcache"
    book = shared_data / "book/databento/esh4-glbx-mdp3-20231225.mbo.dbn.zst"
    p = run(
        "fxray.data_cmd",
        "build",
        "--book",
        str(book),
        "--bar",
        "10s",
        "--out",
        str(out),
        "--json",
        str(tmp_path / "b.json"),
    )
    assert p.returncode == 0, p.stderr
    market = cache.open(out)
    assert market.ofi_names[0] == "ofi_l1" and (market.ofi != 0).any(axis=1).mean() > 0.9
    assert json.loads((tmp_path / "b.json").read_text())["book_coverage"] > 0.9


@pytest.mark.parametrize(
    "args, needles",
    [
        (["build", "--bars", "/nonexistent/bars.csv"], ["/nonexistent/bars.csv"]),
        (["build"], ["--bars"]),
        (["info", "/nonexistent.fxcache"], ["/nonexistent.fxcache", "no such file"]),
    ],
)
def test_data_cli_bad_input_is_one_line_and_writes_nothing(tmp_path, args, needles):
    out = tmp_path / "x.fxcache"
    if args[0] == "build":
        args = args + ["--out", str(out)]
    one_line_error(run("fxray.data_cmd", *args), *needles)
    assert list(tmp_path.iterdir()) == []


def test_info_on_a_file_that_is_not_an_fxcache(tmp_path):
    bad = tmp_path / "bad.fxcache"
    bad.write_text("timestamp,open\n1,2\n")
    one_line_error(run("fxray.data_cmd", "info", str(bad)), str(bad), "not an Arrow IPC file")


def test_too_few_bars_is_one_line(tmp_path):
    csv = tmp_path / "few.csv"
    csv.write_text(
        "timestamp_utc,open,high,low,close,volume\n"
        + "".join(f"2024-01-01T00:{m:02d}:00,1,1.1,0.9,1,5\n" for m in range(50))
    )
    one_line_error(run("fxray.data_cmd", "build", "--bars", str(csv), "--out", str(tmp_path / "o.fxcache")), "50 bars")
    assert not (tmp_path / "o.fxcache").exists()


# --- a stdout closed by its reader (`fxray backtest ... | head -1`) ----------------------


@pytest.mark.parametrize("buffering", [1, -1], ids=["line-buffered", "block-buffered"])
def test_a_stdout_closed_by_its_reader_ends_quietly(
    buffering, synth_cache, short_folds_experiment, monkeypatch, capsys
):
    """Any command (here `fxray data info` and `fxray train`, and `python -m fxray.data_cmd`) and
    run_command (backtest, live, export) end with exit status 1 and nothing on stderr, not a
    BrokenPipeError traceback (or 'error: [Errno 32] Broken pipe'). The pipe is real, its read
    end closed as `head` leaves it:
    line-buffered, the command's first print raises; block-buffered, the flush of what is buffered."""
    from argparse import Namespace

    from fxray import data_cmd
    from fxray.cli import main, run_command

    commands = {
        "fxray data info": lambda: main(["data", "info", str(synth_cache)]),
        "python -m fxray.data_cmd info": lambda: data_cmd.main(["info", str(synth_cache)]),
        "fxray train": lambda: main(
            ["train", "--data", str(synth_cache), "--experiment", str(short_folds_experiment), "--device", "cpu"]
            + ["--folds", "0", "--epochs", "1", "--set", "select_from=0", "--set", "steps_per_epoch=5"]
        ),
        "run_command": lambda: run_command(lambda args: print("ts,position\n" * 5000) or {}, Namespace(json=None)),
    }
    for name, command in commands.items():
        read_end, write_end = os.pipe()
        os.close(read_end)
        with open(write_end, "w", buffering=buffering) as stdout:
            monkeypatch.setattr(sys, "stdout", stdout)
            assert command() == 1, name
            monkeypatch.undo()
    assert capsys.readouterr().err == ""


def test_fxray_into_head_has_no_traceback(synth_cache):
    """The real command into a real `| head -c1`, once head has read its byte and gone (given first,
    so that no race decides whether fxray writes after it): `fxray data info`, its output
    block-buffered (a pipe's default), ends with exit 1 and an empty stderr."""
    head = subprocess.Popen(["head", "-c1"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    head.stdin.write(b"x")
    head.stdin.flush()
    assert head.wait(timeout=10) == 0
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    cmd = [sys.executable, "-m", "fxray.cli", "data", "info", str(synth_cache)]
    proc = subprocess.run(cmd, cwd=ROOT, stdout=head.stdin, stderr=subprocess.PIPE, text=True, env=env, timeout=120)
    head.stdin.close()
    assert (proc.returncode, proc.stderr) == (1, "")


# --- fxray.train --------------------------------------------------------------------


def test_train_cli_writes_per_fold_json(tmp_path, synth_cache, short_folds_experiment):
    j = tmp_path / "r.json"
    p = run(
        "fxray.train",
        "--experiment",
        str(short_folds_experiment),
        "--data",
        str(synth_cache),
        "--device",
        "cpu",
        "--epochs",
        "2",
        "--folds",
        "1",
        "--set",
        "steps_per_epoch=30",
        "--set",
        "hidden=32",
        "--set",  # a policy that trades: with the profile's demonstrations 60 steps leave it flat,
        "demo=0",  # and a flat policy's share of the oracle has no error to check
        "--set",  # and 60 steps lose on val, where the profile (keep: won) would keep nothing
        "keep=best",
        "--json",
        str(j),
        "--checkpoint-dir",
        str(tmp_path / "ck"),
    )
    assert p.returncode == 0, p.stderr
    r = json.loads(j.read_text())
    assert [f["fold"]["k"] for f in r["folds"]] == [1]
    assert r["config"]["hidden"] == 32 and r["config"]["epochs"] == 2
    for f in r["folds"]:
        assert set(f["test"]) >= {"sharpe", "sortino", "max_drawdown", "turnover", "n_trades", "hit_rate"}
        assert "buy_and_hold" in f["baselines"] and f["timings"]["total_s"] > 0
        assert Path(f["checkpoint"]).exists()
    assert "fold 1 epoch 1: loss" in p.stdout and "test SR" in p.stdout
    # the numbers to judge by: val and test windows pooled, with their error, the references beside
    keys = {"sharpe", "sharpe_se", "psr", "n_periods", "n_days", "n_trades", "turnover", "break_even_cost"}
    for window in ("val", "test"):
        assert keys <= set(r["pooled"][window]), window
    test = r["pooled"]["test"]
    assert test["n_periods"] == len(r["folds"][0]["test_periods"]["net"]) > 0
    assert {"oracle", "ridge", "buy_and_hold"} <= set(r["pooled"]["baselines"])  # a planted market: it has one
    assert test["oracle_share"] == pytest.approx(test["sharpe"] / r["pooled"]["baselines"]["oracle"]["sharpe"])
    oracle_windows = [f["baseline_periods"]["oracle"]["test"] for f in r["folds"]]
    se = pooled.oracle_share_se([f["test_periods"] for f in r["folds"]], oracle_windows)
    assert test["oracle_share_se"] == pytest.approx(se) and se > 0
    assert "pooled over" in p.stdout and "share of the oracle" in p.stdout and "break-even cost" in p.stdout


@pytest.mark.parametrize(
    "args, needles",
    [
        (["--folds", "7"], ["--folds", "7"]),
        (["--set", "widht=3"], ["widht"]),
        (["--set", "gamma=2"], ["gamma"]),
        (["--epochs", "1"], ["dqn.select_from", "select_from=0"]),  # the experiment keeps epochs from 1 on
        (["--device", "tpu"], ["--device"]),
        (["--data", "/nonexistent.fxcache"], ["/nonexistent.fxcache"]),
    ],
)
def test_train_cli_bad_input_is_one_line(tmp_path, synth_cache, short_folds_experiment, args, needles):
    base = ["--experiment", str(short_folds_experiment)]
    base += ["--data", str(synth_cache)] if "--data" not in args else []
    one_line_error(
        run("fxray.train", *base, "--device", "cpu", *args, "--json", str(tmp_path / "r.json"))
        if "--device" not in args
        else run("fxray.train", *base, *args),
        *needles,
    )
    assert not (tmp_path / "r.json").exists()


def test_the_command_line_and_the_live_process_start_without_pyarrow_or_torch():
    """`fxray` itself (every command goes through fxray.cli) and `fxray live` import neither:
    the one atomic write they share (fxray.data.atomic) is standard library only."""
    code = "import sys, fxray.cli, fxray.live\nprint(sorted({'pyarrow', 'torch'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
