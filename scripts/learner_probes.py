"""Prototype learners for scripts/learner_grid.py: variants of the Q-network and the loss that
are measured before any of them is built into fxray (docs/benchmarks.md "A gate, LayerNorm,
and every action's target").

    python scripts/learner_probes.py VARIANT GRID.json [learner_grid's options]

    gate         the first layer's market projection times 2 sigmoid(W [tod_sin, tod_cos] + b),
                 per hidden unit (W, b start at 0: the plain network at the first step), so a
                 unit can be switched off by the hour
    layernorm    LayerNorm (with its affine weights) before every hidden ReLU
    both_losses  the sampled n-step loss plus the all-actions 1-step loss of the same batch
    hold_max     as fxray's `update: hold`, with the larger of the 1-step and the hold-n target
                 of each action (both are lower bounds of Q*, holding being one feasible policy:
                 lower-bound Q-learning, Oh et al. 2018, "Self-Imitation Learning")

Each swaps a class attribute of fxray.rl.dqn for the run of this process only; the grid's
jobs run as learner_grid runs them. These are diagnostics, not features: a variant that earns
its place is built into fxray.rl with its export and population paths.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn as nn

import fxray.rl.dqn as dqn
from fxray.data.schema import CALENDAR_INDICES

TOD = slice(CALENDAR_INDICES[0], CALENDAR_INDICES[1] + 1)  # tod_sin, tod_cos


class GatedQNetwork(dqn.QNetwork):
    """QNetwork whose market projection is scaled per hidden unit by a gate of the time of day."""

    def __init__(self, n_inputs: int, hidden: int, depth: int, dueling: bool):
        super().__init__(n_inputs, hidden, depth, dueling)
        self.gate = nn.Linear(2, hidden)
        nn.init.zeros_(self.gate.weight)
        nn.init.zeros_(self.gate.bias)

    def _market(self, market: torch.Tensor) -> torch.Tensor:
        return self.market_in(market) * (2 * torch.sigmoid(self.gate(market[..., TOD])))

    def forward(self, market: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        one_hot = (position.unsqueeze(-1) == self.positions).to(market.dtype)
        return self._q(self._market(market) + one_hot @ self.position_embed)

    def q_all(self, market: torch.Tensor) -> torch.Tensor:
        return self._q(self._market(market).unsqueeze(1) + self.position_embed)


class LayerNormQNetwork(dqn.QNetwork):
    """QNetwork with a LayerNorm before each hidden ReLU."""

    def __init__(self, n_inputs: int, hidden: int, depth: int, dueling: bool):
        super().__init__(n_inputs, hidden, depth, dueling)
        self.norms = nn.ModuleList([nn.LayerNorm(hidden) for _ in range(depth)])

    def _q(self, h: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.norms[0](h))
        linears = [m for m in self.body if isinstance(m, nn.Linear)]
        for linear, norm in zip(linears, self.norms[1:]):
            h = torch.relu(norm(linear(h)))
        out = self.head(h)
        if not self.dueling:
            return out
        value, adv = out[..., :1], out[..., 1:]
        return value + adv - adv.mean(-1, keepdim=True)


def both_losses(self, data, replay, step, env, noise=None):
    """Learner.td_loss of update 'sampled' plus Learner.all_actions_loss, on one batch."""
    sampled, q_sampled = SAMPLED_LOSS(self, data, replay, step, env, noise)
    every, q_every = self.all_actions_loss(data, replay, step, env, noise)
    return sampled + every, torch.maximum(q_sampled, q_every)


def max_targets(self, data, t, position, hold, dtype):
    """Learner.hold_targets, each action's the larger of its 1-step and its hold-n target."""
    one = PLAIN_TARGETS(self, data, t, position, 1, dtype)
    return torch.maximum(one, PLAIN_TARGETS(self, data, t, position, hold, dtype))


SAMPLED_LOSS = dqn.Learner.td_loss
PLAIN_TARGETS = dqn.Learner.hold_targets
VARIANTS = ("gate", "layernorm", "both_losses", "hold_max")


def use(variant: str) -> None:
    """Swap the variant in, for this process."""
    if variant == "gate":
        dqn.QNetwork = GatedQNetwork
    elif variant == "layernorm":
        dqn.QNetwork = LayerNormQNetwork
    elif variant == "both_losses":
        dqn.Learner.td_loss = both_losses
    elif variant == "hold_max":  # update 'hold' whatever the config says, with the larger target
        dqn.Learner.td_loss, dqn.Learner.hold_targets = dqn.Learner.hold_loss, max_targets
    else:
        raise SystemExit(f"learner_probes: {variant!r} is no variant; known: {', '.join(VARIANTS)}")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        raise SystemExit(f"usage: learner_probes.py {{{','.join(VARIANTS)}}} GRID.json [learner_grid options]")
    use(argv[0])
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import learner_grid

    return learner_grid.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
