"""Demonstrations (`dqn.demo` > 0): the supervised baseline's moves as a large-margin loss.

Deep Q-learning from Demonstrations (Hester et al. 2018, AAAI, eq. 2) adds to the TD loss

    J_E(Q) = max_a [Q(s, a) + l(a_E, a)] - Q(s, a_E),    l(a_E, a) = margin if a != a_E, else 0

which is zero once the demonstrator's action a_E is worth `margin` more than every other,
and pulls Q toward it otherwise. Here the demonstrator is the ridge rule, the supervised
baseline beside every result (fxray.eval.baselines.fit_rule: ridge regression of the next
h bars' return on the normalised inputs, hysteresis thresholds tuned for net Sharpe), the
very fit shown beside the policy (fxray.rl.references), on the fold's train slice only. At each train bar and previous
position the rule says where to move; the TD loss keeps working beside it, so the learner
starts from the baseline's policy and leaves it where the returns it samples pay more than
the margin (in Q's units: reward_scale 1e4 makes 1 a basis point). Every state the replay
holds is a train bar, so the table outside the train slice is never read (it holds flat).
"""

from __future__ import annotations

import torch

from fxray.data.folds import Fold
from fxray.rl.references import references


def fit(data, fold: Fold, cost: float, fill: str, screen_t: float = 0.0) -> torch.Tensor:
    """(n_bars, 3) int8 on the data's device: at each train bar (with a next bar) and previous
    position index (0 short, 1 flat, 2 long), the index the ridge rule moves to; 1 elsewhere.
    `data.set_fold(fold)` must have run (the inputs' normalisation is the train slice's). The
    rule is the fold's reference rule (fxray.rl.references, fitted once per fold, cost, fill
    and screen_t): with `screen_t` > 0 the "screened" one, on the market inputs the checked
    screen keeps (fxray.rl.frontend.screened_inputs; none kept: a flat rule), else "ridge"."""
    references(data, fold, cost, fill, screen_t)
    a, b = fold.train[0], fold.train[1] - 1
    table = torch.ones(data.n_bars, 3, dtype=torch.int8, device=data.device)
    table[a:b] = data.references[(repr(fold.as_dict()), cost, fill, screen_t)][2]
    return table


def margin_loss(q: torch.Tensor, expert: torch.Tensor, margin) -> torch.Tensor:
    """J_E averaged over the batch: q (..., B, 3), expert (..., B) action indices, margin a
    number or a tensor broadcasting against q (per member: (K, 1, 1)) -> (...)."""
    e = expert.unsqueeze(-1)
    loss_of_action = (torch.ones_like(q) * margin).scatter(-1, e, 0.0)
    return ((q + loss_of_action).amax(-1) - q.gather(-1, e).squeeze(-1)).mean(-1)
