"""Prototype learners for lab/learner_grid.py: variants of the Q-network and the loss that
are measured before any of them is built into fxray (docs/benchmarks.md "A gate, LayerNorm,
and every action's target").

    python lab/learner_probes.py VARIANT GRID.json [learner_grid's options]

    gate         the first layer's market projection times 2 sigmoid(W [tod_sin, tod_cos] + b),
                 per hidden unit (W, b start at 0: the plain network at the first step), so a
                 unit can be switched off by the hour
    layernorm    LayerNorm (with its affine weights) before every hidden ReLU
    both_losses  the sampled n-step loss plus the all-actions 1-step loss of the same batch
    cost_known   Q(x, p, a) = net(x, p)[a] - cost |a - 1 - p| (reward-scaled): the cost of the move,
                 which the reward's definition fixes, is added to the network's output instead
                 of being learned; the network learns the rest
    cost_split   Q(x, p, a) = U(x)[a] + p G(x) - cost |a - 1 - p|: the exact form of Q* when the
                 market does not react to the agent (the old position earns the gap before the
                 fill, whose value G(x) does not depend on the action; the new position's value
                 U(x)[a] does not depend on the old one), so the network sees no position input
    warm         each fold starts from the previous fold's kept weights (the first from fresh ones),
                 as a model retrained on a rolling window would be: causal, since a fold's train,
                 val and test ranges all end before the next fold's val begins. One seed per
                 process (lab/grid_parallel.py runs it so)
    rollout_lagged  as fxray's `update: rollout`, with the branches' greedy moves looked up in a
                 table of the train slice's greedy actions (argmax of q_all for each bar and
                 previous position), rebuilt from the online network every LAG_STEPS learner
                 steps: the rollout of a lagged policy, without its n_step - 1 forwards a step
    hold_max     as fxray's `update: hold`, with the larger of the 1-step and the hold-n target
                 of each action (both are lower bounds of Q*, holding being one feasible policy:
                 lower-bound Q-learning, Oh et al. 2018, "Self-Imitation Learning")

    vol_reward   the sampled n-step update with each transition's return divided by the volatility
                 at its first bar (rv_60, known at that bar's close) over the train slice's median
                 rv_60: targets of one variance in calm and turbulent hours alike (a weighted
                 regression's weights), in the same units on average. Q(s, .) of the plain
                 reward divided by a positive number known at s: the same greedy action, where
                 the volatility holds over the horizon

    avg_weights  the policy (what val scores, the epoch kept, test) is an exponential average of
                 the online weights over ~1/AVG_TAU learner steps, not the online weights of the
                 last step: SGD on targets this noisy leaves noise in the last iterate that an
                 average removes (Polyak & Juditsky 1992); training itself is unchanged

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


class CostKnownQNetwork(dqn.QNetwork):
    """QNetwork plus the known cost of each move; `cost_scaled` = cfg.cost * cfg.reward_scale
    (set by the Learner's wrapped __init__ below)."""

    cost_scaled = 0.0

    def _cost(self, position: torch.Tensor, dtype) -> torch.Tensor:
        """(..., 3): cost_scaled |a - 1 - p| for position (...) -> per action."""
        return self.cost_scaled * (self.positions.to(dtype) - position.to(dtype).unsqueeze(-1)).abs()

    def forward(self, market, position):
        return super().forward(market, position) - self._cost(position, market.dtype)

    def q_all(self, market):
        return super().q_all(market) - self._cost(self.positions, market.dtype)  # (T, 3 p, 3 a)


class CostSplitQNetwork(CostKnownQNetwork):
    """U(x)[a] + p G(x) - cost |a - 1 - p|: no position input (position_embed kept at zero
    weight in the graph so the optimizer's parameter list is the plain network's)."""

    def __init__(self, n_inputs: int, hidden: int, depth: int, dueling: bool):
        super().__init__(n_inputs, hidden, depth, dueling)
        self.carry_head = nn.Linear(hidden, 1)

    def _u_g(self, market):
        h = self.market_in(market) + 0.0 * self.position_embed.sum()
        z = self.body(torch.relu(h))
        out = self.head(z)
        if self.dueling:
            value, adv = out[..., :1], out[..., 1:]
            out = value + adv - adv.mean(-1, keepdim=True)
        return out, self.carry_head(z)  # (..., 3), (..., 1)

    def forward(self, market, position):
        u, g = self._u_g(market)
        return u + position.to(market.dtype).unsqueeze(-1) * g - self._cost(position, market.dtype)

    def q_all(self, market):
        u, g = self._u_g(market)  # (T, 3), (T, 1)
        p = self.positions.to(market.dtype)  # (3,)
        return u.unsqueeze(1) + (g * p).unsqueeze(-1) - self._cost(p, market.dtype)  # (T, 3 p, 3 a)


def with_known_cost(init):
    def __init__(self, cfg, n_inputs, device):
        init(self, cfg, n_inputs, device)
        for net in (self.q_network, self.target_network):
            net.cost_scaled = cfg.cost * cfg.reward_scale

    return __init__


def warm_runs(run_fold):
    def wrapped(self, fold, seed=0, **kw):
        result = run_fold(self, fold, seed, **kw)
        self.warm = [p.detach().clone() for p in self.algo.params]  # the kept weights
        return result

    return wrapped


def warm_begin(begin):
    def wrapped(self, fold, seed):
        begin(self, fold, seed)
        if getattr(self, "warm", None) is not None:
            with torch.no_grad():
                for w, p, tp in zip(self.warm, self.algo.params, self.algo.learner.target_params):
                    p.copy_(w)
                    tp.copy_(w)

    return wrapped


def both_losses(self, data, replay, step, env, noise=None):
    """Learner.td_loss of update 'sampled' plus Learner.all_actions_loss, on one batch."""
    sampled, q_sampled = SAMPLED_LOSS(self, data, replay, step, env, noise)
    every, q_every = self.all_actions_loss(data, replay, step, env, noise)
    return sampled + every, torch.maximum(q_sampled, q_every)


def max_targets(self, data, t, position, hold, dtype):
    """Learner.hold_targets, each action's the larger of its 1-step and its hold-n target."""
    one = PLAIN_TARGETS(self, data, t, position, 1, dtype)
    return torch.maximum(one, PLAIN_TARGETS(self, data, t, position, hold, dtype))


LAG_STEPS = 200  # learner steps between rebuilds of rollout_lagged's table (an epoch of the CPU profile)


@torch.no_grad()
def greedy_table(learner, data) -> torch.Tensor:
    """(train bars, 3 previous positions) int64: the online network's greedy action index at
    each bar of the active fold's train slice, rebuilt every LAG_STEPS learner updates and on a new fold."""
    epoch = int(learner.updates) // LAG_STEPS  # (a host read: this probe is for the CPU)
    stale = getattr(learner, "_lag_fold", None) is not data.fold or getattr(learner, "_lag_epoch", None) != epoch
    if stale or getattr(learner, "_lag_table", None) is None:
        a, b = data.fold.train
        bars = torch.arange(a, b, device=data.device)
        q = torch.cat([learner.q_network.q_all(data.states(c)) for c in bars.split(8192)])
        learner._lag_table, learner._lag_fold, learner._lag_epoch = q.argmax(-1), data.fold, epoch
    return learner._lag_table


def lagged_greedy_moves(self, data, t, held):
    """Learner.greedy_moves looked up in greedy_table instead of a forward of the batch."""
    return greedy_table(self, data)[t - data.fold.train[0]].gather(1, held.long() + 1)


VOL_FLOOR = 0.25  # rv_60 below this share of the train slice's median is taken at it (a quiet bar's weight <= 4)


def vol_weight(data) -> torch.Tensor:
    """(n_bars,) the train slice's median rv_60 / rv_60 at each bar (floored): the active fold's."""
    if getattr(data, "_vol_fold", None) is not data.fold:
        from fxray.data.features import FEATURE_NAMES

        rv = data.x[:, FEATURE_NAMES.index("rv_60")].float()
        a, b = data.fold.train
        med = rv[a:b].median()
        data._vol_weight, data._vol_fold = med / rv.clamp_min(VOL_FLOOR * med), data.fold
    return data._vol_weight


def vol_reward_loss(self, data, replay, step, env, noise=None):
    """Learner.td_loss of update 'sampled', each n-step return times vol_weight at its first bar."""
    cfg = self.cfg
    t, position, action, return_n, next_t, next_position, discount = replay.n_step_batch(step, env)
    B = t.shape[0]
    market = data.states(torch.cat([t, next_t]))
    if noise is not None:
        market = market + noise
    q = self.q_network(market[:B], position)
    with torch.no_grad():
        q_next = self.q_network(market[B:], next_position)
        next_action = q_next.argmax(1, keepdim=True)
        next_q = self.target_network(market[B:], next_position).gather(1, next_action).squeeze(1)
        td_target = return_n * vol_weight(data)[t] * cfg.reward_scale + discount * next_q
    q_sa = q.gather(1, action.unsqueeze(1)).squeeze(1)
    return torch.nn.functional.huber_loss(q_sa, td_target, delta=cfg.huber_delta), q.detach().abs().max()


AVG_TAU = 0.003  # avg_weights: the average's weight on each step's online weights (~330 steps)


def averaged_init(init):
    """DQN.__init__, then an averaged copy of the Q-network that the policy's paths use."""

    def wrapped(self, data, cfg):
        import copy

        init(self, data, cfg)
        self.avg_network = copy.deepcopy(self.learner.q_network).requires_grad_(False)
        self.params = list(self.avg_network.parameters())  # what the trainer keeps and restores
        online, avg = self.learner.params, self.params
        learn = self.learner.learn

        def learn_and_average(*args, **kw):
            learn(*args, **kw)
            with torch.no_grad():
                torch._foreach_lerp_(avg, online, AVG_TAU)

        self.learner.learn = learn_and_average
        self._avg_pairs = (avg, online)

    return wrapped


def averaged_begin(begin):
    def wrapped(self, seed):
        begin(self, seed)  # fresh online weights (and the warm-up collect, which acts on them)
        with torch.no_grad():
            torch._foreach_copy_(*self._avg_pairs)

    return wrapped


def averaged_q_all(self, market):
    return self.avg_network.q_all(market)


SAMPLED_LOSS = dqn.Learner.td_loss
PLAIN_TARGETS = dqn.Learner.hold_targets
VARIANTS = (
    "gate",
    "layernorm",
    "both_losses",
    "hold_max",
    "cost_known",
    "cost_split",
    "rollout_lagged",
    "vol_reward",
    "avg_weights",
    "warm",
)


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
    elif variant == "rollout_lagged":  # update 'rollout' whatever the config says, on the lagged table
        dqn.Learner.td_loss, dqn.Learner.greedy_moves = dqn.Learner.rollout_loss, lagged_greedy_moves
    elif variant == "avg_weights":
        dqn.DQN.__init__, dqn.DQN.begin = averaged_init(dqn.DQN.__init__), averaged_begin(dqn.DQN.begin)
        dqn.DQN.q_all = averaged_q_all
    elif variant == "vol_reward":  # update 'sampled' (what the config says is ignored)
        dqn.Learner.td_loss = vol_reward_loss
    elif variant in ("cost_known", "cost_split"):
        dqn.QNetwork = CostKnownQNetwork if variant == "cost_known" else CostSplitQNetwork
        dqn.Learner.__init__ = with_known_cost(dqn.Learner.__init__)
    elif variant == "warm":
        from fxray.rl.trainer import Trainer

        Trainer.run_fold, Trainer._begin = warm_runs(Trainer.run_fold), warm_begin(Trainer._begin)
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
