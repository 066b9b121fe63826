"""DQNConfig: every knob of one fold's training, typed, documented, validated once."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


class ConfigError(ValueError):
    """A bad configuration value; the message is one line naming the key."""


@dataclass(frozen=True)
class DQNConfig:
    # --- network -------------------------------------------------------------------
    hidden: int = 256
    """width of each hidden layer of the Q-network"""
    depth: int = 2
    """number of hidden layers"""
    dueling: bool = True
    """dueling head: Q = V + A - mean(A)"""
    # --- learning ------------------------------------------------------------------
    lr: float = 5e-4
    """Adam learning rate"""
    gamma: float = 0.9
    """discount per bar"""
    n_step: int = 3
    """n-step return horizon (bars)"""
    batch_size: int = 1024
    """transitions per learner step"""
    grad_clip: float = 10.0
    """max global gradient norm"""
    huber_delta: float = 1.0
    """Huber loss threshold, in scaled reward units"""
    tau: float = 0.01
    """soft target update weight per learner step (ignored if target_every > 0)"""
    target_every: int = 0
    """hard target update every N learner steps; 0 = soft updates with tau"""
    reward_scale: float = 1e4
    """rewards are multiplied by this (1e4: basis points) so Q-values are O(1)"""
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
    cost: float = 1e-5
    """cost per unit of position change, in return units (half-spread + fees)"""
    # --- schedule ------------------------------------------------------------------
    epochs: int = 6
    """max epochs per fold"""
    steps_per_epoch: int = 200
    """collect steps per epoch (each followed by updates_per_step learner steps)"""
    patience: int = 2
    """stop after this many epochs without a better val Sharpe"""
    # --- execution -----------------------------------------------------------------
    dtype: str = "float32"
    """storage precision of features on device: float32 or bfloat16"""
    graphs: bool = True
    """capture collect+learn in a CUDA graph (CUDA only; same maths as eager)"""
    compile: bool = False
    """torch.compile the TD loss (forward + backward fused by Inductor; same maths, slower start)"""
    matmul: str = "tf32"
    """float32 matmuls on CUDA: tf32 (tensor cores, ~1e-3 relative error) or fp32 (exact)"""

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        positive_ints = ("hidden", "depth", "n_step", "batch_size", "num_envs", "episode_len",
                         "buffer_steps", "updates_per_step", "epochs", "steps_per_epoch", "patience")
        for key in positive_ints:
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"dqn.{key}: {v!r} must be an integer >= 1")
        ranges = {"lr": (0, 1), "gamma": (0, 1), "tau": (0, 1), "eps_start": (0, 1),
                  "eps_end": (0, 1), "eps_decay": (0, 1)}
        for key, (lo, hi) in ranges.items():
            v = getattr(self, key)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not lo <= v <= hi:
                raise ConfigError(f"dqn.{key}: {v!r} must be a number in [{lo}, {hi}]")
        for key in ("grad_clip", "huber_delta", "reward_scale"):
            v = getattr(self, key)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"dqn.{key}: {v!r} must be a number > 0")
        if not isinstance(self.cost, (int, float)) or not 0 <= self.cost < 0.1:
            raise ConfigError(f"dqn.cost: {self.cost!r} must be in [0, 0.1) (return units)")
        if not isinstance(self.target_every, int) or self.target_every < 0:
            raise ConfigError(f"dqn.target_every: {self.target_every!r} must be an integer >= 0")
        if self.dtype not in ("float32", "bfloat16"):
            raise ConfigError(f"dqn.dtype: {self.dtype!r} must be 'float32' or 'bfloat16'")
        if self.matmul not in ("tf32", "fp32"):
            raise ConfigError(f"dqn.matmul: {self.matmul!r} must be 'tf32' or 'fp32'")
        if self.eps_end > self.eps_start:
            raise ConfigError(f"dqn.eps_end: {self.eps_end} must be <= eps_start ({self.eps_start})")
        if self.buffer_steps <= self.n_step:
            raise ConfigError(f"dqn.buffer_steps: {self.buffer_steps} must exceed n_step ({self.n_step})")

    @classmethod
    def from_dict(cls, values: dict, where: str = "dqn") -> "DQNConfig":
        """Build from a plain dict; an unknown key is an error naming it and the known ones."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; "
                              f"known: {', '.join(sorted(names))}")
        return cls(**values)

    def replace(self, **changes) -> "DQNConfig":
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def field_docs() -> dict[str, str]:
    """Each field's one-line doc (the attribute docstrings above), for --help and docs."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(DQNConfig))
    docs, body = {}, tree.body[0].body
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[node.target.id] = nxt.value.value
    return docs
