"""The bad-input suite: every CLI, every file it reads, every flag, each bad input refused.

Each case runs a command in-process (`main(argv)` of the module fxray/cli.py's COMMANDS
names) in a fresh directory holding the good inputs (module fixture `golden`: an
experiment, an fxcache, bar files, checkpoints, a policy bundle, an interrupted run
directory) plus the case's bad one, and asserts what docs/reliability.md promises:

    exit status != 0, at most 3 lines on stderr, no traceback, nothing half-written
    (the directory holds exactly what it held before: no new file, none changed).

Cases are generated: flags x bad values, files x corruptions. A `tune` case that got past
validation would start Ray: `start` is replaced by a tripwire that fails the case instead
(every bad input must be refused before anything is started).
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from test_tune import TINY

from fxray.cli import COMMANDS

pytestmark = pytest.mark.filterwarnings("ignore")

MAX_STDERR_LINES = 3


# --- the good inputs, made once ------------------------------------------------------------


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    """A directory of good inputs: what every case starts from (read-only by convention)."""
    import optuna  # noqa: F401  (imported once here, not inside a timed case)

    from fxray import export, train
    from fxray.data import cache
    from fxray.data.synth import SynthSpec, to_cache
    from fxray.rl import experiment as expmod
    from fxray.sweep.driver import validate
    from fxray.sweep.rounds import load_study
    from fxray.sweep.rundir import make_fold_dicts, prepare_storage
    from fxray.tune import build_parser

    g = tmp_path_factory.mktemp("golden")
    cwd = os.getcwd()
    os.chdir(g)
    try:
        (g / "tiny.yaml").write_text(TINY.format(trials=2, steps=10, grace=2, folds=2, bars=20000))
        to_cache(SynthSpec(n_bars=20000, seed=0), g / "m.fxcache")
        market = cache.open(g / "m.fxcache")
        write_bars(g, market)
        assert train.main(["--data", "m.fxcache", "--experiment", "tiny.yaml", "--checkpoint-dir", "ck",
                           "--set", "epochs=1"]) == 0  # fmt: skip
        assert export.main(["ck/seed0", "--data", "m.fxcache", "--out", "bundle"]) == 0
        write_bars_policy(g, market)
        # an interrupted sweep's run directory, as the driver writes it (no Ray needed for that)
        exp = expmod.load(g / "tiny.yaml", "cpu")
        folds = make_fold_dicts("tiny.yaml", exp, market)
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{g / 'mlflow.db'}"
        plan = validate(
            build_parser().parse_args(["--experiment", "tiny.yaml", "--data", "m.fxcache", "--storage", "runs/t"])
        )
        prepare_storage(plan, exp, "cpu", folds)
        load_study(g / "runs/t")
        rec = {"trial_id": "0000", "fold": 0, "status": "ok", "score": 0.1, "round": "tune", "config": {"lr": 1e-3}}
        (g / "runs/t/folds.jsonl").write_text(json.dumps(rec) + "\n")
        (g / "runs/t/events.jsonl").write_text("")
        (g / "results.json").write_text(json.dumps({"trials": [], "profile": "cpu", "seed": 0}))
    finally:
        os.chdir(cwd)
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    return g


def write_bars(g: Path, market) -> None:
    """bars.csv and bars.parquet: 3000 one-minute bars of the synthetic market's closes."""
    import pandas as pd

    n = 3000
    close = np.exp(np.cumsum(np.random.default_rng(0).normal(0, 1e-4, n))) * 1.1
    ts = pd.date_range("2024-01-02", periods=n, freq="1min")
    df = pd.DataFrame({"timestamp": ts, "open": close, "high": close * 1.0001, "low": close * 0.9999, "close": close})
    df.to_csv(g / "bars.csv", index=False)
    df.to_parquet(g / "bars.parquet")


def write_bars_policy(g: Path, market) -> None:
    """bars-bundle: a policy trained on the market's bars without their order flow (ofi zeros, as
    a cache built from bars), so it reads none and `fxray live` takes a plain OHLCV CSV: a bad CSV
    is refused for its own fault, not at its header for lacking the synthetic order flow that
    `bundle` reads. One fold, one epoch."""
    from fxray import export, train
    from fxray.data import cache
    from fxray.data.schema import OFI_NAMES
    from fxray.policy.bundle import load

    cache.write(g / "bars.fxcache", market.ts, market.features, None, market.targets,
                feature_names=list(market.feature_names), ofi_names=list(OFI_NAMES), instrument="SYNTH",
                bar="1min", source="bars of m.fxcache")  # fmt: skip
    assert train.main(["--data", "bars.fxcache", "--experiment", "tiny.yaml", "--checkpoint-dir", "ck-bars",
                       "--set", "epochs=1", "--folds", "1"]) == 0  # fmt: skip
    assert export.main(["ck-bars/seed0", "--data", "bars.fxcache", "--out", "bars-bundle"]) == 0
    assert load(g / "bars-bundle").ofi_read == []


# --- one case ----------------------------------------------------------------------------------


@dataclass
class Case:
    id: str
    cmd: str  # a name of fxray.cli.COMMANDS
    argv: list[str]
    setup: object = None  # setup(ws: Path) makes the bad input
    needle: str | None = None  # a text the stderr line must hold
    keep: list[str] = field(default_factory=list)  # files the command may leave (none by default)


class ReachedStart(BaseException):
    """A tune case got past validation (the sweep would start Ray)."""


def snapshot(root: Path) -> dict:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            out[str(p.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def workspace(golden: Path, ws: Path) -> None:
    """Links to the big good inputs, copies of what a command might be tempted to touch."""
    for name in ("m.fxcache", "ck", "bars.csv", "bars.parquet", "results.json", "bars-bundle"):
        (ws / name).symlink_to(golden / name)
    for name in ("tiny.yaml",):
        shutil.copy(golden / name, ws / name)
    shutil.copytree(golden / "bundle", ws / "bundle")
    shutil.copytree(golden / "runs", ws / "runs")


def run_case(case: Case, golden: Path, ws: Path, capsys, monkeypatch) -> None:
    from fxray.sweep import driver

    workspace(golden, ws)
    monkeypatch.chdir(ws)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{golden / 'mlflow.db'}")
    monkeypatch.setenv("FXRAY_CACHE_DIR", str(ws / "cache"))

    def tripwire(*a, **k):
        raise ReachedStart

    monkeypatch.setattr(driver, "start", tripwire)
    if case.setup:
        case.setup(ws)
    before = snapshot(ws)
    golden_before = snapshot(golden)
    capsys.readouterr()
    module = importlib.import_module(COMMANDS[case.cmd][0])
    try:
        code = module.main(list(case.argv))
    except SystemExit as e:
        code = e.code
    except ReachedStart:
        pytest.fail(f"fxray {case.cmd} {' '.join(case.argv)}: accepted (got past validation to the sweep's start)")
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    where = f"fxray {case.cmd} {' '.join(case.argv)}\nstdout: {out[-1500:]}\nstderr: {err[-3000:]}"
    assert code not in (0, None), where
    assert "Traceback" not in err and "Traceback" not in out, where
    assert 1 <= len(lines) <= MAX_STDERR_LINES, where
    if case.needle:
        assert case.needle in err, (case.needle, where)
    after = snapshot(ws)
    new = sorted(set(after) - set(before) - set(case.keep))
    changed = sorted(k for k in set(before) & set(after) if before[k] != after[k] and k not in case.keep)
    gone = sorted(set(before) - set(after))
    assert not (new or changed or gone), (f"new {new}, changed {changed}, gone {gone}", where)
    assert snapshot(golden) == golden_before, where


# --- the cases -------------------------------------------------------------------------------


def write(name: str, data: str | bytes):
    def setup(ws: Path):
        p = ws / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            p.write_bytes(data)
        else:
            p.write_text(data)

    return setup


def chain(*setups):
    def setup(ws: Path):
        for s in setups:
            s(ws)

    return setup


BAD_INTS = ["0", "-1", "x", "1.5", ""]
BAD_SEEDS = ["x", "1.5", "-1", str(2**64)]
BAD_FLOATS = ["x", "nan", "inf", "-1"]


def flag_cases() -> list[Case]:
    """Flags x bad values, per command."""
    base_tune = ["--experiment", "tiny.yaml", "--data", "m.fxcache", "--storage", "new"]
    base_train = ["--experiment", "tiny.yaml", "--data", "m.fxcache"]
    cases = []
    for flag in ("--trials", "--workers-per-gpu", "--population", "--cpu-workers", "--num-cpus", "--placebo"):
        for v in BAD_INTS:
            cases.append(Case(f"tune{flag}={v}", "tune", [*base_tune, flag, v]))
    for v in BAD_SEEDS:
        cases.append(Case(f"tune--seed={v}", "tune", [*base_tune, "--seed", v], needle="--seed"))
        cases.append(Case(f"train--seed={v}", "train", [*base_train, "--seed", v], needle="--seed"))
    for v in ("-1", "x", "1.5"):
        cases.append(Case(f"tune--num-gpus={v}", "tune", [*base_tune, "--num-gpus", v]))
    for flag, v in (("--profile", "tpu"), ("--profile", "")):
        cases.append(Case(f"tune{flag}={v}", "tune", [*base_tune, flag, v]))
    cases.append(Case("tune--address+--num-cpus", "tune", [*base_tune, "--address", "auto", "--num-cpus", "2"]))
    cases.append(Case("tune-unknown-flag", "tune", [*base_tune, "--bogus"]))
    cases.append(Case("tune-positional", "tune", [*base_tune, "extra"]))
    # --set: malformed, unknown, out of range, searched
    bad_sets = [
        "lr", "=3", "lr=[1", "nokey=1", "sweep.nokey=1", "search.nokey.low=1", "search.lr.high=x",
        "search.lr.type=bogus", "search.lr.low=-1", "sweep.trials=0", "sweep.grace_folds=-1",
        "sweep.reduction_factor=0", "sweep.population=0", "folds.max_folds=0", "folds.train=x",
        "dqn.lr=-1", "epochs=0", "epochs=x", "gamma=1.5", "gamma=-0.1", "batch_size=0", "hidden=-4",
        "fill=bogus", "dtype=float7", "cost=-1", "cost=x", "seeds=0", "lr=1e-3",
    ]  # fmt: skip
    for s in bad_sets:
        cases.append(Case(f"tune--set={s}", "tune", [*base_tune, "--set", s]))
    for s in ("lr", "=3", "lr=[1", "nokey=1", "epochs=0", "gamma=1.5", "batch_size=0", "fill=bogus", "cost=-1",
              "dtype=float7", "seeds=0", "hidden=-4", "folds.max_folds=2"):  # fmt: skip
        cases.append(Case(f"train--set={s}", "train", [*base_train, "--set", s]))
    for v in ("0", "-1", "x"):
        cases.append(Case(f"train--epochs={v}", "train", [*base_train, "--epochs", v]))
    for v in ("x", "9", "-1", "0,0", ""):
        cases.append(Case(f"train--folds={v}", "train", [*base_train, "--folds", v]))
    for v in ("tpu", "cuda:x", "cuda:99"):
        cases.append(Case(f"train--device={v}", "train", [*base_train, "--device", v]))
    for v in ("x", "-1", "nan"):
        cases.append(Case(f"train--tolerance={v}", "train", ["--from-run", "0" * 32, "--tolerance", v]))
    cases.append(Case("train--from-run+--set", "train", ["--from-run", "0" * 32, "--set", "lr=1"]))
    cases.append(Case("train--from-run-unknown", "train", ["--from-run", "0" * 32]))
    cases.append(Case("train--from-run-not-hex", "train", ["--from-run", "nothex"]))
    for v in ("0", "-5", "x"):
        cases.append(Case(f"train--synth-bars={v}", "train", ["--experiment", "tiny.yaml", "--synth-bars", v]))
    cases.append(Case("train-unknown-flag", "train", [*base_train, "--bogus"]))
    # data
    for v in ("0", "-1", "x", "1.5"):
        cases.append(Case(f"data-synth--bars={v}", "data", ["synth", "--bars", v, "--out", "o.fxcache"]))
    for v in BAD_SEEDS:
        cases.append(
            Case(f"data-synth--seed={v}", "data", ["synth", "--bars", "100", "--seed", v, "--out", "o.fxcache"])
        )
    for v in ("bogus", "xls"):
        cases.append(
            Case(
                f"data-build--format={v}", "data", ["build", "--bars", "bars.csv", "--format", v, "--out", "o.fxcache"]
            )
        )
    for v in ("Mars/Olympus", "UTC+25"):
        cases.append(
            Case(f"data-build--tz={v}", "data", ["build", "--bars", "bars.csv", "--tz", v, "--out", "o.fxcache"])
        )
    cases.append(Case("data-build-no-bars", "data", ["build", "--out", "o.fxcache"]))
    cases.append(Case("data-no-command", "data", []))
    cases.append(Case("data-bogus-command", "data", ["bogus"]))
    cases.append(Case("data-info-missing-arg", "data", ["info"]))
    # compare
    cases.append(Case("compare-unknown-flag", "compare", ["--bogus"]))
    cases.append(Case("compare-unknown-experiment", "compare", ["nosuch", "--no-log"]))
    # export
    for v in ("worst", "fold:x", "fold:9", "fold:-1", ""):
        cases.append(
            Case(f"export--model={v}", "export", ["ck/seed0", "--data", "m.fxcache", "--out", "b2", "--model", v])
        )
    cases.append(Case("export-no-out", "export", ["ck/seed0", "--data", "m.fxcache"]))
    cases.append(Case("export-no-data", "export", ["ck/seed0", "--out", "b2"]))
    cases.append(Case("export-run-id-unknown", "export", ["0" * 32, "--out", "b2"]))
    cases.append(Case("export-source-missing", "export", ["nope", "--out", "b2"]))
    # backtest
    bt = ["--policy", "bundle", "--data", "m.fxcache"]
    for flag, v in (("--window", "train"), ("--window", ""), ("--from", "yesterday"), ("--to", "2017-13-01"),
                    ("--from", "2100-01-01"), ("--engine", "tensorflow"), ("--device", "tpu"),
                    ("--device", "cuda:x")):  # fmt: skip
        cases.append(Case(f"backtest{flag}={v}", "backtest", [*bt, flag, v]))
    for v in [*BAD_FLOATS, "0.5"]:
        cases.append(Case(f"backtest--cost={v}", "backtest", [*bt, "--cost", v], needle="--cost"))
    cases.append(Case("backtest-no-policy", "backtest", ["--data", "m.fxcache"]))
    # live
    lv = ["--policy", "bundle", "--bars", "bars.csv"]
    for flag, v in (("--format", "xls"), ("--format", ""), ("--engine", "tensorflow"), ("--tz", "Mars/Olympus"),
                    ("--tz", "")):  # fmt: skip
        cases.append(Case(f"live{flag}={v}", "live", [*lv, flag, v]))
    cases.append(Case("live-no-bars", "live", ["--policy", "bundle"]))
    return cases


def output_cases() -> list[Case]:
    """Output paths that cannot be written: a directory, under a file, in a read-only directory."""
    cases = []
    outs = {
        "tune": (["--experiment", "tiny.yaml", "--data", "m.fxcache", "--storage", "new"], ["--json"]),
        "train": (["--experiment", "tiny.yaml", "--data", "m.fxcache"], ["--json", "--checkpoint-dir"]),
        "compare": (["--no-log"], ["--out", "--json"]),
        "backtest": (["--policy", "bundle", "--data", "m.fxcache"], ["--json", "--positions"]),
        "live": (["--policy", "bundle", "--bars", "bars.csv"], ["--out", "--json"]),
        "export": (["ck/seed0", "--data", "m.fxcache", "--out", "b2"], ["--json"]),
    }
    for cmd, (argv, flags) in outs.items():
        for flag in flags:
            is_dir = flag in ("--checkpoint-dir", "--out") and cmd == "compare" or flag == "--checkpoint-dir"
            if not is_dir:
                cases.append(Case(f"{cmd}{flag}=a-directory", cmd, [*argv, flag, "adir"], setup=mkdir("adir")))
            else:
                cases.append(Case(f"{cmd}{flag}=a-file", cmd, [*argv, flag, "afile"], setup=write("afile", "x")))
            cases.append(
                Case(f"{cmd}{flag}=under-a-file", cmd, [*argv, flag, "afile/x.out"], setup=write("afile", "x"))
            )
            cases.append(Case(f"{cmd}{flag}=read-only-dir", cmd, [*argv, flag, "ro/x.out"], setup=read_only_dir("ro")))
    for cmd in ("synth", "build"):
        src = ["--bars", "100"] if cmd == "synth" else ["--bars", "bars.csv"]
        cases.append(Case(f"data-{cmd}--out=a-directory", "data", [cmd, *src, "--out", "adir"], setup=mkdir("adir")))
        cases.append(Case(f"data-{cmd}--out=under-a-file", "data", [cmd, *src, "--out", "afile/o.fxcache"],
                          setup=write("afile", "x")))  # fmt: skip
        cases.append(Case(f"data-{cmd}--out=read-only-dir", "data", [cmd, *src, "--out", "ro/o.fxcache"],
                          setup=read_only_dir("ro")))  # fmt: skip
        cases.append(Case(f"data-{cmd}--json=a-directory", "data", [cmd, *src, "--out", "o.fxcache", "--json", "adir"],
                          setup=mkdir("adir")))  # fmt: skip
    cases.append(
        Case("data-info--json=a-directory", "data", ["info", "m.fxcache", "--json", "adir"], setup=mkdir("adir"))
    )
    cases.append(Case("data-info--json=under-a-file", "data", ["info", "m.fxcache", "--json", "afile/i.json"],
                      setup=write("afile", "x")))  # fmt: skip
    # export --out: what exists there is replaced only if it is a bundle fxray wrote (issue 51 item 2)
    ex = ["ck/seed0", "--data", "m.fxcache"]
    cases.append(Case("export--out=existing-bundle-no-force", "export", [*ex, "--out", "bundle"]))
    for what, setup in (("a-file", write("afile", "x")), ("a-data-dir", write("afile/data.csv", "x")),
                        ("empty-dir", mkdir("afile")),
                        ("fake-manifest", write("afile/manifest.json", "{}"))):  # fmt: skip
        cases.append(Case(f"export--force--out={what}", "export", [*ex, "--out", "afile", "--force"], setup=setup,
                          needle="not a policy bundle"))  # fmt: skip
    return cases


def mkdir(name):
    def setup(ws):
        (ws / name).mkdir(parents=True)

    return setup


def read_only_dir(name):
    def setup(ws):
        (ws / name).mkdir()
        make_read_only(ws / name)

    return setup


MOUNTS: list[Path] = []  # read-only bind mounts of this process (root ignores mode bits)


def make_read_only(path: Path) -> None:
    """A directory nothing can be written into: mode 555, and for root a read-only bind mount."""
    import subprocess

    os.chmod(path, 0o555)
    if os.geteuid() == 0:
        subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
        MOUNTS.append(path)
        subprocess.run(["mount", "-o", "remount,ro,bind", str(path)], check=True)


# --- files x corruptions -----------------------------------------------------------------------


def fxcache_corruptions() -> dict:
    """name -> setup(ws) writing bad.fxcache."""

    def from_good(edit):
        def setup(ws):
            (ws / "bad.fxcache").write_bytes(edit((ws / "m.fxcache").read_bytes()))

        return setup

    def with_meta(**changes):
        def setup(ws):
            import pyarrow as pa
            import pyarrow.ipc as ipc

            with pa.memory_map(str(ws / "m.fxcache")) as src:
                table = ipc.open_file(src).read_all()
            meta = {k.decode(): v.decode() for k, v in table.schema.metadata.items()}
            for k, v in changes.items():
                k = k.replace("__", ".")
                if v is None:
                    meta.pop(k, None)
                else:
                    meta[k] = v
            table = table.replace_schema_metadata(meta)
            with ipc.new_file(ws / "bad.fxcache", table.schema) as w:
                w.write_table(table)

        return setup

    def with_table(edit):
        def setup(ws):
            import pyarrow as pa
            import pyarrow.ipc as ipc

            with pa.memory_map(str(ws / "m.fxcache")) as src:
                table = ipc.open_file(src).read_all()
            table = edit(table)
            with ipc.new_file(ws / "bad.fxcache", table.schema) as w:
                w.write_table(table)

        return setup

    def fifo(ws):
        os.mkfifo(ws / "bad.fxcache")

    def unreadable(ws):
        shutil.copy(ws / "m.fxcache", ws / "bad.fxcache")
        os.chmod(ws / "bad.fxcache", 0)

    return {
        "missing": lambda ws: None,
        "empty": write("bad.fxcache", b""),
        "text": write("bad.fxcache", "timestamp,open\n1,2\n"),
        "random-bytes": write("bad.fxcache", bytes(np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8))),
        "cut-in-half": from_good(lambda b: b[: len(b) // 2]),
        "cut-to-header": from_good(lambda b: b[:64]),
        "last-byte-gone": from_good(lambda b: b[:-1]),
        "a-directory": mkdir("bad.fxcache"),
        "a-fifo": fifo,
        "unreadable": unreadable,
        "parquet-not-arrow": lambda ws: shutil.copy(ws / "bars.parquet", ws / "bad.fxcache"),
        "no-metadata": with_table(lambda t: t.replace_schema_metadata({})),
        "meta-no-content-hash": with_meta(content_hash=None),
        "meta-no-feature-names": with_meta(feature_names=None),
        "meta-version-99": with_meta(fxray__version="99"),
        "meta-version-x": with_meta(fxray__version='"x"'),
        "meta-feature-names-dict": with_meta(feature_names='{"a": 1}'),
        "meta-feature-names-short": with_meta(feature_names='["a"]'),
        "meta-feature-names-not-json": with_meta(feature_names="[a"),
        "meta-hash-algo-md5": with_meta(content_hash_algo='"md5"'),
        "meta-hash-short": with_meta(content_hash='"abc"'),
        "meta-hash-not-hex": with_meta(content_hash='"' + "z" * 32 + '"'),
        "meta-hash-number": with_meta(content_hash="12"),
        "drop-column-targets": with_table(lambda t: t.drop(["targets"])),
        "drop-column-ts": with_table(lambda t: t.drop(["ts"])),
        "ts-as-string": with_table(lambda t: t.set_column(0, "ts", t.column("ts").cast("string"))),
        "no-rows": with_table(lambda t: t.slice(0, 0)),
        "rows-reversed": with_table(lambda t: t.take(list(range(t.num_rows - 1, -1, -1)))),
        "rows-duplicated": with_table(lambda t: __import__("pyarrow").concat_tables([t.slice(0, 10), t.slice(0, 10)])),
        "one-row": with_table(lambda t: t.slice(0, 1)),
        "flipped-byte": from_good(flip_middle),
    }


def flip_middle(b: bytes) -> bytes:
    raw = bytearray(b)
    raw[len(raw) // 2] ^= 0x10
    return bytes(raw)


# corruptions found by the O(N) check only (values, content hash): commands that verify
VERIFY_ONLY = {"flipped-byte", "rows-reversed", "rows-duplicated", "one-row"}


def fxcache_cases() -> list[Case]:
    cases = []
    for name, setup in fxcache_corruptions().items():
        only_verify = name in VERIFY_ONLY
        cases.append(Case(f"data-info[{name}]", "data", ["info", "bad.fxcache"], setup=setup))
        cases.append(Case(f"train[{name}]", "train", ["--experiment", "tiny.yaml", "--data", "bad.fxcache"], setup))
        cases.append(Case(f"export[{name}]", "export", ["ck/seed0", "--data", "bad.fxcache", "--out", "b2"], setup))
        cases.append(Case(f"backtest[{name}]", "backtest", ["--policy", "bundle", "--data", "bad.fxcache"], setup))
        if not only_verify:  # the sweep verifies once Ray is up (an overlap): those are test_drills'
            cases.append(Case(f"tune[{name}]", "tune", ["--experiment", "tiny.yaml", "--data", "bad.fxcache",
                                                         "--storage", "new"], setup))  # fmt: skip
            cases.append(Case(f"data-build[{name}]", "data", ["build", "--bars", "bad.fxcache", "--out", "o.fxcache"],
                              setup))  # fmt: skip
    return cases


GOOD_CSV = "timestamp,open,high,low,close\n2024-01-02 00:00:00,1.1,1.2,1.0,1.15\n2024-01-02 00:01:00,1.1,1.2,1.0,1.15\n"


def csv_corruptions() -> dict:
    head = "timestamp,open,high,low,close\n"
    row = "2024-01-02 00:{m:02d}:00,1.1,1.2,1.0,{c}\n"
    rows = "".join(row.format(m=m, c=1.15) for m in range(30))
    return {
        "empty": "",
        "no-close-column": "timestamp,open,high,low\n2024-01-02 00:00:00,1,1,1\n",
        "no-timestamp": "open,high,low,close\n1,1,1,1\n",
        "text-close": head + rows + row.format(m=31, c="x1"),
        "zero-close": head + rows + row.format(m=31, c=0),
        "negative-close": head + rows + row.format(m=31, c=-1.5),
        "bad-timestamp": head + rows + "2024-13-45 99:00:00,1,1,1,1\n",
        "ragged-row": head + rows + "2024-01-02 00:40:00,1,1\n",
        "binary": "\x00\x01\x02garbage\xff",
        "all-nan": head + "".join(f"2024-01-02 00:{m:02d}:00,nan,nan,nan,nan\n" for m in range(10)),
        "one-row": head + row.format(m=0, c=1.1),
        "tab-separated": "timestamp\topen\thigh\tlow\tclose\n2024-01-02 00:00:00\t1\t1\t1\t1\n",
        "latin1": (head + rows).replace("timestamp", "timest\xe4mp"),
    }


# what live's one line names for each CSV fault: the line (1 = the header) and what is wrong there.
# one-row is a feed shorter than the warm-up, not a bad one: live prints `warmup` for it, exit 0.
LIVE_CSV_FAULTS = {
    "empty": "bad.csv: empty; the first line must be a header",
    "no-close-column": "bad.csv: header 'timestamp,open,high,low' lacks close",
    "no-timestamp": "bad.csv: header 'open,high,low,close' lacks ts",
    "text-close": "bad.csv line 32: could not convert string to float: 'x1'",
    "zero-close": "bad.csv line 32: bar 30 (ts 1704155460000000000): close = 0.0; prices must be finite and > 0",
    "negative-close": "bad.csv line 32: bar 30 (ts 1704155460000000000): close = -1.5; prices must be finite",
    "bad-timestamp": "bad.csv line 32: month must be in 1..12",
    "ragged-row": "bad.csv line 32: 3 fields, the header has 5",
    "binary": "lacks open, high, low, close, ts",
    "all-nan": "bad.csv line 2: bar 0 (ts 1704153600000000000): open = nan; prices must be finite and > 0",
    "tab-separated": r"bad.csv: header 'timestamp\topen\thigh\tlow\tclose' lacks open",
    "latin1": "'utf-8' codec can't decode byte 0xe4",
}


def bars_cases() -> list[Case]:
    """Bar files x corruptions, for `data build` and `live`. live runs bars-bundle, which reads no
    order flow: `bundle` reads the synthetic order flow, so a plain OHLCV file is refused at its
    header, before the fault a case plants (live-csv[no-order-flow] is about that)."""
    cases = []
    live = ["--policy", "bars-bundle", "--bars"]
    for name, text in csv_corruptions().items():
        setup = write("bad.csv", text.encode("latin-1") if name == "latin1" else text)
        cases.append(
            Case(f"data-build-csv[{name}]", "data", ["build", "--bars", "bad.csv", "--out", "o.fxcache"], setup)
        )
        if name in LIVE_CSV_FAULTS:
            cases.append(Case(f"live-csv[{name}]", "live", [*live, "bad.csv"], setup, LIVE_CSV_FAULTS[name]))
    cases.append(Case("live-csv[out-of-order]", "live", [*live, "bad.csv"],
                      write("bad.csv", "ts,open,high,low,close\n2024-01-02 00:01:00,1,1,1,1\n"
                                       "2024-01-02 00:00:00,1,1,1,1\n"),
                      "bad.csv line 3: bar 1: ts 1704153600000000000 is not after the previous bar's"))  # fmt: skip
    cases.append(Case("live-csv[no-order-flow]", "live", ["--policy", "bundle", "--bars", "bad.csv"],
                      write("bad.csv", GOOD_CSV), "bad.csv: lacks the order flow this policy reads"))  # fmt: skip
    for name, setup in parquet_corruptions().items():
        cases.append(Case(f"data-build-parquet[{name}]", "data",
                          ["build", "--bars", "bad.parquet", "--format", "parquet", "--out", "o.fxcache"],
                          setup))  # fmt: skip
        cases.append(Case(f"live-parquet[{name}]", "live", [*live, "bad.parquet", "--format", "parquet"], setup))
    for what, setup in (("missing", None), ("a-directory-of-nothing", mkdir("bad.csv"))):
        cases.append(
            Case(f"data-build-bars[{what}]", "data", ["build", "--bars", "bad.csv", "--out", "o.fxcache"], setup)
        )
        cases.append(Case(f"live-bars[{what}]", "live", [*live, "bad.csv"], setup))
    return cases


def parquet_corruptions() -> dict:
    def edit(fn):
        def setup(ws):
            import pandas as pd

            df = fn(pd.read_parquet(ws / "bars.parquet"))
            df.to_parquet(ws / "bad.parquet")

        return setup

    def raw(fn):
        def setup(ws):
            (ws / "bad.parquet").write_bytes(fn((ws / "bars.parquet").read_bytes()))

        return setup

    return {
        "cut": raw(lambda b: b[: len(b) // 2]),
        "empty": raw(lambda b: b""),
        "no-close": edit(lambda d: d.drop(columns=["close"])),
        "close-as-text": edit(lambda d: d.assign(close=d.close.astype(str).str.replace("1", "x"))),
        "zero-prices": edit(lambda d: d.assign(close=0.0)),
        "no-rows": edit(lambda d: d.iloc[:0]),
        "no-timestamp": edit(lambda d: d.drop(columns=["timestamp"])),
    }


def yaml_corruptions() -> dict:
    good = TINY.format(trials=2, steps=10, grace=2, folds=2, bars=20000)
    return {
        "missing": None,
        "empty": "",
        "comment-only": "# nothing\n",
        "a-list": "- 1\n- 2\n",
        "a-string": "hello\n",
        "not-yaml": "name: [unclosed\n",
        "tabs": "name:\tt\n\tfolds: 1\n",
        "duplicate-key": good + "name: u\n",
        "unknown-section": good + "bogus: 1\n",
        "unknown-dqn-key": good.replace("patience: 2}", "patience: 2, nokey: 1}"),
        "name-a-list": good.replace("name: t", "name: [1]"),
        "name-with-slash": good.replace("name: t", "name: ../../etc"),
        "search-bad-type": good.replace("type: loguniform", "type: bogus"),
        "search-low-above-high": good.replace("low: 1.0e-4", "low: 1.0"),
        "search-unknown-field": good.replace("gamma: {type", "nofield: {type"),
        "sweep-trials-zero": good.replace("trials: 2", "trials: 0"),
        "sweep-trials-text": good.replace("trials: 2", "trials: many"),
        "sweep-seed-negative": good.replace("seed: 0, grace", "seed: -1, grace"),
        "sweep-grace-zero": good.replace("grace_folds: 2", "grace_folds: 0"),
        "folds-bad-length": good.replace("train: 4d", "train: 4x"),
        "folds-zero": good.replace("max_folds: 2", "max_folds: 0"),
        "dqn-nan": good.replace("patience: 2}", "patience: 2, grad_clip: .nan}"),
        "dqn-inf": good.replace("patience: 2}", "patience: 2, reward_scale: .inf}"),
        "dqn-lr-negative": good.replace("patience: 2}", "patience: 2, lr: -1}"),
        "dqn-gamma-2": good.replace("patience: 2}", "patience: 2, gamma: 2}"),
        "dqn-string-int": good.replace("hidden: 16", "hidden: sixteen"),
        "dqn-bool-int": good.replace("hidden: 16", "hidden: true"),
        "synth-bars-negative": good.replace("n_bars: 20000", "n_bars: -5"),
        "non-utf8": b"name: caf\xe9\n",
        "binary": b"\x00\x01\x02\xff",
        "python-tag": good + "x: !!python/object/apply:os.system ['true']\n",
        "anchor-bomb": "a: &a [1,1,1,1,1,1,1,1,1]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
        "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
        "d: [*c,*c,*c,*c,*c,*c,*c,*c,*c]\nname: t\n",
    }


def yaml_cases() -> list[Case]:
    cases = []
    tune_only = ("sweep-seed-negative",)  # train and data info read no sweep: section
    for name, text in yaml_corruptions().items():
        setup = None if text is None else write("bad.yaml", text)
        cases.append(Case(f"tune-yaml[{name}]", "tune", ["--experiment", "bad.yaml", "--data", "m.fxcache",
                                                          "--storage", "new"], setup))  # fmt: skip
        if name in tune_only:
            continue
        cases.append(Case(f"train-yaml[{name}]", "train", ["--experiment", "bad.yaml", "--data", "m.fxcache"], setup))
        if name not in ("duplicate-key",):
            cases.append(Case(f"data-info-yaml[{name}]", "data", ["info", "m.fxcache", "--experiment", "bad.yaml"],
                              setup))  # fmt: skip
    cases.append(Case("tune-yaml[a-directory]", "tune", ["--experiment", "adir", "--storage", "new"], mkdir("adir")))
    cases.append(
        Case("train-yaml[a-directory]", "train", ["--experiment", "adir", "--data", "m.fxcache"], mkdir("adir"))
    )
    good = TINY.format(trials=2, steps=10, grace=2, folds=2, bars=20000)
    nowhere = write("bad.yaml", good.replace("data: {synth: {n_bars: 20000, seed: 0}}", "data: {path: nope.fxcache}"))
    cases.append(
        Case("tune-yaml[data-path-missing]", "tune", ["--experiment", "bad.yaml", "--storage", "new"], nowhere)
    )
    cases.append(Case("train-yaml[data-path-missing]", "train", ["--experiment", "bad.yaml"], nowhere))
    return cases


def edit_json(path: str, fn):
    def setup(ws):
        p = ws / path
        p.write_text(json.dumps(fn(json.loads(p.read_text()))))

    return setup


def run_dir_corruptions() -> dict:
    """The interrupted sweep in runs/t, damaged as no crash leaves it (a crash's leftovers are
    tolerated: test_reliability)."""

    def sweep_edit(fn):
        def edit(s):
            fn(s)
            return s

        return edit_json("runs/t/sweep.json", edit)

    def append(path, text):
        def setup(ws):
            with open(ws / path, "a") as f:
                f.write(text)

        return setup

    return {
        "sweep-json-not-json": write("runs/t/sweep.json", "{not json"),
        "sweep-json-empty": write("runs/t/sweep.json", ""),
        "sweep-json-a-list": write("runs/t/sweep.json", "[1, 2]"),
        "sweep-json-no-rounds": sweep_edit(lambda s: s.pop("rounds")),
        "sweep-json-rounds-empty": sweep_edit(lambda s: s.update(rounds=[])),
        "sweep-json-no-data": sweep_edit(lambda s: s.pop("data")),
        "sweep-json-no-mlflow": sweep_edit(lambda s: s.pop("mlflow")),
        "sweep-json-other-hash": sweep_edit(lambda s: s["data"].update(content_hash="0" * 32)),
        "sweep-json-seed-huge": sweep_edit(lambda s: s["rounds"][-1].update(seed=2**70)),
        "sweep-json-seed-negative": sweep_edit(lambda s: s["rounds"][-1].update(seed=-3)),
        "sweep-json-seed-text": sweep_edit(lambda s: s["rounds"][-1].update(seed="x")),
        "sweep-json-trials-zero": sweep_edit(lambda s: s["rounds"][-1].update(trials=0)),
        "sweep-json-base-seed-huge": sweep_edit(lambda s: s["base"].update(seed=2**70)),
        "sweep-json-base-unknown-key": sweep_edit(lambda s: s["base"].update(nokey=1)),
        "sweep-json-base-lr-negative": sweep_edit(lambda s: s["base"].update(lr=-1.0)),
        "sweep-json-folds-not-list": sweep_edit(lambda s: s.update(folds=3)),
        "sweep-json-uri-bogus": sweep_edit(lambda s: s["mlflow"].update(uri="mlflw://x")),
        "experiment-yaml-gone": lambda ws: (ws / "runs/t/experiment.yaml").unlink(),
        "experiment-yaml-garbage": write("runs/t/experiment.yaml", "name: [\n"),
        "folds-jsonl-garbage-line": lambda ws: (ws / "runs/t/folds.jsonl").write_text(
            "garbage\n" + (ws / "runs/t/folds.jsonl").read_text()
        ),
        "folds-jsonl-not-an-object": append("runs/t/folds.jsonl", "[1, 2]\n"),
        "folds-jsonl-no-trial-id": append("runs/t/folds.jsonl", '{"fold": 1}\n'),
        "events-jsonl-garbage-line": append("runs/t/events.jsonl", "garbage\n"),
        "events-jsonl-binary": append("runs/t/events.jsonl", "\x00\x01\n"),
        "optuna-journal-garbage-line": lambda ws: (ws / "runs/t/optuna.journal").write_text(
            "garbage\n" + (ws / "runs/t/optuna.journal").read_text()
        ),
        "optuna-journal-a-directory": lambda ws: (
            (ws / "runs/t/optuna.journal").unlink(),
            (ws / "runs/t/optuna.journal").mkdir(),
        ),
        "optuna-db-of-an-earlier-fxray": write("runs/t/optuna.db", b"SQLite format 3\x00" + bytes(100)),
        "sweep-json-a-directory": lambda ws: ((ws / "runs/t/sweep.json").unlink(), (ws / "runs/t/sweep.json").mkdir()),
    }


def run_dir_cases() -> list[Case]:
    cases = []
    for name, setup in run_dir_corruptions().items():
        cases.append(Case(f"tune-resume[{name}]", "tune", ["--storage", "runs/t", "--resume"], setup))
    extra = [
        ("resume-no-sweep", ["--storage", "empty", "--resume"], mkdir("empty")),
        ("resume-storage-missing", ["--storage", "nowhere", "--resume"], None),
        ("storage-a-file", ["--experiment", "tiny.yaml", "--storage", "afile"], write("afile", "x")),
        ("resume-other-experiment", ["--storage", "runs/t", "--resume", "--experiment", "other.yaml"],
         write("other.yaml", TINY.format(trials=3, steps=10, grace=2, folds=2, bars=20000))),
        ("resume-other-data", ["--storage", "runs/t", "--resume", "--data", "bars.csv"], None),
        ("resume-other-tracking-uri", ["--storage", "runs/t", "--resume", "--tracking-uri", "sqlite:///o.db"], None),
        ("not-resume-interrupted", ["--storage", "runs/t"], None),
        ("resume-same-trials", ["--storage", "runs/t", "--resume", "--same-trials", "results.json"], None),
        ("resume-set-search", ["--storage", "runs/t", "--resume", "--set", "search.lr.high=2e-4"], None),
        ("resume-set-sweep", ["--storage", "runs/t", "--resume", "--set", "sweep.grace_folds=1"], None),
        ("resume-set-config", ["--storage", "runs/t", "--resume", "--set", "epochs=5"], None),
        ("resume-other-population", ["--storage", "runs/t", "--resume", "--population", "2"], None),
        ("resume-other-trials", ["--storage", "runs/t", "--resume", "--trials", "9"], None),
        ("resume-other-seed", ["--storage", "runs/t", "--resume", "--seed", "9"], None),
        ("resume-run-dir-read-only", ["--storage", "runs/t", "--resume"], lambda ws: make_read_only(ws / "runs/t")),
    ]  # fmt: skip
    for name, argv, setup in extra:
        cases.append(Case(f"tune-{name}", "tune", argv, setup))
    for name, text in (("missing", None), ("not-json", "{x"), ("a-list", "[]"), ("no-trials", '{"profile": "cpu"}'),
                       ("trials-not-list", '{"trials": 3, "profile": "cpu", "seed": 0}')):  # fmt: skip
        setup = None if text is None else write("same.json", text)
        cases.append(Case(f"tune-same-trials[{name}]", "tune", ["--experiment", "tiny.yaml", "--data", "m.fxcache",
                                                                 "--storage", "new", "--same-trials", "same.json"],
                          setup))  # fmt: skip
    return cases


def bundle_corruptions() -> dict:
    def manifest(fn):
        def edit(m):
            fn(m)
            return m

        return edit_json("bundle/manifest.json", edit)

    def member_file(suffix, fn):
        def setup(ws):
            p = next((ws / "bundle/members").glob(f"*{suffix}"))
            p.write_bytes(fn(p.read_bytes()))

        return setup

    def nan_stats(ws):
        from safetensors.numpy import load_file, save_file

        from fxray.policy.bundle import sha256

        p = ws / "bundle/normalisation.safetensors"
        norm = load_file(str(p))
        for k in norm:
            if k.endswith(".mean"):
                norm[k][3] = np.nan
        save_file(norm, str(p))
        m = json.loads((ws / "bundle/manifest.json").read_text())
        m["files"]["normalisation.safetensors"] = sha256(p)
        (ws / "bundle/manifest.json").write_text(json.dumps(m))

    def extra_file(ws):
        (ws / "bundle/members/evil.onnx").write_bytes(b"not in the manifest")

    def escape(ws):
        m = json.loads((ws / "bundle/manifest.json").read_text())
        m["members"][0]["weights"] = "../../m.fxcache"
        m["files"]["../../m.fxcache"] = m["files"].pop(next(k for k in m["files"] if k.endswith(".safetensors")
                                                            and k.startswith("members/")))  # fmt: skip
        (ws / "bundle/manifest.json").write_text(json.dumps(m))

    return {
        "no-dir": lambda ws: shutil.rmtree(ws / "bundle"),
        "a-file": lambda ws: (shutil.rmtree(ws / "bundle"), (ws / "bundle").write_text("x")),
        "no-manifest": lambda ws: (ws / "bundle/manifest.json").unlink(),
        "manifest-not-json": write("bundle/manifest.json", "{x"),
        "manifest-a-list": write("bundle/manifest.json", "[]"),
        "manifest-binary": write("bundle/manifest.json", b"\xff\xfe\x00"),
        "format-other": manifest(lambda m: m.update(format="other")),
        "version-2": manifest(lambda m: m.update(version=2)),
        "no-members-key": manifest(lambda m: m.pop("members")),
        "members-empty": manifest(lambda m: m.update(members=[])),
        "members-not-list": manifest(lambda m: m.update(members=3)),
        "files-not-dict": manifest(lambda m: m.update(files=[1])),
        "member-weights-missing": manifest(lambda m: m["members"][0].update(weights="members/none.safetensors")),
        "member-no-name": manifest(lambda m: m["members"][0].pop("name")),
        "network-n-inputs-text": manifest(lambda m: m["network"].update(n_inputs="x")),
        "network-n-inputs-wrong": manifest(lambda m: m["network"].update(n_inputs=7)),
        "input-dtype-bogus": manifest(lambda m: m["network"].update(input_dtype="float7")),
        "input-dtype-int": manifest(lambda m: m["network"].update(input_dtype="int64")),
        "cost-negative": manifest(lambda m: m["trading"].update(cost=-1e-4)),
        "cost-text": manifest(lambda m: m["trading"].update(cost="cheap")),
        "cost-nan": manifest(lambda m: m["trading"].update(cost=float("nan"))),
        "fill-bogus": manifest(lambda m: m["trading"].update(fill="teleport")),
        "warmup-negative": manifest(lambda m: m["inputs"].update(warmup_bars=-1)),
        "warmup-text": manifest(lambda m: m["inputs"].update(warmup_bars="x")),
        "feature-names-short": manifest(lambda m: m["inputs"].update(feature_names=["a"])),
        "feature-names-not-list": manifest(lambda m: m["inputs"].update(feature_names="abc")),
        "content-hash-missing": manifest(lambda m: m["data"].pop("content_hash")),
        "weights-flipped": member_file(".safetensors", flip_middle),
        "weights-cut": member_file(".safetensors", lambda b: b[:100]),
        "onnx-flipped": member_file(".onnx", flip_middle),
        "onnx-gone": lambda ws: next((ws / "bundle/members").glob("*.onnx")).unlink(),
        "normalisation-gone": lambda ws: (ws / "bundle/normalisation.safetensors").unlink(),
        "normalisation-nan": nan_stats,
        "file-not-in-manifest": extra_file,
        "weights-path-escapes": escape,
        "weights-absolute": manifest(lambda m: m["members"][0].update(weights="/etc/passwd")),
    }


def bundle_cases() -> list[Case]:
    cases = []
    for name, setup in bundle_corruptions().items():
        cases.append(Case(f"backtest-bundle[{name}]", "backtest", ["--policy", "bundle", "--data", "m.fxcache"], setup))
        cases.append(Case(f"live-bundle[{name}]", "live", ["--policy", "bundle", "--bars", "bars.csv"], setup))
    return cases


def checkpoint_cases() -> list[Case]:
    def ck(fn):
        def setup(ws):
            shutil.copytree(ws / "ck", ws / "ck2", symlinks=False)
            fn(ws / "ck2/seed0")

        return setup

    def cj(fn):
        return ck(lambda d: (d / "fold1.json").write_text(json.dumps(fn(json.loads((d / "fold1.json").read_text())))))

    corruptions = {
        "empty-dir": ck(lambda d: [p.unlink() for p in d.iterdir()]),
        "sidecar-gone": ck(lambda d: (d / "fold1.json").unlink()),
        "sidecar-not-json": ck(lambda d: (d / "fold1.json").write_text("{x")),
        "weights-cut": ck(lambda d: (d / "fold1.safetensors").write_bytes(b"xx")),
        "weights-empty": ck(lambda d: (d / "fold1.safetensors").write_bytes(b"")),
        "sidecar-no-config": cj(lambda m: {k: v for k, v in m.items() if k != "config"}),
        "sidecar-no-fold": cj(lambda m: {k: v for k, v in m.items() if k != "fold"}),
        "sidecar-fold-outside": cj(lambda m: {**m, "fold": {**m["fold"], "train": [0, 10**9]}}),
        "sidecar-n-inputs-wrong": cj(lambda m: {**m, "n_inputs": 7}),
        "sidecar-fold-k-text": cj(lambda m: {**m, "fold": {**m["fold"], "k": "x"}}),
        "sidecar-a-list": cj(lambda m: [1]),
        "sidecar-config-bogus-fill": cj(lambda m: {**m, "config": {**m["config"], "fill": "teleport"}}),
    }
    cases = []
    for name, setup in corruptions.items():
        cases.append(Case(f"export-checkpoint[{name}]", "export", ["ck2/seed0", "--data", "m.fxcache", "--out", "b2"],
                          setup, keep=[]))  # fmt: skip

    # data it was not trained on: another synthetic market
    def other_data(ws):
        from fxray.data.synth import SynthSpec, to_cache

        to_cache(SynthSpec(n_bars=20000, seed=5), ws / "other.fxcache")

    cases.append(
        Case("export-other-data", "export", ["ck/seed0", "--data", "other.fxcache", "--out", "b2"], other_data)
    )
    cases.append(Case("backtest-window-test-other-data", "backtest",
                      ["--policy", "bundle", "--data", "other.fxcache", "--window", "test"], other_data))  # fmt: skip
    return cases


def tracking_uri_cases() -> list[Case]:
    """A store that cannot be used, for every command that opens one."""
    uris = {
        "unknown-scheme": "mlflw://localhost",
        "a-yaml-file": "sqlite:///{ws}/tiny.yaml",
        "sqlite-in-a-missing-dir": "sqlite:///{ws}/nowhere/x.db",
        "sqlite-read-only-dir": "sqlite:///{ws}/ro/x.db",
        "dead-server": "http://127.0.0.1:9",
        "sqlite-empty-path": "sqlite://",
        "garbage-db": "sqlite:///{ws}/garbage.db",
        "file-store-missing": "file:///{ws}/nowhere/mlruns",
    }
    cases = []
    for name, uri in uris.items():

        def setup(ws, uri=uri):
            (ws / "ro").mkdir()
            make_read_only(ws / "ro")
            (ws / "garbage.db").write_bytes(b"garbage" * 100)
            os.environ["FXRAY_TEST_URI"] = uri.format(ws=ws)

        for cmd, argv in (
            ("tune", ["--experiment", "tiny.yaml", "--data", "m.fxcache", "--storage", "new", "--tracking-uri", "@"]),
            ("compare", ["--no-log", "--tracking-uri", "@"]),
            ("export", ["0" * 32, "--out", "b2", "--tracking-uri", "@"]),
            ("train", ["--from-run", "0" * 32, "--tracking-uri", "@"]),
        ):
            cases.append(Case(f"{cmd}-tracking-uri[{name}]", cmd, argv, setup))
    return cases


ALL = (
    flag_cases()
    + output_cases()
    + fxcache_cases()
    + bars_cases()
    + yaml_cases()
    + run_dir_cases()
    + bundle_cases()
    + checkpoint_cases()
    + tracking_uri_cases()
)


@pytest.mark.parametrize("case", ALL, ids=[c.id for c in ALL])
def test_bad_input(case, golden, tmp_path, capsys, monkeypatch):
    if os.geteuid() == 0 and "unreadable" in case.id:
        pytest.skip("root reads whatever the mode bits say")
    if "@" in case.argv:  # a tracking URI in the workspace: known once it exists
        monkeypatch.setenv("FXRAY_TEST_URI", "")
        argv, setup = list(case.argv), case.setup

        def with_uri(ws):
            setup(ws)
            argv[argv.index("@")] = os.environ["FXRAY_TEST_URI"]

        case = Case(case.id, case.cmd, argv, with_uri, case.needle, case.keep)
    try:
        run_case(case, golden, tmp_path, capsys, monkeypatch)
    finally:
        restore_modes(tmp_path)


def restore_modes(root: Path) -> None:
    """Undo the read-only mounts and modes, so that pytest can remove the directory."""
    import subprocess

    while MOUNTS:
        subprocess.run(["umount", str(MOUNTS.pop())], check=True)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            if not p.is_symlink():
                os.chmod(p, 0o755 if p.is_dir() else 0o644)


def test_the_suite_covers_every_command_and_is_large():
    per = {cmd: sum(c.cmd == cmd for c in ALL) for cmd in COMMANDS}
    assert all(n >= 10 for n in per.values()), per
    assert len(ALL) >= 300 and len({c.id for c in ALL}) == len(ALL), (len(ALL), per)


def counts() -> dict:
    """Cases per command, as docs/reliability.md quotes them (cd tests; python -c
    'import test_bad_inputs as t; print(t.counts())')."""
    return {cmd: sum(c.cmd == cmd for c in ALL) for cmd in COMMANDS} | {"total": len(ALL)}
