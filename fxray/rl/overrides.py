"""Command-line overrides of an experiment file: `--set KEY=VALUE`, each VALUE read as the
file's own YAML values are (fxray.rl.experiment.Loader: `1e-3` is a number), each KEY
checked against the file's sections and the config's fields."""

from __future__ import annotations

import dataclasses

import yaml

from fxray.rl.config import DQNConfig
from fxray.rl.experiment import SECTIONS, ExperimentError, yaml_value


def parse_sets(pairs: list[str], flag: str = "--set") -> dict:
    """['lr=1e-3', 'abstain=false'] -> {'lr': 0.001, 'abstain': False} (values are YAML scalars)."""
    out = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ExperimentError(f"{flag} {pair!r}: write KEY=VALUE, e.g. {flag} lr=1e-3")
        try:
            out[key.strip()] = yaml_value(value)  # read as the experiment file's values are
        except yaml.YAMLError as e:
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise ExperimentError(
                f"{flag} {pair!r}: {value!r} is not a YAML value ({problem}); quote a string"
            ) from None
    return out


def set_overrides(pairs: list[str]) -> dict:
    """--set pairs as load()'s dotted overrides: a bare KEY is a config field (lr -> dqn.lr), a
    dotted one any key of the file (sweep.grace_folds, folds.max_folds). Values are then
    validated by load() like the file's own; unknown names fail here."""
    fields = {f.name for f in dataclasses.fields(DQNConfig)}
    out = {}
    for key, value in parse_sets(pairs).items():
        top = key.split(".")[0]
        if "." not in key and key not in fields:
            raise ExperimentError(f"--set {key}: not a config field; known: {', '.join(sorted(fields))}")
        if "." in key and top not in SECTIONS:
            raise ExperimentError(f"--set {key}: {top} is not a section; known: {', '.join(SECTIONS)}")
        if top in ("name", "cpu"):
            raise ExperimentError(f"--set {key}: use --name / --profile for that")
        out[key if "." in key else f"{DQNConfig.SECTION}.{key}"] = value
    return out
