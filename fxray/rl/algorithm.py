"""The seam between the fold trainer and a learning algorithm.

fxray.rl.trainer.Trainer runs epochs, early stopping, the val/test backtests and the
checkpoints; an `Algorithm` owns everything that learns: its agents, replay,
networks and optimizer. Adding an algorithm: a config class (fxray.rl.config,
subclass of TrainConfig, registered in ALGORITHMS) and a class with these members,
registered in BUILDERS below; nothing else changes.
"""

from __future__ import annotations

from typing import Protocol

import torch

from fxray.rl.config import TrainConfig
from fxray.rl.device import DeviceData


class Algorithm(Protocol):
    """What Trainer needs from a learner. Every method keeps its tensors in place and
    never reads a value back to the host (except `state_dict`), so `step` can be
    captured once in a CUDA graph and replayed across folds."""

    params: list[torch.Tensor]
    """the weights that define the policy: best-epoch copies are taken of them, in place"""

    def begin(self, seed: int) -> None:
        """Fresh weights, optimizer, replay and agents for a fold (the fold is already
        active on the DeviceData), then whatever must happen before the first `step`."""

    def step(self) -> None:
        """One collect + learn step: no host sync, no allocation the graph cannot replay."""

    def q_all(self, market: torch.Tensor) -> torch.Tensor:
        """Q of every (previous position, action): market (T, n_inputs) -> (T, 3, 3)."""

    def epoch_stats(self) -> torch.Tensor:
        """(3,) device tensor: summed loss since `reset_epoch_stats`, max |Q|, exploration rate."""

    def reset_epoch_stats(self) -> None:
        """Zero the epoch accumulators (in place)."""

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The policy's weights by name, for a safetensors checkpoint."""


def build(data: DeviceData, cfg: TrainConfig) -> Algorithm:
    """The Algorithm that `cfg.algo` names, built on `data`'s device."""
    from fxray.rl.dqn import DQN

    builders = {"dqn": DQN}
    return builders[cfg.algo](data, cfg)
