"""fxray.experiment: the shipped files load; every bad input is one line naming file and key."""

from pathlib import Path

import pytest

from fxray.rl import experiment as E
from fxray.rl.config import DQNConfig

ROOT = Path(__file__).resolve().parents[1]
GOOD = """\
name: t
data: {synth: {n_bars: 20000, seed: 1}}
folds: {train: 4d, val: 2d, test: 2d, max_folds: 2}
dqn: {epochs: 2, hidden: 32}
search:
  lr: {type: loguniform, low: 1.0e-4, high: 3.0e-3}
  gamma: {type: uniform, low: 0.8, high: 0.99}
  hidden: {type: choice, values: [32, 64]}
  n_step: {type: randint, low: 1, high: 5}
sweep: {trials: 3, grace_folds: 2}
cpu: {dqn: {epochs: 1}, folds: {max_folds: 1}}
"""


def write(tmp_path, text, name="x.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def error(path, profile="gpu") -> str:
    with pytest.raises(E.ExperimentError) as info:
        E.load(path, profile)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"{path}: "), msg
    return msg


@pytest.mark.parametrize("name", ["default", "smoke", "eurusd_2017q1", "session", "shuffled"])
@pytest.mark.parametrize("profile", ["gpu", "cpu"])
def test_shipped_experiments_load(name, profile):
    exp = E.load(ROOT / "experiments" / f"{name}.yaml", profile)
    assert exp.name == name and exp.search and exp.sweep.cpu_per_trial > 0
    space = exp.space()
    assert set(space) == {p.name for p in exp.search}


def test_good_file_and_cpu_profile(tmp_path):
    path = write(tmp_path, GOOD)
    gpu, cpu = E.load(path, "gpu"), E.load(path, "cpu")
    assert (gpu.config.epochs, cpu.config.epochs) == (2, 1)
    assert (gpu.folds.max_folds, cpu.folds.max_folds) == (2, 1)
    assert gpu.config.hidden == cpu.config.hidden == 32 and gpu.synth.seed == 1
    assert gpu.config == DQNConfig().replace(epochs=2, hidden=32)
    space = gpu.space()
    assert space["lr"].log and not space["gamma"].log
    assert (space["n_step"].low, space["n_step"].high) == (1, 5)  # inclusive bounds
    assert space["hidden"].choices == (32, 64)
    over = E.load(path, "gpu", {"sweep.trials": 9, "name": "other"})
    assert (over.sweep.trials, over.name) == (9, "other")


def test_missing_file(tmp_path):
    assert "no such experiment file" in error(tmp_path / "nope.yaml")


def test_bad_yaml(tmp_path):
    msg = error(write(tmp_path, "name: t\nsearch: {lr: [1, 2\n"))
    assert "not valid YAML" in msg and "line" in msg


def test_unknown_top_level_key(tmp_path):
    msg = error(write(tmp_path, GOOD + "sweeep: {}\n"))
    assert "sweeep: unknown key" in msg and "search" in msg


def test_an_older_files_algo_is_dqn_or_a_one_line_error(tmp_path):
    assert E.load(write(tmp_path, "algo: dqn\n" + GOOD)).config == E.load(write(tmp_path, GOOD, "y.yaml")).config
    assert "algo: 'ppo' is not an algorithm fxray trains" in error(write(tmp_path, "algo: ppo\n" + GOOD))


def test_unknown_dqn_key(tmp_path):
    msg = error(write(tmp_path, GOOD.replace("epochs: 2,", "epochz: 2,")))
    assert "dqn.epochz: unknown key" in msg and "epochs" in msg


def test_unknown_key_in_cpu_section_fails_on_gpu_too(tmp_path):
    msg = error(write(tmp_path, GOOD.replace("dqn: {epochs: 1}", "dqn: {epoch: 1}")), "gpu")
    assert "cpu.dqn.epoch: unknown key" in msg


def test_bad_range_loguniform_low(tmp_path):
    msg = error(write(tmp_path, GOOD.replace("low: 1.0e-4", "low: 0")))
    assert "search.lr.low: 0 must be > 0" in msg


def test_bad_range_low_above_high(tmp_path):
    msg = error(write(tmp_path, GOOD.replace("low: 0.8, high: 0.99", "low: 0.9, high: 0.5")))
    assert "search.gamma.high" in msg and "must be > low" in msg


def test_bad_range_outside_config_limits(tmp_path):
    msg = error(write(tmp_path, GOOD.replace("low: 0.8, high: 0.99", "low: 0.8, high: 1.5")))
    assert "search.gamma.high: 1.5 must be a number in [0, 1]" in msg


def test_bad_value_from_cpu_section_is_named_there(tmp_path):
    msg = error(write(tmp_path, GOOD.replace("dqn: {epochs: 1}", "dqn: {epochs: 0}")), "cpu")
    assert "cpu.dqn.epochs: 0 must be an integer >= 1" in msg


def test_bad_type(tmp_path):
    msg = error(write(tmp_path, GOOD.replace("epochs: 2,", "epochs: two,")))
    assert "dqn.epochs: 'two' must be an integer" in msg


def test_bad_type_bool(tmp_path):
    msg = error(write(tmp_path, GOOD.replace("hidden: 32}", "hidden: 32, abstain: 1}")))
    assert "dqn.abstain: 1 must be true or false" in msg


def test_bad_search_type_and_field(tmp_path):
    msg = error(write(tmp_path, GOOD.replace("type: uniform", "type: normal")))
    assert "search.gamma.type: 'normal' must be one of" in msg
    msg = error(write(tmp_path, GOOD.replace("  n_step:", "  nstep:")))
    assert "search.nstep: not a DQNConfig field" in msg


def test_int_search_needs_integers(tmp_path):
    msg = error(write(tmp_path, GOOD.replace("low: 1, high: 5", "low: 1.5, high: 5")))
    assert "search.n_step.low: 1.5 must be an integer" in msg


def test_bad_sweep_values(tmp_path):
    msg = error(write(tmp_path, GOOD.replace("sweep: {trials: 3", "sweep: {cpu_per_trial: 0, trials: 3")))
    assert "sweep.cpu_per_trial: 0 must be in (0, 64]" in msg
    msg = error(write(tmp_path, GOOD.replace("sweep: {trials: 3", "sweep: {trials: 0")))
    assert "sweep.trials: 0 must be >= 1" in msg
    msg = error(write(tmp_path, GOOD.replace("sweep: {trials: 3", "sweep: {trials_per_worker: 0, trials: 3")))
    assert "sweep.trials_per_worker: 0 must be >= 1" in msg


def test_bad_folds(tmp_path):
    msg = error(write(tmp_path, GOOD.replace("train: 4d", "train: 4 days")))
    assert "folds.train" in msg and "duration" in msg
    msg = error(write(tmp_path, GOOD.replace("train: 4d", "train: 4d, holdout: true")))
    assert "folds.holdout: True must be a duration like '20d'" in msg
    msg = error(write(tmp_path, GOOD.replace("train: 4d", "train: 4d, holdout: 4d")))
    assert "folds.holdout: '4d' is not shorter than folds.train" in msg


def test_not_a_mapping(tmp_path):
    assert "must be a mapping" in error(write(tmp_path, "- a\n- b\n"))
    assert "dqn: must be a mapping" in error(write(tmp_path, "dqn: [1]\n"))


def test_eurusd_example_makes_its_folds_on_the_real_bars(shared_data, tmp_path):
    """The real-data example, on the fxcache its header says how to build."""
    from fxray.data import bars, cache
    from fxray.data.folds import make_folds

    src = shared_data / "bars" / "eurusd_m1_2017q1"
    if not src.exists():
        pytest.skip(f"{src} not found")
    out = tmp_path / "eurusd.fxcache"
    bars.build_cache(bars.load_bars(src, "histdata", tz="Etc/GMT+5"), out, instrument="EURUSD", source="histdata")
    ts = cache.open(out).ts
    for profile, n_folds in (("gpu", 6), ("cpu", 6)):  # the CPU profile runs every fold too
        exp = E.load(ROOT / "experiments" / "eurusd_2017q1.yaml", profile)
        assert exp.data_path == "eurusd.fxcache"
        folds = make_folds(ts, exp.folds)
        assert len(folds) == n_folds
        # step = val + test: a test window is neither a later val window nor another test window
        assert all(b.val[0] >= a.test[1] for a, b in zip(folds, folds[1:]))


def test_a_cost_below_a_tenth_of_a_basis_point_is_a_warning_naming_the_key(tmp_path):
    exp = E.load(write(tmp_path, GOOD.replace("dqn: {", "dqn: {cost: 5.0e-6, ")), "gpu")
    (line,) = exp.warnings()
    assert "dqn.cost: 5e-06 is below a tenth of a basis point" in line and str(tmp_path) in line
    assert E.load(write(tmp_path, GOOD.replace("dqn: {", "dqn: {cost: 4.0e-5, ")), "gpu").warnings() == []


@pytest.mark.parametrize("name", ["default", "smoke", "eurusd_2017q1", "session", "shuffled"])
@pytest.mark.parametrize("profile", ["gpu", "cpu"])
def test_shipped_experiments_state_a_realistic_cost(name, profile):
    exp = E.load(ROOT / "experiments" / f"{name}.yaml", profile)
    assert exp.warnings() == [] and exp.config.cost >= E.MIN_REALISTIC_COST


# --- base: a file deep-merged under another --------------------------------------------


def test_base_is_merged_under_the_file_key_by_key(tmp_path):
    write(tmp_path, GOOD, "base.yaml")
    child = write(
        tmp_path,
        "base: base.yaml\ndata: {synth: {seed: 2}}\ndqn: {hidden: 64}\ncpu: {dqn: {epochs: 3}}\n",
        "child.yaml",
    )
    gpu, cpu = E.load(child, "gpu"), E.load(child, "cpu")
    assert gpu.name == "child"  # a file names its own runs: the base's name is not inherited
    assert (gpu.synth.n_bars, gpu.synth.seed) == (20000, 2)  # a mapping merges key by key
    assert gpu.config == DQNConfig().replace(epochs=2, hidden=64)
    assert cpu.config == DQNConfig().replace(epochs=3, hidden=64) and cpu.folds.max_folds == 1  # cpu: merges too
    assert gpu.search == E.load(tmp_path / "base.yaml", "gpu").search
    assert E.read_yaml(child)["sweep"] == {"trials": 3, "grace_folds": 2}


def test_base_chain_is_relative_to_each_file(tmp_path):
    write(tmp_path, GOOD, "root.yaml")
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub", "base: ../root.yaml\nname: mid\nsweep: {trials: 5}\n", "mid.yaml")
    leaf = write(tmp_path, "base: sub/mid.yaml\nfolds: {max_folds: 1}\n", "leaf.yaml")
    exp = E.load(leaf, "gpu")
    assert (exp.name, exp.sweep.trials, exp.sweep.grace_folds, exp.folds.max_folds) == ("leaf", 5, 2, 1)


@pytest.mark.parametrize(
    "text, needle",
    [
        ("base: nowhere.yaml\n", "base: nowhere.yaml: no such experiment file (paths are relative to"),
        ("base: x.yaml\n", "base: x.yaml is a cycle (x.yaml -> x.yaml)"),
        ("base: [a.yaml]\n", "base: ['a.yaml'] must be the path of another experiment file"),
    ],
)
def test_bad_base_is_one_line(tmp_path, text, needle):
    assert needle in error(write(tmp_path, text))


def test_a_cycle_through_two_files_names_them(tmp_path):
    write(tmp_path, "base: b.yaml\n", "a.yaml")
    write(tmp_path, "base: a.yaml\n", "b.yaml")
    with pytest.raises(E.ExperimentError) as info:
        E.load(tmp_path / "a.yaml")
    assert str(info.value) == f"{tmp_path / 'b.yaml'}: base: a.yaml is a cycle (a.yaml -> b.yaml -> a.yaml)"


@pytest.mark.parametrize("profile", ["gpu", "cpu"])
def test_the_planted_markets_and_their_control_train_one_learner(profile):
    """default, session and the shuffled twin differ in their market only: a control that
    trained another learner (seeds, epochs, inputs, search) would control nothing."""
    exps = [E.load(ROOT / "experiments" / f"{n}.yaml", profile) for n in ("default", "session", "shuffled")]
    assert exps[0].config == exps[1].config == exps[2].config
    assert exps[0].space() == exps[1].space() == exps[2].space()
    assert exps[0].sweep == exps[1].sweep == exps[2].sweep and exps[0].folds == exps[1].folds == exps[2].folds
    assert {e.synth.n_bars for e in exps} == {exps[0].synth.n_bars}
