"""Experiment files: YAML -> validated dataclasses, with one-line errors naming file and key.

    name: default                      # MLflow experiment name and the run directory name
    data: {path: null, synth: {n_bars: 300000, seed: 0}}
    folds: {train: 20d, val: 5d, test: 5d, step: null, anchored: false, embargo: null, max_folds: 4}
    dqn: {epochs: 8}                   # the config's overrides (DQNConfig): the base config of every trial
    search: {lr: {type: loguniform, low: 1.0e-4, high: 3.0e-3}, ...}
    sweep: {trials: 64, seed: 0, grace_folds: 1, reduction_factor: 2, workers_per_gpu: 1, cpu_per_trial: 0.25}
    cpu: {...}                         # deep-merged over the rest when the cluster has no GPU
    base: default.yaml                 # optional: a file deep-merged under this one (path relative to it)

A file with `base:` holds only what differs from its base: the base's sections (its `cpu:`
too) are deep-merged under the file's, which wins key by key; a mapping merges, anything else
(a list, a value) replaces. The base's `name` is not inherited: a file names its own runs.

Every problem is an `ExperimentError` whose message is one line:
`experiments/x.yaml: search.lr.low: 0 must be > 0 for loguniform`. Values coming
from the `cpu:` section are named `cpu.<key>` so the user knows which line to fix.
This module imports neither Ray nor MLflow (the trials import it too).
"""

from __future__ import annotations

import copy
import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from fxray.data.folds import FoldError, FoldSpec, default_embargo
from fxray.data.synth import SynthSpec
from fxray.rl.config import ConfigError, DQNConfig

# a file's sections; `algo:` (older files name the one algorithm there, dqn) is read past
SECTIONS = ("name", "algo", "data", "folds", DQNConfig.SECTION, "search", "sweep", "cpu")
SEARCH_TYPES = {
    "uniform": ("low", "high"),
    "loguniform": ("low", "high"),
    "int": ("low", "high", "log"),
    "randint": ("low", "high", "log"),
    "choice": ("values",),
}


MIN_REALISTIC_COST = 1e-5  # return units per unit traded: 0.1 bp, below any real market's one-way cost


class ExperimentError(ValueError):
    """A bad experiment file; the message is one line naming the file and the key."""


@dataclass(frozen=True)
class SweepSpec:
    trials: int = 64  # Tune samples (Optuna trials) per run of the CLI
    seed: int = 0  # TPE sampler seed, and the training seed of every fold
    grace_folds: int = 1  # ASHA: folds every trial runs before it can be stopped
    reduction_factor: float = 2.0  # ASHA: keep ~1/rf of the trials at each rung
    workers_per_gpu: int = 1  # FoldWorker actors per GPU (each gets num_gpus = 1/K)
    cpu_per_trial: float = 0.25  # logical CPUs reserved by a trial process (it only waits)
    trials_per_worker: int = 2  # trials in flight per worker: one trains, the rest wait for its lease
    population: int = 1  # trials whose folds a worker trains together as one population (issue 19)


@dataclass(frozen=True)
class Param:
    """One search dimension over a config field; bounds are inclusive."""

    name: str
    type: str  # uniform | loguniform | int | randint | choice
    low: float | int | None = None
    high: float | int | None = None
    values: tuple = ()
    log: bool = False

    def distribution(self):
        """The Optuna distribution (imported lazily: only the driver needs Optuna)."""
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.type == "choice":
            return CategoricalDistribution(list(self.values))
        if self.type in ("int", "randint"):
            return IntDistribution(int(self.low), int(self.high), log=self.log)
        return FloatDistribution(float(self.low), float(self.high), log=self.type == "loguniform")


@dataclass(frozen=True)
class Experiment:
    name: str
    file: str  # the YAML it came from
    profile: str  # "gpu" or "cpu" (the cpu: overrides applied)
    data_path: str | None  # an fxcache; None = the embedded synthetic market
    synth: SynthSpec
    folds: FoldSpec
    config: DQNConfig  # base config of every trial
    search: tuple[Param, ...]
    sweep: SweepSpec

    def space(self) -> dict:
        """{field: optuna distribution} for OptunaSearch."""
        return {p.name: p.distribution() for p in self.search}

    def warnings(self) -> list[str]:
        """Settings that are valid but unrealistic, one line each, naming the key."""
        cost = self.config.cost
        if cost >= MIN_REALISTIC_COST:
            return []
        return [
            f"{self.file}: {self.config.SECTION}.cost: {cost:g} is below a tenth of a basis point "
            f"({MIN_REALISTIC_COST:g}); FX on an ECN costs ~0.35-0.45 bp one way, ES futures ~0.3 bp, "
            "a crypto perpetual ~5 bp (docs/metrics.md): an edge that exists only below that is none"
        ]


def load(path, profile: str = "gpu", overrides: dict | None = None) -> Experiment:
    """Read and validate an experiment file. `overrides` (dotted keys -> values) come
    from the command line and are applied last, e.g. {"sweep.trials": 4}."""
    raw = read_yaml(path)
    file = str(path)
    _check_keys(file, raw, (*SECTIONS, "base"), "")  # base: is resolved by read_yaml
    cpu = raw.get("cpu") or {}
    if not isinstance(cpu, dict):
        raise ExperimentError(f"{file}: cpu: must be a mapping of overrides, got {cpu!r}")
    _check_keys(file, cpu, [s for s in SECTIONS if s not in ("cpu", "name")], "cpu.")
    if profile == "gpu" and cpu:  # a bad cpu: section fails on every machine, not only on laptops
        _load_merged(file, "cpu", raw, cpu, overrides)
    return _load_merged(file, profile, raw, cpu, overrides)


def _load_merged(file, profile, raw, cpu, overrides) -> Experiment:
    merged = {k: copy.deepcopy(v) for k, v in raw.items() if k != "cpu"}
    if profile == "cpu":
        merged = _deep_merge(merged, cpu)
    for dotted, value in (overrides or {}).items():
        node = merged
        *parents, last = dotted.split(".")
        for key in parents:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        node[last] = value

    def where(key: str) -> str:  # name a value by the section the user must edit
        node = cpu
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return key
            node = node[part]
        return f"cpu.{key}" if profile == "cpu" else key

    try:
        return _build(file, profile, merged, where)
    except (ConfigError, FoldError) as e:  # core validators name the key: add the file
        key, _, rest = str(e).partition(": ")
        raise ExperimentError(f"{file}: {where(key)}: {rest}") from None


class Loader(yaml.SafeLoader):
    """yaml.SafeLoader that reads numbers as YAML 1.2 does (`1e-3`, `1.0e15`, `.5E3` are
    floats, not the strings YAML 1.1 makes of them) and refuses a key given twice."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice (the second would silently win)", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


Loader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def yaml_value(text: str):
    """One YAML value (a `--set KEY=VALUE`'s VALUE) read like an experiment file's; yaml.YAMLError."""
    return yaml.load(text, Loader=Loader)  # noqa: S506 (a SafeLoader subclass)


def read_yaml(path) -> dict:
    """The experiment file `path` as a mapping, its `base:` chain deep-merged under it."""
    return _resolve(Path(path), str(path), ())


def _resolve(p: Path, shown: str, chain: tuple) -> dict:
    raw = _read_one(p, shown)
    if "base" not in raw:
        return raw
    base = raw.pop("base")
    if not isinstance(base, str) or not base.strip():
        raise ExperimentError(f"{shown}: base: {base!r} must be the path of another experiment file")
    chain = (*chain, p.resolve())
    base_path = p.parent / base
    if base_path.resolve() in chain:
        names = " -> ".join(c.name for c in chain[chain.index(base_path.resolve()) :])
        raise ExperimentError(f"{shown}: base: {base} is a cycle ({names} -> {base_path.name})")
    if not base_path.is_file():
        raise ExperimentError(f"{shown}: base: {base}: no such experiment file (paths are relative to {p.parent})")
    under = _resolve(base_path, str(base_path), chain)
    under.pop("name", None)  # a file names its own runs
    return _deep_merge(under, raw)


def _read_one(p: Path, path: str) -> dict:
    if not p.is_file():
        raise ExperimentError(f"{path}: no such experiment file (see experiments/*.yaml)")
    try:
        raw = yaml.load(p.read_text(encoding="utf-8"), Loader=Loader)  # noqa: S506 (a SafeLoader subclass)
    except UnicodeDecodeError as e:
        raise ExperimentError(f"{path}: not UTF-8 text (byte {e.start}); save the experiment file as UTF-8") from None
    except OSError as e:
        raise ExperimentError(f"{path}: cannot be read ({e.strerror or e})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ExperimentError(f"{path}: not valid YAML: {at}{problem}") from None
    if raw is None:
        raise ExperimentError(
            f"{path}: is empty; an experiment file needs at least a name (copy experiments/smoke.yaml)"
        )
    if not isinstance(raw, dict):
        raise ExperimentError(f"{path}: must be a mapping of sections ({', '.join(SECTIONS)})")
    return raw


# --- validation ---------------------------------------------------------------------


def _build(file, profile, d, where) -> Experiment:
    def fail(key, msg):
        raise ExperimentError(f"{file}: {where(key)}: {msg}")

    name = d.get("name", Path(file).stem)
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        fail("name", f"{name!r} must be a name of letters, digits, '_', '.', '-'")

    data = _section(file, d, "data", ("path", "synth"), where)
    data_path = data.get("path")
    if data_path is not None and not isinstance(data_path, str):
        fail("data.path", f"{data_path!r} must be a file path or null")
    synth_raw = data.get("synth") or {}
    if not isinstance(synth_raw, dict):
        fail("data.synth", f"{synth_raw!r} must be a mapping")
    synth_fields = {f.name: f for f in dataclasses.fields(SynthSpec)}
    _check_keys(file, synth_raw, synth_fields, "data.synth.", where)
    for k, v in synth_raw.items():
        _check_type(fail, f"data.synth.{k}", v, synth_fields[k].default)
    synth = SynthSpec(**synth_raw)
    if synth.n_bars < 1000:
        fail("data.synth.n_bars", f"{synth.n_bars} must be >= 1000 bars")

    fold_raw = _section(file, d, "folds", [f.name for f in dataclasses.fields(FoldSpec)], where)
    for k, v in fold_raw.items():
        if k in ("train", "val", "test", "step", "holdout") and not (v is None and k in ("step", "holdout")):
            if not isinstance(v, (str, int, float)) or isinstance(v, bool):
                fail(f"folds.{k}", f"{v!r} must be a duration like '20d', '12h', '90min'")
        elif k == "anchored" and not isinstance(v, bool):
            fail("folds.anchored", f"{v!r} must be true or false")
    folds = FoldSpec(**fold_raw)  # durations stay as written: '20d', or a number of days
    folds.validate()
    least = default_embargo()
    if folds.embargo is not None and folds.embargo < least:
        fail(
            "folds.embargo",
            f"{folds.embargo} bars is below the longest feature lookback + 1 ({least}): a feature window "
            f"would straddle the train|val and val|test boundaries; leave it out (default {least}) or raise it",
        )

    if d.get("algo", "dqn") != "dqn":
        fail("algo", f"{d['algo']!r} is not an algorithm fxray trains (dqn only)")
    fields = {f.name for f in dataclasses.fields(DQNConfig)}
    config = DQNConfig(**_typed_section(file, d, DQNConfig.SECTION, DQNConfig, where, fail))

    search_raw = d.get("search") or {}
    if not isinstance(search_raw, dict):
        fail("search", f"{search_raw!r} must map DQNConfig fields to distributions")
    search = tuple(_param(file, fail, config, fields, k, v, where) for k, v in search_raw.items())

    sweep = SweepSpec(**_typed_section(file, d, "sweep", SweepSpec, where, fail))
    for key, ok, rule in (
        ("trials", sweep.trials >= 1, ">= 1"),
        ("grace_folds", sweep.grace_folds >= 1, ">= 1"),
        ("reduction_factor", sweep.reduction_factor > 1, "> 1"),
        ("workers_per_gpu", sweep.workers_per_gpu >= 1, ">= 1"),
        ("trials_per_worker", sweep.trials_per_worker >= 1, ">= 1"),
        ("population", sweep.population >= 1, ">= 1"),
        ("cpu_per_trial", 0 < sweep.cpu_per_trial <= 64, "in (0, 64] (Ray refuses 0)"),
    ):
        if not ok:
            fail(f"sweep.{key}", f"{getattr(sweep, key)!r} must be {rule}")
    return Experiment(name, file, profile, data_path, synth, folds, config, search, sweep)


def _param(file, fail, base: DQNConfig, fields, name, spec, where) -> Param:
    key = f"search.{name}"
    if name not in fields:
        fail(key, f"not a {type(base).__name__} field; known: {', '.join(sorted(fields))}")
    if name == "dtype":  # every worker holds the dataset once, in one storage precision
        fail(key, f"the storage precision is fixed per sweep: set {base.SECTION}.dtype instead")
    if not isinstance(spec, dict) or "type" not in spec:
        fail(key, "must be a mapping with a type: " + " | ".join(SEARCH_TYPES))
    kind = spec["type"]
    if kind not in SEARCH_TYPES:
        fail(f"{key}.type", f"{kind!r} must be one of {', '.join(SEARCH_TYPES)}")
    _check_keys(file, spec, ("type",) + SEARCH_TYPES[kind], f"{key}.", where)
    for bound in SEARCH_TYPES[kind][:2] if kind != "choice" else ():
        v = spec.get(bound)
        integral = kind in ("int", "randint")
        if v is None or isinstance(v, bool) or not isinstance(v, int if integral else (int, float)):
            fail(f"{key}.{bound}", f"{v!r} must be {'an integer' if integral else 'a number'}")
    if kind == "choice":
        values = spec.get("values")
        if not isinstance(values, list) or not values:
            fail(f"{key}.values", f"{values!r} must be a non-empty list")
        if any(not isinstance(v, (bool, int, float, str)) for v in values):
            fail(f"{key}.values", "must hold scalars (numbers, strings, booleans)")
        param = Param(name, kind, values=tuple(values))
        corners = [("values", v) for v in values]
    else:
        low, high = spec["low"], spec["high"]
        if kind == "loguniform" and low <= 0:
            fail(f"{key}.low", f"{low!r} must be > 0 for loguniform")
        if not low < high:
            fail(f"{key}.high", f"{high!r} must be > low ({low!r})")
        log = spec.get("log", False)
        if not isinstance(log, bool):
            fail(f"{key}.log", f"{log!r} must be true or false")
        param = Param(name, kind, low=low, high=high, log=log)
        corners = [("low", low), ("high", high)]
    for bound, value in corners:  # every edge of the range must be a valid config
        try:
            base.replace(**{name: value})
        except (ConfigError, TypeError) as e:
            fail(f"{key}.{bound}", str(e).partition(": ")[2] or str(e))
    return param


def _section(file, d, name, allowed, where) -> dict:
    sec = d.get(name) or {}
    if not isinstance(sec, dict):
        raise ExperimentError(f"{file}: {where(name)}: must be a mapping, got {sec!r}")
    _check_keys(file, sec, allowed, f"{name}.", where)
    return sec


def _typed_section(file, d, name, cls, where, fail) -> dict:
    """Section `name` of `d`: the fields of dataclass `cls`, each of its field's type."""
    fields = {f.name: f.default for f in dataclasses.fields(cls)}
    sec = _section(file, d, name, fields, where)
    for k, v in sec.items():
        _check_type(fail, f"{name}.{k}", v, fields[k])
    return sec


def _check_keys(file, d: dict, allowed, prefix: str, where=lambda k: k) -> None:
    for k in d:
        if k not in allowed:
            raise ExperimentError(f"{file}: {where(prefix + str(k))}: unknown key; known: {', '.join(sorted(allowed))}")


def _check_type(fail, key, value, default) -> None:
    """A value must have its field's type (judged from the default; None allows anything)."""
    if default is None or default is dataclasses.MISSING:
        return
    if isinstance(default, tuple):
        want = f"a list of {len(default)} {type(default[0]).__name__}s"
        ok = isinstance(value, (list, tuple)) and len(value) == len(default)
        ok = ok and all(isinstance(v, type(d)) and not isinstance(v, bool) for v, d in zip(value, default))
    elif isinstance(default, bool):
        ok, want = isinstance(value, bool), "true or false"
    elif isinstance(default, int):
        ok, want = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif isinstance(default, float):
        ok, want = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
    else:
        ok, want = isinstance(value, str), "a string"
    if not ok:
        fail(key, f"{value!r} must be {want}")


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        nested = isinstance(v, dict) and isinstance(out.get(k), (dict, type(None)))
        out[k] = _deep_merge(out.get(k) or {}, v) if nested else v
    return out


DEFAULT_EXPERIMENT = "experiments/default.yaml"


def default_experiment() -> str:
    """experiments/default.yaml of the cwd, else the one beside this package's checkout."""
    if Path(DEFAULT_EXPERIMENT).exists():
        return DEFAULT_EXPERIMENT
    beside = Path(__file__).resolve().parents[2] / DEFAULT_EXPERIMENT  # fxray/rl/ -> the checkout
    return str(beside) if beside.exists() else DEFAULT_EXPERIMENT
