"""The typed config of one fold's training: Double DQN with n-step returns and a dueling MLP
(fxray.rl.dqn, fxray.rl.network), its collection, trading, schedule and execution.

A config is flat (one namespace of fields, as MLflow params and search spaces want
it), frozen, documented field by field (the attribute docstrings are `--help` and
docs/), and validated once, when it is built: a bad value is a `ConfigError` whose
message is one line naming the section and key (`dqn.lr: ...`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass


class ConfigError(ValueError):
    """A bad configuration value; the message is one line naming the key."""


@dataclass(frozen=True)
class DQNConfig:
    """Every setting of a fold's training; the experiment file's `dqn:` section."""

    # --- collection ----------------------------------------------------------------
    num_envs: int = 256
    """parallel agents collecting in the train range"""
    episode_len: int = 256
    """bars per episode before an agent restarts at a random bar"""
    buffer_steps: int = 256
    """replay capacity in collect steps (transitions = buffer_steps x num_envs)"""
    updates_per_step: int = 1
    """learner steps per collect step"""
    eps_start: float = 1.0
    """initial exploration rate"""
    eps_end: float = 0.05
    """final exploration rate"""
    eps_decay: float = 0.3
    """share of all training steps over which epsilon decays linearly"""
    # --- trading -------------------------------------------------------------------
    cost: float = 4e-5
    """cost per unit of position change, one way, in return units (4e-5 = 0.4 bp; docs/metrics.md)"""
    fill: str = "next_open"
    """where a position decided at bar t's close fills: next_open (bar t+1's open) or close"""
    # --- schedule ------------------------------------------------------------------
    epochs: int = 6
    """max epochs per fold"""
    steps_per_epoch: int = 200
    """collect steps per epoch (each followed by updates_per_step learner steps)"""
    patience: int = 4
    """stop a fold after this many epochs without a better val score (the best one's weights are kept)"""
    select_from: int = 0
    """the first epoch (0-based) whose weights a fold may keep; patience counts from it"""
    keep: str = "best"
    """which epoch a fold keeps: best (the best-scoring one) or won (the best of those that beat
    flat on the chooser window behind enough trades and days, fxray.eval.selection.keeps; none:
    the fold is flat)"""
    seeds: int = 1
    """seeds trained per fold; > 1: the fold's policy is their mean Q, each seed's Sharpe beside it"""
    # --- execution -----------------------------------------------------------------
    dtype: str = "float32"
    """storage precision of features on device: float32 or bfloat16"""
    graphs: bool = True
    """capture collect+learn in a CUDA graph (CUDA only; same maths as eager)"""
    matmul: str = "tf32"
    """float32 matmuls on CUDA: tf32 (tensor cores, ~1e-3 relative error) or fp32 (exact)"""
    # --- network -------------------------------------------------------------------
    hidden: int = 256
    """width of each hidden layer of the Q-network"""
    depth: int = 2
    """number of hidden layers"""
    # --- learning ------------------------------------------------------------------
    lr: float = 5e-4
    """Adam learning rate"""
    weight_decay: float = 0.0
    """decoupled weight decay per step (AdamW)"""
    input_noise: float = 1.0
    """std of Gaussian noise on the normalised inputs of each update (a bar cannot be memorised)"""
    gamma: float = 0.97
    """discount per bar (0.97: a horizon of ~33 bars)"""
    n_step: int = 5
    """n-step return horizon (bars)"""
    batch_size: int = 1024
    """transitions per learner step"""
    grad_clip: float = 10.0
    """max global gradient norm"""
    huber_delta: float = 1.0
    """Huber loss threshold, in scaled reward units"""
    tau: float = 0.01
    """soft target update weight per learner step"""
    reward_scale: float = 1e4
    """rewards are multiplied by this (1e4: basis points) so Q-values are O(1)"""
    inputs: str = "raw"
    """raw: the 50 normalised inputs; ridge: the train slice's ridge forecasts and the clock (rl.frontend)"""
    demo: float = 0.0
    """weight of DQfD's margin loss toward the ridge rule's moves (rl.demo); 0 = off"""
    screen_t: float = 0.0
    """fit the ridge front end and demonstrator only on inputs whose robust t passes this; 0 = all"""
    abstain: bool = False
    """with screen_t > 0: a fold whose checked screen keeps no input is not trained, its policy flat"""
    demo_margin: float = 0.8
    """how much more the rule's action must be worth than the others before the margin loss lets go"""

    SECTION = "dqn"  # the experiment-file section (and error prefix) of these fields
    CHOICES = {
        "fill": ("next_open", "close"),
        "keep": ("best", "won"),
        "dtype": ("float32", "bfloat16"),
        "matmul": ("tf32", "fp32"),
        "inputs": ("raw", "ridge"),
    }

    def __post_init__(self):
        self.validate()

    def _fail(self, key: str, rule: str):
        raise ConfigError(f"{self.SECTION}.{key}: {getattr(self, key)!r} {rule}")

    def _positive_ints(self, *keys: str) -> None:
        for key in keys:
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                self._fail(key, "must be an integer >= 1")

    def _in_range(self, keys, high: float = 1, note: str = "") -> None:
        for key in keys:
            v = getattr(self, key)
            if not _is_number(v) or not 0 <= v <= high:
                self._fail(key, f"must be a number in [0, {high}]{note}")

    def validate(self) -> None:
        ints = "num_envs episode_len buffer_steps updates_per_step epochs steps_per_epoch patience seeds"
        ints += " hidden depth n_step batch_size"
        self._positive_ints(*ints.split())
        self._in_range(("eps_start", "eps_end", "eps_decay"))
        if not _is_number(self.cost) or not 0 <= self.cost < 0.1:
            self._fail("cost", "must be in [0, 0.1) (return units)")
        sf, rule = self.select_from, f"must be an integer in [0, epochs) = [0, {self.epochs})"
        if not isinstance(sf, int) or isinstance(sf, bool) or sf < 0:
            self._fail("select_from", rule)
        if sf >= self.epochs:
            self._fail("select_from", f"{rule}: lower it (--set select_from=0) or train more epochs")
        for key, allowed in self.CHOICES.items():
            if getattr(self, key) not in allowed:
                self._fail(key, "must be " + " or ".join(map(repr, allowed)))
        if self.eps_end > self.eps_start:
            raise ConfigError(f"{self.SECTION}.eps_end: {self.eps_end} must be <= eps_start ({self.eps_start})")
        self._in_range(("lr", "gamma", "tau", "weight_decay"))
        self._in_range(("input_noise",), 10)
        self._in_range(("screen_t",), 100, " (0: no screen)")
        if not isinstance(self.abstain, bool):
            self._fail("abstain", "must be true or false")
        if self.abstain and not self.screen_t > 0:
            self._fail("abstain", "needs screen_t > 0 (the screen decides where); with no screen set abstain false")
        self._in_range(("demo",), 100, " (0: no demonstrations)")
        for key in ("grad_clip", "huber_delta", "reward_scale", "demo_margin"):
            v = getattr(self, key)
            if not _is_number(v) or v <= 0:
                self._fail(key, "must be a number > 0")
        if self.buffer_steps <= self.n_step:
            raise ConfigError(f"{self.SECTION}.buffer_steps: {self.buffer_steps} must exceed n_step ({self.n_step})")

    def replace(self, **changes) -> DQNConfig:
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _is_number(v) -> bool:
    """A finite int or float (not a bool): NaN and inf are no setting."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def make_config(values: dict, where: str | None = None) -> DQNConfig:
    """The config of a plain dict (a sidecar's, a run directory's, MLflow params); an unknown key
    is an error naming it and the known ones. An `algo: dqn` of an older record is read past."""
    values = dict(values)
    algo = values.pop("algo", "dqn")
    if algo != "dqn":
        raise ConfigError(f"algo: {algo!r} is not an algorithm fxray trains (dqn only)")
    names = {f.name for f in dataclasses.fields(DQNConfig)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ConfigError(
            f"{where or DQNConfig.SECTION}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}"
        )
    return DQNConfig(**values)
